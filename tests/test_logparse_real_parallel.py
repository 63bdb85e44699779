"""Ranks from real multi-GPU logs (two H200s, vLLM 0.26.0): data parallelism,
and tensor parallelism through the Ray executor, whose worker lines carry the
engine's, Ray's and the worker's prefixes one after another."""

from __future__ import annotations

from ernie_tui.engine_ctl.logs.logparse import parse_file
from ernie_tui.engine_ctl.logs.ranks import parallel_ranks

DIR = "gpu-2xh200-vllm0.26.0"


def _ranks(path):
    report = parse_file(path)
    return report, {r.name: r for r in parallel_ranks(report.ranks)}


def test_tp2_through_ray_names_both_workers_by_their_own_prefix(fixtures_dir):
    report, ranks = _ranks(fixtures_dir / DIR / "ok_tp2-ray.log")
    assert report.ready
    assert {"EngineCore", "Worker_TP0", "Worker_TP1"} <= set(ranks)
    assert ranks["Worker_TP0"].kv_cache_gib == 127.64  # logged by the worker, not by the engine core
    assert ranks["Worker_TP0"].weights_gib == ranks["Worker_TP1"].weights_gib == 0.37
    assert ranks["EngineCore"].kv_cache_tokens == report.kv_cache_tokens == 14_870_784
    assert not any(name.startswith("Ray") for name in ranks)  # Ray's hop is not a rank of its own


def test_dp2_lists_each_engine_with_its_own_kv_pool(fixtures_dir):
    report, ranks = _ranks(fixtures_dir / DIR / "ok_dp2.log")
    assert report.ready
    engines = {n: r.kv_cache_tokens for n, r in ranks.items() if n.startswith("EngineCore_DP")}
    assert engines == {"EngineCore_DP0": 7_423_936, "EngineCore_DP1": 7_421_344}
