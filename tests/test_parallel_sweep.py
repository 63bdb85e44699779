"""Parallel sweep trials: the scheduler (pure: disjoint GPU sets, plan order,
presets that can never fit), GPU discovery and its refusal on a machine that
does not say, and real sweeps of paced stand-in servers launched as presets
with made-up GPU ids: every stand-in saw only its own GPUs, no two trials
running at the same time shared one, and every trial ran all its requests
side by side as alone. How much faster the parallel sweep is, and whether
neighbours move each other's figures, are measured by bench/parallel_sweep.py
and bench/neighbour_disturbance.py, not asserted here: on a busy 2-core box
the CPU-bound trials read anything (tok/s 48.9 beside against 192.6 alone)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ernie_tui.cli import main
from ernie_tui.engine_ctl.control.sweep import SweepOptions, SweepPlan, fold, run_sweep
from ernie_tui.engine_ctl.control.trial_schedule import (
    GpuIdsError,
    Trial,
    TrialScheduler,
    detect_gpu_ids,
    parse_gpu_ids,
)
from ernie_tui.engine_ctl.launch import machine
from ernie_tui.engine_ctl.launch.parallel_layout import gpus_needed, layout_of
from ernie_tui.engine_ctl.load.burst import BurstConfig
from ernie_tui.presets import Preset, load_presets
from worker_ports import own_port

PACED = Path(__file__).resolve().parent / "paced_server.py"


def P(name: str, **args) -> Preset:
    return Preset(name=name, engine_args=args)


# -- layout ---------------------------------------------------------------------------

def test_gpus_needed_follows_vllm_world_size():
    assert gpus_needed(P("a")) == 1
    assert gpus_needed(P("a", tensor_parallel_size=2)) == 2
    assert gpus_needed(P("a", tensor_parallel_size=2, pipeline_parallel_size=2)) == 4
    assert gpus_needed(P("a", data_parallel_size=2)) == 2  # dp-local defaults to dp
    assert gpus_needed(P("a", tensor_parallel_size=2, data_parallel_size=4, data_parallel_size_local=2)) == 4
    assert gpus_needed(P("a", tensor_parallel_size=8, nnodes=2)) == 4  # multi-node TP: half per node
    lay = layout_of(P("a", data_parallel_size=4, data_parallel_size_local=2, data_parallel_address="10.0.0.1"))
    assert lay.remote_engines and lay.rpc_port == 29550 and not lay.uses_ray
    assert layout_of(P("a", distributed_executor_backend="ray")).uses_ray


# -- the scheduler (pure) --------------------------------------------------------------

def simulate(sched: TrialScheduler, duration) -> list[tuple[float, float, Trial, tuple[str, ...]]]:
    """Discrete-event run: trial t takes duration(t) seconds. Returns (start, end, trial, gpus)."""
    now, running, out = 0.0, [], []
    while not sched.done:
        for a in sched.start():
            running.append((now + duration(a.trial), now, a))
        assert running, "nothing runs and nothing can start: the scheduler is stuck"
        running.sort(key=lambda x: x[0])
        end, start, a = running.pop(0)
        now = end
        sched.finish(a)
        out.append((start, end, a.trial, a.gpus))
    return out


def assert_disjoint(timeline) -> None:
    for i, (s1, e1, t1, g1) in enumerate(timeline):
        for s2, e2, t2, g2 in timeline[i + 1:]:
            if s1 < e2 and s2 < e1:  # ran at the same time
                assert not set(g1) & set(g2), f"{t1.preset.name} and {t2.preset.name} shared {set(g1) & set(g2)}"


def trials(presets, repeat=1):
    return [Trial(i, r, p) for i, (r, p) in enumerate(SweepPlan(presets, repeat).order())]


def test_four_single_gpu_trials_on_two_gpus_take_half_the_time():
    sched = TrialScheduler(trials([P(n) for n in "abcd"]), ["0", "1"], gpus_per_trial=1)
    timeline = simulate(sched, lambda t: 10.0)
    assert_disjoint(timeline)
    assert max(e for _, e, _, _ in timeline) == 20.0  # sequential: 40
    assert [(s, t.preset.name, g) for s, _, t, g in timeline] == [
        (0.0, "a", ("0",)), (0.0, "b", ("1",)), (10.0, "c", ("0",)), (10.0, "d", ("1",))]


def test_repeats_rotate_and_a_big_trial_waits_for_enough_gpus():
    presets = [P("tp2", tensor_parallel_size=2), P("a"), P("b")]
    sched = TrialScheduler(trials(presets, repeat=2), ["0", "1", "2"], gpus_per_trial=None)  # auto
    started = []
    timeline = simulate(sched, lambda t: {"tp2": 10.0, "a": 3.0, "b": 4.0}[t.preset.name])
    assert_disjoint(timeline)
    started = [(t.repeat, t.preset.name) for _, _, t, _ in sorted(timeline, key=lambda x: (x[0], x[2].index))]
    # Round 0 in order tp2, a, b; round 1 rotated: a, b, tp2.
    assert {(0, "tp2"), (0, "a"), (1, "tp2")} <= set(started)
    tp2 = [g for _, _, t, g in timeline if t.preset.name == "tp2"]
    assert all(len(g) == 2 for g in tp2)
    assert len(timeline) == 6


def test_presets_that_can_never_fit_are_listed_not_started():
    presets = [P("tp2", tensor_parallel_size=2), P("tp4", tensor_parallel_size=4), P("a")]
    sched = TrialScheduler(trials(presets), ["0", "1"], gpus_per_trial=1)
    unfit = {t.preset.name: why for t, why in sched.unfit()}
    assert set(unfit) == {"tp2", "tp4"}
    assert "needs 2 GPUs (tensor_parallel_size 2) but --gpus-per-trial 1" in unfit["tp2"]
    auto = TrialScheduler(trials(presets), ["0", "1"], gpus_per_trial=None)
    assert [t.preset.name for t, _ in auto.unfit()] == ["tp4"]
    assert "the sweep has 2 (0,1)" in auto.unfit()[0][1]
    assert [a.trial.preset.name for a in auto.start()] == ["tp2"]  # a waits: tp2 holds both


def test_gpu_ids_from_flag_env_nvml_or_a_clear_refusal(monkeypatch):
    assert parse_gpu_ids("0, 1") == ["0", "1"]
    for bad, words in (("0,,1", "separated by commas"), ("1,1", "GPU 1 twice"), ("", "separated by commas")):
        with pytest.raises(GpuIdsError, match=words):
            parse_gpu_ids(bad)
    assert detect_gpu_ids("2,3", env={"CUDA_VISIBLE_DEVICES": "0"}) == ["2", "3"]
    assert detect_gpu_ids(None, env={"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}) == ["GPU-aa", "GPU-bb"]
    with pytest.raises(GpuIdsError, match="hides every GPU"):
        detect_gpu_ids(None, env={"CUDA_VISIBLE_DEVICES": ""})
    monkeypatch.setattr(machine, "_nvml_gpus", lambda: (None, "NVML unavailable: driver not loaded"))
    with pytest.raises(GpuIdsError, match=r"does not say \(NVML unavailable: driver not loaded\); pass them "
                                          r"with --gpus 0,1"):
        detect_gpu_ids(None, env={})
    found = [machine.GpuInfo(i, "H200", None, None) for i in range(2)]
    monkeypatch.setattr(machine, "_nvml_gpus", lambda: (found, "nvml"))
    assert detect_gpu_ids(None, env={}) == ["0", "1"]


def test_cli_refuses_gpus_per_trial_where_the_gpus_are_unknown(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(machine, "_nvml_gpus", lambda: (None, "nvidia-ml-py not importable (ImportError)"))
    code = main(["sweep", "cpu-demo", "cpu-demo-b64", "--gpus-per-trial", "1", "--out", str(tmp_path / "t.md")])
    assert code == 1
    err = capsys.readouterr().err
    assert "--gpus-per-trial needs to know the GPUs" in err and "pass them with --gpus 0,1" in err
    assert not (tmp_path / "t.md").exists()
    assert main(["sweep", "cpu-demo", "--gpus", "0,1", "--out", str(tmp_path / "t.md")]) == 1
    assert "--gpus belongs to --gpus-per-trial" in capsys.readouterr().err


# -- real sweeps of stand-in servers ------------------------------------------------------

def stand_ins(tmp_path: Path, model: Path, names, **env) -> Path:
    pacing = {"PACED_SLOTS": "4", "PACED_TTFT_MS": "20", "PACED_ITL_MS": "10", **env}
    env_text = ", ".join(f'{k} = "{v}"' for k, v in pacing.items())
    body = ""
    for name in names:
        # All on the same port on purpose: each trial must get its own.
        body += textwrap.dedent(f"""
            [presets.{name}]
            extends = "cpu-demo"
            model = "{model}"
            port = {own_port(18140)}
            launcher = ["{sys.executable}", "{PACED}"]
            env = {{ {env_text} }}
        """)
    path = tmp_path / "stand-ins.toml"
    path.write_text(body)
    return path


def sweep(presets, log_dir: Path, progress=None, cancel=None, n: int = 6, **options):
    config = BurstConfig(n=n, concurrency=2, min_tokens=10, max_tokens_in=30, max_tokens=30)
    # A stand-in is ready in about a second; 120 s only matters on a box stalled
    # by its neighbours, where a start past 30 s failed a trial by chance.
    opts = SweepOptions(ready_timeout_s=120, log_dir=log_dir, save_records=False, **options)
    t0 = time.monotonic()
    runs = run_sweep(SweepPlan(presets, 1), config, opts, progress, cancel)
    return time.monotonic() - t0, runs


def test_parallel_trials_own_their_gpus_side_by_side(tmp_path, tiny_model):
    names = ["p0", "p1", "p2", "p3"]
    book = load_presets([str(stand_ins(tmp_path, tiny_model, names))], include_user=False)
    presets = [book.get(n) for n in names]
    events: list[dict] = []
    _, par = sweep(presets, tmp_path / "par", progress=events.append, gpus_per_trial=1, gpu_ids=["0", "1"])
    _, seq = sweep(presets, tmp_path / "seq")
    assert [r.status for r in par + seq] == ["ok"] * 8, [(r.status, r.message) for r in par + seq]

    # Each parallel trial's burst ran in a child process of its own (not this
    # one, not its neighbour's), whose progress reached the sweep's callback
    # up to the last request; a sequential sweep's ran here.
    me = os.getpid()
    pids = [r.load_pid for r in par]
    assert None not in pids and me not in pids and len(set(pids)) == 4, pids
    assert all(r.load_pid == me for r in seq)
    for r in par:
        mine = [e for e in events if e["preset"] == r.preset and e["phase"] == "burst"]
        assert mine[-1]["burst_done"] == mine[-1]["burst_total"] == 6, mine[-1]
        assert {e.get("load_pid") for e in mine[1:]} == {r.load_pid}  # forwarded from that child
        assert r.requests == 6 and r.errors == 0
        assert r.peak_memory_gib is not None  # the trial's thread sampled the stand-in's memory meanwhile

    # (a) Each stand-in was started with exactly its trial's GPUs (it prints
    # what it got), and trials that ran at the same time shared no GPU and no port.
    for r in par:
        log = (tmp_path / "par" / f"{r.preset}-r0.log").read_text()
        seen = re.search(r"CUDA_VISIBLE_DEVICES=(\S+)", log).group(1)
        assert seen == r.gpus and r.gpus in ("0", "1"), (r.preset, seen, r.gpus)
    overlapping = 0
    for i, a in enumerate(par):
        for b in par[i + 1:]:
            if a.started_at < b.ended_at and b.started_at < a.ended_at:
                overlapping += 1
                assert set(a.gpus.split(",")).isdisjoint(b.gpus.split(",")), (a, b)
                assert a.port != b.port
    assert overlapping >= 2  # they did run side by side
    assert all("CUDA_VISIBLE_DEVICES=(unset)" in (tmp_path / "seq" / f"{n}-r0.log").read_text() for n in names)

    # (b) Both sweeps fold to a row per preset with a figure from all six
    # requests. Whether the parallel one is faster and its figures the same is
    # a measurement (bench/parallel_sweep.py --stand-ins): on a 2-core box the
    # trials' start-up and load are CPU-bound and share the cores, so a busy
    # box moved the parallel tok/s to a quarter of the sequential one.
    for rows in (fold(seq, names), fold(par, names)):
        assert [row.preset for row in rows] == names
        assert all(row.stats["output_tps"].median > 0 for row in rows), rows


def test_parallel_capacity_sweep_folds_as_the_sequential_one(tmp_path, tiny_model, capsys):
    body = ""
    for name, slots in (("slots2", 2), ("slots4", 4)):
        body += textwrap.dedent(f"""
            [presets.{name}]
            extends = "cpu-demo"
            model = "{tiny_model}"
            launcher = ["{sys.executable}", "{PACED}"]
            env = {{ PACED_SLOTS = "{slots}", PACED_TTFT_MS = "20", PACED_ITL_MS = "10" }}
        """)
    presets = tmp_path / "p.toml"
    presets.write_text(body)
    out = tmp_path / "sweep.json"
    code = main(["sweep", "slots2", "slots4", "--presets", str(presets), "--out", str(out), "--capacity",
                 "--slo", "ttft_p90=100ms", "--max-tokens", "16", "--min-tokens", "10", "--max-tokens-in", "40",
                 "--start-concurrency", "2", "--ready-timeout", "30", "--gpus", "0,1", "--gpus-per-trial", "1",
                 # Levels 2, 4, then 3 (slots2) or 8, 6 (slots4) decide each capacity within the
                 # tolerance; no confirmation run, two windows a level: the capacities asserted
                 # are a queue's (a third of the requests wait a whole request), far from the limit.
                 "--tolerance", "0.5", "--confirm-waves", "0", "--min-windows", "2", "--level-time", "15",
                 "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "(GPU 0)" in err and "(GPU 1)" in err
    # The searches ran in child processes; their level events still reached the CLI's lines.
    for gpu in ("0", "1"):
        assert re.search(rf"\(GPU {gpu}\): capacity: concurrency \d+ (pass|fail)", err), err
    data = json.loads(out.read_text())
    pids = {r["runs"][0]["load_pid"] for r in data["rows"]}
    assert len(pids) == 2 and os.getpid() not in pids and None not in pids
    rows = {r["preset"]: r for r in data["rows"]}
    assert rows["slots2"]["stats"]["capacity_concurrency"]["median"] == 2
    assert rows["slots4"]["stats"]["capacity_concurrency"]["median"] == 4
    assert rows["slots4"]["rank"] == 1 and rows["slots2"]["rank"] == 2
    assert {rows[n]["runs"][0]["gpus"] for n in rows} == {"0", "1"}
    assert data["meta"]["parallel"] == "1 GPU(s) per trial on GPUs 0,1"


def test_parallel_sweep_skips_what_cannot_fit_and_headless_presets(tmp_path, tiny_model):
    book = load_presets([str(stand_ins(tmp_path, tiny_model, ["one"]))], include_user=False)
    one = book.get("one")
    from dataclasses import replace

    tp2 = replace(one, name="tp2", engine_args={**one.engine_args, "tensor_parallel_size": 2})
    worker = replace(one, name="worker", engine_args={**one.engine_args, "headless": True,
                                                     "data_parallel_address": "127.0.0.1"})
    _, runs = sweep([one, tp2, worker], tmp_path / "logs", gpus_per_trial=1, gpu_ids=["0", "1"])
    by = {r.preset: r for r in runs}
    assert by["one"].status == "ok"
    assert by["tp2"].status == "skipped: tp_exceeds_gpus" and "--gpus-per-trial 1" in by["tp2"].message
    assert by["worker"].status == "skipped: headless" and "serves no API" in by["worker"].message
    assert not (tmp_path / "logs" / "tp2-r0.log").exists()
    assert not (tmp_path / "logs" / "worker-r0.log").exists()


def slow_pair(tmp_path: Path, tiny_model: Path):
    """Two stand-ins whose requests take ~0.3 s each (30 tokens at 10 ms)."""
    book = load_presets([str(stand_ins(tmp_path, tiny_model, ["a", "b"]))], include_user=False)
    return [book.get("a"), book.get("b")]


def load_children() -> list[int]:
    """This process's spawned load children still alive (not the resource tracker)."""
    import psutil

    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any("spawn_main" in part for part in child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child.pid)
        except psutil.Error:
            pass
    return out


