"""Run the real dashboard in control mode on a GPU box and compare its GPU
memory chart with nvidia-smi, side by side, at the same moments.

    python bench/gpu_dashboard.py --model DIR [--preset seed-A] [--seconds 20] [--out DIR]

The app runs headless (Textual's test driver, 120x40) with the real
EngineServer, NVML sampler and /metrics client; nothing is simulated. It
waits until the server is ready, then every 2 s reads the value the GPU chart
holds and what `nvidia-smi --query-gpu=memory.used` says, prints both, saves
an SVG screenshot of the screen, quits stopping the server, and checks that
no engine process is left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def nvidia_smi_used_mib() -> list[float] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    out = subprocess.run([exe, "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10)
    return [float(line.split(",")[0]) for line in out.stdout.strip().splitlines() if line.strip()]


async def run(args) -> dict:
    from ernie_tui.tui.app import make_app

    app = make_app(mode="control", preset=args.preset, model=args.model, start=True, on_exit="stop",
                   include_user_presets=False)
    rows = []
    t0 = time.monotonic()
    try:
        return await _drive(app, args, rows, t0)
    finally:
        # Whatever happened, leave no engine behind.
        if app.server is not None and app.server.status.running:
            app.server.stop()


async def _drive(app, args, rows, t0) -> dict:
    async with app.run_test(size=(120, 40)) as pilot:
        while time.monotonic() - t0 < args.ready_timeout:
            await pilot.pause(0.5)
            st = app.status
            if st is not None and st.state.value in ("ready", "crashed"):
                break
        st = app.status
        print(f"state {st.state.value if st else None} after {time.monotonic() - t0:.1f} s", flush=True)
        if st is None or st.state.value != "ready":
            raise SystemExit(f"server did not become ready: {st}")
        load = None
        if args.accuracy_out:
            Path(args.accuracy_out).parent.mkdir(parents=True, exist_ok=True)
            # Put the server under load while the dashboard watches: ernie-tui's
            # burst against vLLM's own counters and vLLM's own bench client.
            load = await asyncio.create_subprocess_exec(
                sys.executable, str(Path(__file__).with_name("probe_accuracy.py")), "--url", st.url,
                "--model-dir", args.model, "--repeat", str(args.accuracy_repeat), "--json", args.accuracy_out,
                stdout=open(Path(args.accuracy_out).with_suffix(".log"), "w"), stderr=subprocess.STDOUT)
        end = time.monotonic() + args.seconds
        shot = False
        while time.monotonic() < end or (load is not None and load.returncode is None):
            await pilot.pause(2.0)
            if load is not None and not shot and app._last_series and app._last_series.points \
                    and (app._last_series.points[-1].gen_tps or 0) > 0 and args.out:
                app.save_screenshot(filename="dashboard_load.svg", path=args.out)
                shot = True
            series = app._last_series
            chart = list(series.points[-1].mem_gib) if series and series.points else None
            smi = nvidia_smi_used_mib()
            last = series.points[-1] if series and series.points else None
            row = {"t": round(time.monotonic() - t0, 1), "chart_gib": chart,
                   "chart_gen_tps": getattr(last, "gen_tps", None), "chart_kv_pct": getattr(last, "kv_pct", None),
                   "nvidia_smi_gib": [m / 1024 for m in smi] if smi else None,
                   "label": series.memory_label if series else None,
                   "totals_gib": list(series.gpu_totals) if series else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
        report = app.report
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            app.save_screenshot(filename="dashboard.svg", path=args.out)
        pids = list(app.server.engine_pids()) if app.server else []
        await pilot.press("q")
        await pilot.pause(0.5)
        await pilot.press("s")  # the quit dialog: stop the server
        for _ in range(120):
            await pilot.pause(0.5)
            if app.server is None or not app.server.status.running:
                break
    import psutil

    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return {"rows": rows, "engine_pids": pids, "left_after_quit": left,
            "kv_cache_tokens": getattr(report, "kv_cache_tokens", None) if report else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--preset", default="seed-A")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--ready-timeout", type=float, default=400.0)
    ap.add_argument("--out", help="folder for dashboard.svg and dashboard.json")
    ap.add_argument("--accuracy-out", metavar="FILE",
                    help="once ready, run bench/probe_accuracy.py against the server; its JSON goes here")
    ap.add_argument("--accuracy-repeat", type=int, default=2)
    args = ap.parse_args()
    result = asyncio.run(run(args))
    diffs = [abs(r["chart_gib"][0] - r["nvidia_smi_gib"][0]) for r in result["rows"]
             if r["chart_gib"] and r["nvidia_smi_gib"]]
    if diffs:
        print(f"chart vs nvidia-smi: max difference {max(diffs):.3f} GiB over {len(diffs)} samples")
    print(f"engine processes left after quit: {result['left_after_quit'] or 'none'}")
    if args.out:
        (Path(args.out) / "dashboard.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
