"""bench/gpu_multi.py end to end on the stand-in server (tests/tui_fake_vllm.py):
a data-parallel preset launched, ready, burst while the fleet poller watches,
stopped; the verdict line and the JSON the GPU run will be read from."""

from __future__ import annotations

import json
import re

from bench_scripts import load_bench


def _load():
    return load_bench("gpu_multi")


def test_dp2_on_the_stand_in(tmp_path, capsys):
    out = tmp_path / "multi.json"
    rc = _load().main(["dp2", "--stand-in", "--burst", "4", "--concurrency", "2", "--max-tokens", "8",
                       "--ready-timeout", "30", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    line = [x for x in text.splitlines() if x.startswith("VERDICT dp2:")][-1]
    assert re.search(r"PASS \| ranks [1-9]\d* \[EngineCore.*\] \| fleet engines 2 \[0, 1\] \| burst ok 4/4 \| "
                     r"memory diff ", line), line
    data = json.loads(out.read_text())
    assert data["stand_in"] is True
    (res,) = data["presets"]
    assert res["preset"] == "dp2" and res["ok"] is True and res["error"] is None
    assert res["expected_engines"] == 2 and res["engines_seen"] == ["0", "1"]
    assert res["kv_cache_tokens"] and all({"name", "pid", "kv_cache_tokens"} <= set(r) for r in res["ranks"])
    # Every fleet poll: the server's row, then one per engine.
    assert res["fleet"] and all([r["engine"] for r in rows] == [None, "0", "1"] for rows in res["fleet"])
    assert res["burst"]["completed"] == res["burst"]["total"] == 4 and res["burst"]["output_tps"] > 0
    assert res["burst"]["ttft_p99_ms"] is not None
    assert "skipped" in res["memory"] or res["memory"]["max_diff_mib"] is not None
    assert res["left_processes"] == []
