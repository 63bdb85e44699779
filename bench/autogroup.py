"""What a server in its own session (setsid) costs the client on a small box.

Linux's autogroup scheduler (kernel.sched_autogroup_enabled=1) shares the CPU
between sessions first and threads second. EngineServer used to start vLLM
with start_new_session (hang-up safety), which gave vLLM a session, and an
autogroup, of its own, the dashboard and its load client staying in the
terminal's; it now starts it in a process group of its own in our session
(own_session=False), which keeps it out of the terminal's SIGHUP too. This
starts the cpu-demo preset on the tiny model twice, in its own session and in
ours (own process group only), prints both autogroups, and runs the same
bursts against each: client TTFT beside vLLM's own (/metrics).

    PYTHONPATH=src .venv/bin/python bench/autogroup.py [--rounds 1] [--n 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from ernie_tui.engine_ctl.control import EngineServer, ServerState  # noqa: E402
from ernie_tui.engine_ctl.launch import free_port  # noqa: E402
from ernie_tui.engine_ctl.load import BurstConfig, run_burst  # noqa: E402
from ernie_tui.presets import load_presets  # noqa: E402
from vllm_support import tiny_model_dir  # noqa: E402


def autogroup(pid: int | str) -> str:
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().strip()
    except OSError as exc:
        return f"? ({exc.strerror})"


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def one(own_session: bool, n: int, concurrencies: list[int]) -> list[dict]:
    preset = load_presets(include_user=False).get("cpu-demo")
    spec = preset.launch_spec(str(tiny_model_dir()), port_override=free_port())
    log_dir = Path(tempfile.mkdtemp(prefix="ernie-autogroup-"))
    server = EngineServer(spec, preset_name="cpu-demo", log_path=log_dir / "llm.log", own_session=own_session)
    t0 = time.monotonic()
    server.start()
    rows = []
    try:
        st = server.wait_ready(600)
        if st.state != ServerState.READY:
            raise SystemExit(f"not ready: {st.state.value} {st.error}")
        ready_s = time.monotonic() - t0
        groups = {"server": autogroup(st.pid), "client": autogroup("self")}
        run_burst(spec.url, BurstConfig(n=8, concurrency=2, max_tokens=32))  # first batches compile kernels
        for c in concurrencies:
            r = run_burst(spec.url, BurstConfig(n=n, concurrency=c))
            v = r.vllm
            rows.append({"own_session": own_session, "concurrency": c, "n": n, "ready_s": round(ready_s, 1),
                         "autogroups": groups, "client_ttft_p50_ms": ms(r.ttft.get("p50")),
                         "client_ttft_p99_ms": ms(r.ttft.get("p99")),
                         "vllm_ttft_p50_ms": ms(v.ttft_p50_s if v else None),
                         "vllm_ttft_p99_ms": ms(v.ttft_p99_s if v else None),
                         "output_tps": round(r.output_tps, 1) if getattr(r, "output_tps", None) else None,
                         "ok": r.completed, "load1": round(__import__("os").getloadavg()[0], 1)})
            print(json.dumps(rows[-1]), flush=True)
        log = (log_dir / "llm.log").read_text(errors="replace")
        print(json.dumps({"own_session": own_session, "access_lines_metrics": log.count('"GET /metrics'),
                          "access_lines_health": log.count('"GET /health'),
                          "access_lines_completions": log.count('"POST /v1/completions'),
                          "argv_has_flag": "--disable-access-log-for-endpoints" in spec.argv}), flush=True)
    finally:
        server.stop()
        server.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--concurrency", type=int, action="append", default=None)
    args = ap.parse_args()
    for _ in range(args.rounds):
        for own in (True, False):
            one(own, args.n, args.concurrency or [1, 4])
    return 0


if __name__ == "__main__":
    sys.exit(main())