def test_cancel_while_starting_ends_the_idle_load_children(tmp_path, tiny_model):
    import threading

    cancel = threading.Event()

    def progress(ev: dict) -> None:
        if ev["phase"] == "starting":
            cancel.set()

    _, runs = sweep(slow_pair(tmp_path, tiny_model), tmp_path / "logs", progress, cancel,
                    gpus_per_trial=1, gpu_ids=["0", "1"])
    assert [r.status for r in runs] == ["cancelled"] * len(runs) and runs, [(r.status, r.message) for r in runs]
    # Ended by the cancel while starting, not by waiting out the 30 s ready
    # timeout (which reads "failed: ..."), and before any load ran.
    assert all(r.message == "cancelled while starting" for r in runs), [r.message for r in runs]
    assert all(r.load_pid is None for r in runs)  # no load ran
    assert load_children() == []


def test_cancel_mid_load_stops_both_children_and_the_sweep_promptly(tmp_path, tiny_model):
    import threading

    import psutil

    cancel = threading.Event()
    started: dict[str, int] = {}
    cancelled_at: list[float] = []

    done: dict[str, int] = {}
    stopping_at: dict[str, float] = {}  # the load has ended; the server's stop begins

    def progress(ev: dict) -> None:
        if ev["phase"] == "stopping":
            stopping_at[ev["preset"]] = time.monotonic()
        if ev["phase"] == "burst" and ev.get("burst_done", 0) >= 1:
            done[ev["preset"]] = ev["burst_done"]
            started[ev["preset"]] = ev["load_pid"]
            if len(started) == 2 and not cancel.is_set():
                cancelled_at.append(time.monotonic())
                cancel.set()

    # 200 requests at concurrency 2: some 30 s of load, if nothing stopped it.
    _, runs = sweep(slow_pair(tmp_path, tiny_model), tmp_path / "logs", progress, cancel, n=200,
                    gpus_per_trial=1, gpu_ids=["0", "1"])
    # Both loads must have answered a request before the cancel (a CI run once
    # got here without one: said with each trial's status, not an IndexError).
    assert cancelled_at, ([(r.preset, r.status, r.message) for r in runs], done)
    took = time.monotonic() - cancelled_at[0]
    assert [r.status for r in runs] == ["cancelled", "cancelled"], [(r.status, r.message) for r in runs]
    assert set(done) == {"a", "b"} and max(done.values()) < 50, done  # cut short, not run to the end
    # Promptness is counted in requests above, not in seconds: a busy box
    # once stretched the wind-down plus the stand-ins' stop to 15.6 s. The
    # two phases are printed apart, so a slow run says which one was slow: the
    # loads' wind-down (the child's grace is 5 s, then 2 s to kill it), then
    # the stand-ins' stop (SIGINT grace, then SIGTERM).
    wind_down = {k: round(v - cancelled_at[0], 2) for k, v in stopping_at.items()}
    print(f"loads wound down after {wind_down} s; the servers' stops took "
          f"{[round(r.stop_s or 0, 2) for r in runs]} s; all done after {took:.2f} s")
    assert set(wind_down) == {"a", "b"}  # both loads ended before their servers were stopped
    assert {r.load_pid for r in runs} == set(started.values())
    assert not any(psutil.pid_exists(p) for p in started.values())  # reaped, not left running
    assert load_children() == []


