"""A capacity search's level rates against vLLM's own counter, from run records.

For each level measured at a concurrency, this prints three output rates:
- the windows' rate: tokens of the requests sent inside the measured windows, over the windows' span;
- the streams' rate: concurrency x tokens / latency;
- vLLM's `generation_tokens` over the level, from the /metrics samples the record kept.

It also prints the counted requests over the concurrency. Whole numbers there (4.01, 3.0) are waves: requests
alike in length, all sent at once, end together. A short level's windows then hold 2 waves or 3, and the windows'
rate jumps by a third. See docs/lab/capacity-h200/2026-12-06-tune-h100.md.

    python bench/level_rates.py docs/lab/data/h100-tune-2026-12-06/home/data/runs/*capacity*.json

Records written before d845722 have no `window_output_tps`. Their `output_tps` is then the windows' rate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path) -> list[tuple[str, int, float, float, float | None, float | None]]:
    """(record, concurrency, counted/C, windows' tok/s, streams' tok/s, vLLM counter tok/s) a level."""
    data = json.loads(path.read_text())
    out = []
    for lv in (data.get("results") or {}).get("levels") or []:
        c, windows = lv.get("concurrency"), lv.get("windows")
        if not c or not windows:
            continue  # open loop, or a level no window of which closed
        window = lv.get("window_output_tps") or lv.get("output_tps")
        vllm = lv.get("vllm") or {}
        counter = (vllm["generation_tokens"] / vllm["window_s"]
                   if vllm.get("generation_tokens") and vllm.get("window_s") else None)
        out.append((path.stem[-6:], int(c), lv["requests"] / c, window, lv.get("stream_output_tps"), counter))
    return out


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__)
        return 2
    table = [r for p in paths for r in rows(Path(p))]
    print(f"{'record':>8} {'conc':>5} {'reqs/C':>7} {'windows':>9} {'streams':>9} {'vLLM':>9} {'win/vLLM':>9} "
          f"{'str/vLLM':>9}")
    win_r, str_r = [], []
    for rec, c, waves, window, streams, counter in table:
        wr = window / counter if counter and window else None
        sr = streams / counter if counter and streams else None
        win_r += [wr] if wr else []
        str_r += [sr] if sr else []

        def f(v: float | None, spec: str = ",.0f") -> str:
            return format(v, spec) if v is not None else "-"
        print(f"{rec:>8} {c:>5} {waves:>7.2f} {f(window):>9} {f(streams):>9} {f(counter):>9} {f(wr, '.3f'):>9} "
              f"{f(sr, '.3f'):>9}")
    if win_r and str_r:
        print(f"{len(table)} levels; windows' rate over vLLM's counter {min(win_r):.3f}-{max(win_r):.3f}, "
              f"streams' {min(str_r):.3f}-{max(str_r):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
