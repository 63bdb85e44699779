"""bench/ray_vllm_cpu.py's pure parts: how it reads the servers' intervals
for "two at a time", which trials it counts as measured from the tune's own
progress lines (it kills a node only after one), and the presets and spaces
it tunes (the cluster and the tunes themselves run in the bench, not here)."""

from __future__ import annotations

import itertools
import time
import tomllib

from bench_scripts import load_bench

ray_bench = load_bench("ray_vllm_cpu")


def test_overlap_counts_servers_up_at_once_and_for_how_long():
    spans = [("BASE", 0.0, 10.0, None), ("trial 0", 10.5, 30.0, "a"), ("trial 1", 11.0, 25.0, "b"),
             ("trial 2", 26.0, 40.0, "b")]
    ov = ray_bench.overlap(spans)
    assert ov["most_at_once"] == 2
    assert ov["seconds_two_or_more_up"] == 14.0 + 4.0  # 11..25, then 26..30
    assert ov["overlapping_pairs"] == [("trial 0", "trial 1"), ("trial 0", "trial 2")]
    one_at_a_time = ray_bench.overlap([("BASE", 0.0, 10.0, None), ("trial 0", 10.0, 20.0, "a")])
    assert one_at_a_time == {"most_at_once": 1, "seconds_two_or_more_up": 0.0, "overlapping_pairs": []}


def _line(capsys, row, measured):
    # The tune's own progress line for a finished trial (cmd_tune._progress), as the bench reads it.
    from ernie_tui.cli.cmd_tune import _progress

    _progress(None, time.monotonic())({"event": "trial_done", "row": row, "best": row if measured else None,
                                       "measured": 1, "max_trials": 6, "deadline": None})
    return capsys.readouterr().err.strip()


def test_finished_trials_are_the_measured_ones_from_the_tunes_lines(tmp_path, capsys):
    from ernie_tui.engine_ctl.control.tune import TrialRow

    base = ray_bench.BASE
    measured = TrialRow(3, f"{base}-tune-3", {"max_num_seqs": 4, "max_num_batched_tokens": 2048}, "measured",
                        1234.5)
    repeat = TrialRow(4, f"{base}-tune-4", {"max_num_seqs": 4, "max_num_batched_tokens": 2048}, "repeat",
                      reason="same setting as trial 3")
    tune = ray_bench.Tune("t", tmp_path, [], None)
    tune.lines = [(0.0, _line(capsys, measured, True)), (1.0, _line(capsys, repeat, False)),
                  (2.0, "trial 5 max_num_seqs=2 max_num_batched_tokens=4096: preflight ...")]
    assert tune.finished_trials() == [3]


def test_the_presets_extend_cpu_demo_and_no_setting_of_the_space_is_base(tmp_path):
    from ernie_tui.presets import load_presets

    for stand in ("vllm", "paced"):
        presets, space, load = ray_bench.write_presets(tmp_path, stand, 37500, "m")
        base = load_presets([presets], include_user=False).get(ray_bench.BASE)
        assert base.get("block_size") == 32 and base.get("kv_cache_memory_bytes") == "64M"
        assert base.env[ray_bench.MARK_ENV] == "m" and base.port == 37500
        grid = tomllib.loads(space.read_text())
        settings = list(itertools.product(*grid.values()))
        # Six settings, none BASE's own (a trial of it would be a repeat, never measured).
        assert len(settings) >= 6
        assert (base.get("max_num_seqs"), base.get("max_num_batched_tokens")) not in settings
        assert ("--level-time" in load) and (stand == "paced" or base.get("enforce_eager") is True)