def test_a_killed_load_process_fails_its_row_and_the_neighbour_finishes(tmp_path, tiny_model):
    killed: list[int] = []

    def progress(ev: dict) -> None:
        if ev["preset"] == "a" and ev["phase"] == "burst" and ev.get("burst_done", 0) >= 1 and not killed:
            killed.append(ev["load_pid"])
            os.kill(ev["load_pid"], signal.SIGKILL)

    _, runs = sweep(slow_pair(tmp_path, tiny_model), tmp_path / "logs", progress, n=12,
                    gpus_per_trial=1, gpu_ids=["0", "1"])
    a, b = runs
    assert a.status == "failed: error" and "SIGKILL" in a.message and a.load_pid == killed[0], a
    assert b.status == "ok" and b.requests == 12 and b.errors == 0, b
    assert a.load_pid != b.load_pid
    assert a.ended_at is not None  # its server was stopped as after any trial
    assert load_children() == []


def test_neighbour_bench_measures_alone_threads_and_processes_on_stand_ins(tmp_path, tiny_model):
    """bench/neighbour_disturbance.py on two paced stand-ins: every mode (the
    sweep's own, load in spawned children, among them) gets
    one sample per round for both presets, every request completes, and every
    mode's row has a figure and a verdict against the alone spread. (Whether
    the modes read the same is what the bench measures; on a busy 2-core box
    the stand-ins' pacing and the client share the cores, so no test asserts it.)"""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import neighbour_disturbance as nd

    out = tmp_path / "nb.json"
    assert nd.main(["--stand-ins", "--model", str(tiny_model), "--rounds", "2", "--burst", "12",
                    "--concurrency", "4", "--min-tokens", "5", "--max-tokens-in", "20", "--max-tokens", "10",
                    "--warmup", "4", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    for name in ("stand-in-0", "stand-in-1"):
        for mode in ("alone", "threads", "procs", "sweep"):
            runs = got["samples"][name][mode]
            assert len(runs) == 2 and all(r["completed"] == r["total"] == 12 for r in runs)
    rows = {(r["preset"], r["mode"]): r for r in got["rows"]}
    assert rows[("stand-in-0", "alone")]["output_tps"]["median"] > 0
    for mode in ("threads", "procs", "sweep"):
        assert rows[("stand-in-0", mode)]["output_tps"]["median"] > 0
        assert rows[("stand-in-0", mode)]["verdict"] in ("within noise", "beyond noise")


def test_neighbour_verdict_reads_the_alone_spread():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import neighbour_disturbance as nd

    assert nd.spread_verdict([100, 110, 105], [104, 108]) == "within noise"
    assert nd.spread_verdict([100, 110, 105], [130, 131]) == "beyond noise"
    assert nd.spread_verdict([100, 110, 105], [112, 120]) == "within noise"  # widened by its own spread
    assert nd.spread_verdict([100], [130]) == "(one round: no spread)"
