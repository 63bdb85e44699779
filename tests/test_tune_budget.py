"""`tune --trials T --storage URL`: T is the study's budget, over every
driver (tune_budget.py). On a throwaway PostgreSQL (pg_server.py), with
engine-shaped paced stand-ins serving; no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from paced_presets import ENGINE_SHAPED, paced_preset
from pg_server import throwaway_postgres
from worker_ports import own_port

FAST = ["--slo", "ttft_p90=100ms", "--max-tokens", "8", "--min-tokens", "10", "--max-tokens-in", "40",
        "--start-concurrency", "1", "--max-concurrency", "2", "--min-windows", "2", "--max-requests", "20",
        "--confirm-waves", "0", "--level-time", "5", "--tolerance", "0.5", "--ready-timeout", "60", "--confirm", "0"]
SPACE = "max_num_seqs = [1, 2, 3]\nmax_num_batched_tokens = [1024, 2048, 4096]\n"  # 9 settings, BASE one of them


def _driver(tmp_path: Path, model: Path, port: int, db: str, trials: int, seed: int) -> subprocess.Popen:
    presets = tmp_path / f"presets-{port}.toml"
    presets.write_text(paced_preset("shaped", model, port, ENGINE_SHAPED, max_num_seqs=2, max_num_batched_tokens=1024))
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    return subprocess.Popen(
        [sys.executable, "-m", "ernie_tui", "tune", "shaped", "--presets", str(presets), "--space", str(space),
         "--trials", str(trials), "--storage", db, "--study", "shared", "--no-preset", "--seed", str(seed), *FAST],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _load(db: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="shared", storage=db)


def _measured(study) -> list[str]:
    return [json.dumps(t.params, sort_keys=True) for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("outcome") in ("measured", "failed")]


@pytest.mark.timeout(900)
def test_three_drivers_measure_the_study_s_trials_budget_and_no_more(tmp_path, tiny_model):
    # Three tunes of one study at once, --trials 4 each: the study measures
    # 4 settings in all. (Each counting only its own trials in flight, three
    # drivers with --trials 6 measured 8: docs/lab/benchmarks/shared-study.md.)
    with throwaway_postgres(own_port(18741)) as db:
        procs = [_driver(tmp_path, tiny_model, own_port(port), db, 4, seed)
                 for seed, port in enumerate((18711, 18721, 18731))]
        said = []
        for p in procs:
            out, err = p.communicate(timeout=800)
            said.append(out + err)
            assert p.returncode == 0, err
        study = _load(db)
        measured = _measured(study)
        outcomes = [(t.number, t.state.name, t.user_attrs.get("outcome"), t.user_attrs.get("reason"))
                    for t in study.get_trials(deepcopy=False)]
        assert len(measured) == 4, (outcomes, said)
        assert len(set(measured)) == 4, measured  # and none of them twice
        assert not [o for o in outcomes if o[1] == "RUNNING"], outcomes
        from ernie_tui.engine_ctl.load import runstore

        records = [r.results for r in runstore.list_runs(kind="tune")]
        assert len(records) == 3, said
        for rec in records:
            # Each driver went on (or waited) until the study had its 4: each ends on the budget, its answer
            # listing the 4 (a driver that ended early would list fewer).
            assert rec["stopped"] == "budget: 4 trials measured", (rec["stopped"], said)
            assert rec["measured_trials"] == 4, said
            assert all(r["outcome"] != "given back" for r in rec["trials"])


@pytest.mark.timeout(600)
def test_a_dead_driver_s_trial_in_flight_holds_the_budget_only_until_its_heartbeat_is_stale(tmp_path, tiny_model):
    # Driver A asks a trial and beats for it, then dies (its beats stop).
    # Driver B, --trials 1, finds the study's one trial taken by A's trial in
    # flight: it waits (A's trial might still be measured). Once A's
    # heartbeat is older than the grace period, B fails A's trial, and the
    # setting A had, queued again, is the one B measures: one trial measured
    # in all, and B does not wait forever.
    import optuna
    import sqlalchemy

    from ernie_tui.engine_ctl.control import tune_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with throwaway_postgres(own_port(18761)) as db:
        storage = tune_storage.open_storage(optuna, db)
        study = optuna.create_study(study_name="shared", storage=storage, direction="maximize")
        a_setting = {"max_num_seqs": 3, "max_num_batched_tokens": 4096}
        study.enqueue_trial(a_setting)
        dead = study.ask({"max_num_seqs": optuna.distributions.CategoricalDistribution([1, 2, 3]),
                          "max_num_batched_tokens": optuna.distributions.CategoricalDistribution([1024, 2048, 4096])})
        assert dead.params == a_setting
        a_alive = threading.Event()
        a_alive.set()

        def beat() -> None:  # A's heartbeat, while A lives
            while a_alive.is_set():
                storage.record_heartbeat(dead._trial_id)
                threading.Event().wait(2.0)

        beater = threading.Thread(target=beat, daemon=True)
        beater.start()
        b = _driver(tmp_path, tiny_model, own_port(18751), db, 1, 7)
        lines: list[str] = []
        waiting = threading.Event()

        def read() -> None:
            assert b.stderr is not None
            for line in b.stderr:
                lines.append(line)
                if "waiting, in case" in line:
                    waiting.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        for _ in range(300):  # B measures BASE, then finds the budget taken by A's trial
            if waiting.wait(1.0) or b.poll() is not None:
                break
        reader.join(0 if waiting.is_set() else 10)
        assert waiting.is_set(), "".join(lines)
        assert study.trials[dead.number].state.name == "RUNNING"
        assert not _measured(study)  # B waited: it measured nothing while A's trial was alive
        # A dies: no more beats, and its last one ages past the grace period
        # (written back in the database rather than waited for: GRACE_S is 60 s).
        a_alive.clear()
        beater.join(10)
        engine = sqlalchemy.create_engine(db)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("UPDATE trial_heartbeats SET heartbeat = heartbeat - make_interval(secs => :s)"
                                         " WHERE trial_id = :t"), {"s": tune_storage.GRACE_S + 5, "t": dead._trial_id})
        engine.dispose()
        b.wait(300)
        reader.join(10)
        assert b.returncode == 0, "".join(lines)
        study = _load(db)
        assert study.trials[dead.number].state.name == "FAIL"
        assert _measured(study) == [json.dumps(a_setting, sort_keys=True)], "".join(lines)
        from ernie_tui.engine_ctl.load import runstore

        (rec,) = [r.results for r in runstore.list_runs(kind="tune")]
        assert rec["stopped"] == "budget: 1 trials measured" and rec["measured_trials"] == 1


def test_two_drivers_asking_the_last_trial_at_once_one_gives_it_back(tmp_path):
    # The race, step by step on PostgreSQL, each driver its own connection:
    # one trial left of --trials 2, and A and B both saw it. A asks its trial
    # and counts: itself and the measured one, 2, not over. B asks and counts
    # after: it sees A's trial too, over, so B gives its trial back. B's
    # trial came from the queue (a setting to run again): it is queued again.
    import optuna

    from ernie_tui.engine_ctl.control import tune_budget as tb
    from ernie_tui.engine_ctl.control import tune_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {"max_num_seqs": optuna.distributions.IntDistribution(1, 3)}
    with throwaway_postgres(own_port(18771)) as db:
        a_study = optuna.create_study(study_name="shared", storage=tune_storage.open_storage(optuna, db),
                                      direction="maximize")
        b_study = optuna.load_study(study_name="shared", storage=tune_storage.open_storage(optuna, db))
        done = a_study.ask(dists)
        done.set_user_attr("outcome", "measured")
        a_study.tell(done, 1.0)
        a_trial = a_study.ask(dists)
        assert not tb.over_budget(a_study, 2)  # A: the measured one and its own, 2 of 2
        b_study.enqueue_trial({"max_num_seqs": 3})
        b_trial = b_study.ask(dists)
        assert b_trial.params == {"max_num_seqs": 3}
        assert tb.taken(b_study) == (1, 2)
        assert tb.over_budget(b_study, 2)  # B counts after A's trial was written: 3 of 2
        assert tb.over_budget(a_study, 2)  # (had A counted only now, it would give back too: never both run)
        tb.give_back(optuna, b_study, b_trial)
        assert tb.taken(a_study) == (1, 1)  # A's trial alone in flight now
        again = [t for t in a_study.get_trials(deepcopy=False) if t.state.name == "WAITING"]
        assert [t.params for t in again] == [{"max_num_seqs": 3}] or \
            [t.system_attrs.get("fixed_params") for t in again] == [{"max_num_seqs": 3}]
        assert a_trial.params != {} and b_study.trials[b_trial.number].user_attrs["outcome"] == "given back"


@pytest.mark.timeout(600)
def test_a_driver_whose_trial_lands_past_the_budget_gives_it_back_and_measures_when_there_is_room(
        tmp_path, tiny_model):
    # The race as a driver meets it: B, --trials 1, sees the study's one
    # trial free and asks it; another driver's trial is written in the same
    # moment (here by a trigger in the database, inserted with B's first
    # trial row: the other driver, as PostgreSQL sees it). B counts after
    # asking, finds two in flight for one, gives its trial back and waits.
    # When the other trial turns out a repeat (told by the test, as that
    # driver would), B has room again and measures one: one measured in all.
    import optuna
    import sqlalchemy

    from ernie_tui.engine_ctl.control import tune_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with throwaway_postgres(own_port(18791)) as db:
        storage = tune_storage.open_storage(optuna, db)
        optuna.create_study(study_name="shared", storage=storage, direction="maximize")  # its tables
        engine = sqlalchemy.create_engine(db)
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("CREATE TABLE other_driver_asked (trial_id integer)"))
            conn.execute(sqlalchemy.text("""
                CREATE FUNCTION other_driver_asks() RETURNS trigger AS $$
                BEGIN
                  IF NOT EXISTS (SELECT 1 FROM other_driver_asked) THEN
                    INSERT INTO other_driver_asked VALUES (0);
                    INSERT INTO trials (number, study_id, state, datetime_start)
                      VALUES (100, NEW.study_id, 'RUNNING', now());
                    UPDATE other_driver_asked SET trial_id = currval('trials_trial_id_seq');
                  END IF;
                  RETURN NEW;
                END $$ LANGUAGE plpgsql"""))
            conn.execute(sqlalchemy.text("CREATE TRIGGER other_driver AFTER INSERT ON trials "
                                         "FOR EACH ROW EXECUTE FUNCTION other_driver_asks()"))
        b = _driver(tmp_path, tiny_model, own_port(18781), db, 1, 3)
        study = _load(db)
        given_back: list = []
        for _ in range(300):
            given_back = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("outcome") == "given back"]
            if given_back or b.poll() is not None:
                break
            threading.Event().wait(1.0)
        assert len(given_back) == 1, b.communicate(timeout=60)
        assert not _measured(study)  # B measured nothing past the budget
        with engine.begin() as conn:
            other = conn.execute(sqlalchemy.text("SELECT trial_id FROM other_driver_asked")).scalar_one()
        storage.set_trial_user_attr(other, "outcome", "repeat")  # the other driver's trial: a repeat, no server
        storage.set_trial_state_values(other, optuna.trial.TrialState.PRUNED)
        engine.dispose()
        out, err = b.communicate(timeout=300)
        assert b.returncode == 0, err
        assert "waiting, in case" in err
        study = _load(db)
        assert len(_measured(study)) == 1, err
        from ernie_tui.engine_ctl.load import runstore

        (rec,) = [r.results for r in runstore.list_runs(kind="tune")]
        assert rec["stopped"] == "budget: 1 trials measured" and rec["measured_trials"] == 1
        assert all(r["outcome"] != "given back" for r in rec["trials"])  # never run, never listed


def test_a_trial_starts_only_where_the_longest_so_far_still_fits():
    from ernie_tui.engine_ctl.control.tune import room_for_trial

    # Trials of 49-52 s with 51 s left: the mean (50.3) fits, the longest does not (tune vs grid, run 1).
    assert not room_for_trial(200.0, 251.0, [52.0, 49.0, 50.0])
    assert room_for_trial(199.0, 251.0, [52.0, 49.0, 50.0])
    assert room_for_trial(250.0, 251.0, [])  # nothing measured yet: no estimate to refuse on


def test_the_budget_counts_from_the_process_start():
    import time

    from ernie_tui.cli.cmd_tune import budget_left

    assert budget_left(None) is None
    assert budget_left(60.0, started=time.time() - 5.0) == pytest.approx(55.0, abs=0.5)
    assert budget_left(60.0, started=time.time() - 600.0) == 1.0  # spent already: the tune stops at once
    left = budget_left(3600.0)  # this test process started a while ago: some of the hour is gone
    assert left is not None and left < 3600.0
