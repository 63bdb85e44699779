"""`tune --storage URL`: a study shared by two drivers at once (no Ray
needed): no setting measured twice, BASE measured once, the study holds the
union; on sqlite and on a throwaway PostgreSQL (pg_server.py). The
engine-shaped paced stand-in serves; no timing is asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from paced_presets import ENGINE_SHAPED, paced_preset
from pg_server import throwaway_postgres
from worker_ports import own_port

FAST = ["--slo", "ttft_p90=100ms", "--max-tokens", "8", "--min-tokens", "10", "--max-tokens-in", "40",
        "--start-concurrency", "1", "--max-concurrency", "2", "--min-windows", "2", "--max-requests", "20",
        "--confirm-waves", "0", "--level-time", "5", "--tolerance", "0.5", "--ready-timeout", "60", "--confirm", "0"]


def _presets(tmp_path: Path, model: Path, port: int) -> Path:
    presets = tmp_path / f"presets-{port}.toml"
    presets.write_text(paced_preset("shaped", model, port, ENGINE_SHAPED, max_num_seqs=2, max_num_batched_tokens=1024))
    return presets


@pytest.mark.timeout(600)
def test_two_drivers_sharing_one_study_measure_no_setting_twice(tmp_path, tiny_model):
    # Two tunes of one study, at once, each with its own port (two drivers on
    # one machine), keeping the study in one sqlite file.
    _two_drivers_share_one_study(tmp_path, tiny_model, f"sqlite:///{tmp_path / 'study.db'}", (18621, 18631))


@pytest.mark.timeout(600)
def test_two_drivers_sharing_one_postgres_study_measure_no_setting_twice(tmp_path, tiny_model):
    # The same on PostgreSQL, what drivers on several machines share: a
    # server of its own for the test, on loopback.
    with throwaway_postgres(own_port(18681)) as url:
        _two_drivers_share_one_study(tmp_path, tiny_model, url, (18661, 18671))


def _two_drivers_share_one_study(tmp_path: Path, tiny_model: Path, db: str, ports: tuple[int, int]) -> None:
    import subprocess

    import optuna

    space = tmp_path / "space.toml"
    space.write_text("max_num_seqs = [1, 2, 3]\nmax_num_batched_tokens = [1024, 2048]\n")
    procs = []
    for i, port in enumerate(own_port(p) for p in ports):
        presets = _presets(tmp_path, tiny_model, port)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ernie_tui", "tune", "shaped", "--presets", str(presets), "--space", str(space),
             "--trials", "3", "--storage", db, "--study", "shared", "--no-preset", "--seed", str(i), *FAST],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    said = []
    for p in procs:
        out, err = p.communicate(timeout=500)
        assert p.returncode == 0, err
        said.append(out + err)
    study = optuna.load_study(study_name="shared", storage=db)
    trials = study.get_trials(deepcopy=False)
    # Measured to the end, or failed to serve (both count to --trials).
    measured = [t for t in trials if t.user_attrs.get("outcome") in ("measured", "failed")]
    settings = [json.dumps(t.params, sort_keys=True) for t in measured]
    assert len(settings) == len(set(settings)), settings  # no setting measured twice
    outcomes = [(t.number, t.user_attrs.get("outcome"), t.user_attrs.get("reason")) for t in trials]
    # Each driver's answer lists the study's trials as it found them at its
    # end: the one that ended last lists every trial the two told (the union).
    from ernie_tui.engine_ctl.load import runstore

    records = [r.results for r in runstore.list_runs(kind="tune")]
    assert len(records) == 2, said
    told = {t.number for t in trials if "outcome" in t.user_attrs}
    assert max(({r["number"] for r in rec["trials"]} for rec in records), key=len) == told, (outcomes, said)
    for rec in records:
        # --trials 3 is the study's budget, both drivers' (or the search ran out of new settings to propose).
        assert rec["stopped"] in ("budget: 3 trials measured", "every setting of the space tried") or \
            "proposals in a row" in rec["stopped"], rec["stopped"]
        if rec["stopped"] == "budget: 3 trials measured":
            assert len(measured) == 3, (outcomes, said)
    # BASE measured once: one driver claimed it, the other took its value.
    assert len(study.user_attrs["base"]["goodputs"]) == 1
    repeats = [t for t in trials if t.user_attrs.get("outcome") == "repeat"]
    assert all("same setting as trial" in t.user_attrs["reason"] or "BASE" in t.user_attrs["reason"]
               for t in repeats)


def test_a_storage_that_cannot_be_used_is_one_line_before_anything_starts(tmp_path):
    # Nothing listens on the port; a driver that is not installed; a URL
    # that is not one: each a one-line error naming the fix, no traceback,
    # no server started (the model path does not even exist).
    import subprocess

    space = tmp_path / "space.toml"
    space.write_text("max_num_seqs = [1, 2]\n")
    nobody = own_port(18691)
    cases = {
        f"postgresql://tuner:s3cret@127.0.0.1:{nobody}/optuna": ["cannot connect", f"port {nobody} failed",
                                                                  "tuner:***@"],
        "postgresql+nosuchdriver://u@127.0.0.1/db": ["Can't load plugin"],
        "not a url": ["--storage takes an SQLAlchemy URL"],
    }
    for url, expected in cases.items():
        out = subprocess.run([sys.executable, "-m", "ernie_tui", "tune", "cpu-demo", "--space", str(space),
                              "--storage", url, "--model", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode != 0
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ernie-tui: error: --storage"), out.stderr
        assert all(e in lines[0] for e in expected), lines[0]
        assert "s3cret" not in out.stderr
    # The driver missing, as where the postgres extra is not installed.
    code = (f"import sys; sys.modules['psycopg'] = None\nfrom ernie_tui.cli import main\n"
            f"sys.exit(main(['tune', 'cpu-demo', '--space', {str(space)!r}, '--storage', "
            f"'postgresql://u@127.0.0.1:{nobody}/db', '--model', {str(tmp_path / 'none')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'ernie-tui[postgres]'" in lines[0], out.stderr


def test_a_setting_asked_while_another_driver_still_writes_the_same_one_is_a_repeat(tmp_path):
    # Optuna writes an asked trial's values one by one. Driver A's trial has
    # its first value written, not yet its second, when driver B's trial
    # (asked after it) with the same two values checks for an earlier one:
    # B waits for A's values, finds them the same, and is a repeat (the
    # lower trial id measures). Without the wait, both would measure.
    import threading

    import optuna

    from ernie_tui.engine_ctl.control.tune import _same_setting

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", direction="maximize")
    setting = {"max_num_seqs": 2, "max_num_batched_tokens": 1024}
    dists = {"max_num_seqs": optuna.distributions.IntDistribution(1, 3),
             "max_num_batched_tokens": optuna.distributions.CategoricalDistribution([1024, 2048])}
    study.enqueue_trial(setting)
    study.enqueue_trial(setting)
    a = study.ask()  # A: asked, its values not written yet
    a.suggest_int("max_num_seqs", 1, 3)  # A's first value written (the queued 2)
    b = study.ask(dists)  # B: asked after A, both values written
    assert b.params == setting and b._trial_id > a._trial_id
    found: list = []
    finder = threading.Thread(target=lambda: found.append(_same_setting(study, dict(b.params), b)))
    finder.start()
    threading.Event().wait(0.5)
    a.suggest_categorical("max_num_batched_tokens", [1024, 2048])  # A's second value, while B waits
    finder.join(10)
    assert found and found[0] is not None and found[0]._trial_id == a._trial_id
    # And A, asking about the same setting, does not defer to B (asked after it).
    assert _same_setting(study, dict(a.params), a) is None
