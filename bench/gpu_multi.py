"""Multi-GPU presets on one node, end to end (issue #12): data parallelism
and TP through Ray serve, the fleet view sees every engine, the startup
report lists every rank, NVML's per-GPU memory matches nvidia-smi.

    python bench/gpu_multi.py dp2 tp2-ray --model DIR [--burst 64 --concurrency 16] [--json FILE]
    python bench/gpu_multi.py dp2 --stand-in --burst 4 --concurrency 2   # CPU smoke test

For each preset in turn: launch it (the real EngineServer), wait for ready
printing the startup phases, print the report's ranks and KV-cache tokens;
run a burst while a FleetPoller polls the server every ~2 s and prints its
rows (the server's, and one per engine of a data-parallel server); print the
burst's figures; compare NVML's used memory per GPU with nvidia-smi's; stop
the server (always: errors and Ctrl-C included) and check no engine process
is left. One verdict line per preset; everything goes to --json.

--stand-in launches tests/tui_fake_vllm.py instead of vLLM (a real process
with vLLM's log, /metrics with `engine` labels for data parallelism, and
streamed completions): no GPUs, so the memory comparison is skipped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE_VLLM = ROOT / "tests" / "tui_fake_vllm.py"
FAKE_FIXTURES = ROOT / "tests" / "fixtures" / "vllm-logs" / "cpu-vllm0.32.0"
FLEET_INTERVAL_S = 2.0
# NVML and nvidia-smi are read a moment apart; an idle engine's memory moves
# less than this between the two reads.
MEMORY_TOLERANCE_MIB = 64.0


def nvidia_smi_used_mib(timeout: float = 10.0) -> dict[int, float] | None:
    """index -> used MiB as nvidia-smi prints it; None without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = {}
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                used[int(parts[0])] = float(parts[1])
            except ValueError:
                pass
    return used or None


def compare_memory(samples: int = 3) -> dict:
    """NVML's used MiB per GPU against nvidia-smi's, read back to back a few
    times; the largest difference over GPUs and reads."""
    from ernie_tui.engine_ctl.control import ResourceSampler

    sampler = ResourceSampler()
    try:
        if not sampler.nvml:
            return {"skipped": f"no NVML ({sampler.reason})"}
        if shutil.which("nvidia-smi") is None:
            return {"skipped": "no nvidia-smi"}
        reads = []
        for _ in range(samples):
            nvml = {g.index: g.used_bytes / 2**20 for g in sampler.sample().gpus}
            smi = nvidia_smi_used_mib() or {}
            reads.append({"nvml_mib": nvml, "smi_mib": smi,
                          "diff_mib": {i: abs(nvml[i] - smi[i]) for i in nvml if i in smi}})
            time.sleep(0.5)
        diffs = [d for r in reads for d in r["diff_mib"].values()]
        return {"reads": reads, "max_diff_mib": max(diffs) if diffs else None}
    finally:
        sampler.close()


def load_preset(name: str, args):
    from ernie_tui.engine_ctl.launch import next_free_port, port_is_free
    from ernie_tui.presets.loader import load_presets

    book = load_presets(extra_files=[args.presets] if args.presets else (), include_user=False)
    preset = book.get(name)
    if args.stand_in:
        engine_args = dict(preset.engine_args)
        if (engine_args.get("block_size") or 16) % 32:
            engine_args["block_size"] = 32  # the stand-in fails other sizes as vLLM CPU does
        preset = replace(preset, launcher=[sys.executable, str(FAKE_VLLM)], engine_args=engine_args,
                         env={**preset.env, "ERNIE_FAKE_FIXTURES": str(FAKE_FIXTURES), "ERNIE_FAKE_DELAY": "0.05"})
    if not port_is_free(preset.host, preset.port)[0]:
        port = next_free_port(preset.host, preset.port)
        if port is None:
            raise RuntimeError(f"no free port after {preset.port}")
        preset = replace(preset, port=port)
    return preset


def expected_engines(preset) -> int:
    return int(preset.get("data_parallel_size_local") or preset.get("data_parallel_size") or 1)


def expected_ranks(preset) -> int:
    tp = int(preset.get("tensor_parallel_size") or 1)
    pp = int(preset.get("pipeline_parallel_size") or 1)
    return expected_engines(preset) * tp * pp


def fmt(v, spec=".1f", scale=1.0) -> str:
    return "-" if v is None else format(v * scale, spec)


def row_line(r) -> str:
    who = f"  engine {r.engine}" if r.engine is not None else f"{r.server} ({r.engines} engine(s))"
    return (f"    {who:<28} {r.state:<5} KV {fmt(r.kv_pct)}%  run/wait {fmt(r.running, '.0f')}/"
            f"{fmt(r.waiting, '.0f')}  out {fmt(r.gen_tps)} tok/s  TTFT p99 {fmt(r.ttft_p99_s, '.0f', 1e3)} ms  "
            f"ITL p99 {fmt(r.itl_p99_s, '.1f', 1e3)} ms")


def run_preset(name: str, args, cancel: threading.Event, log_dir: Path) -> dict:
    from ernie_tui.engine_ctl.control import EngineServer, FleetPoller, ServerState, servers_from_urls
    from ernie_tui.engine_ctl.load import BurstConfig, run_burst

    res: dict = {"preset": name, "ok": False, "error": None, "phases": [], "ranks": [], "fleet": [],
                 "engines_seen": [], "burst": None, "memory": None, "left_processes": []}
    preset = load_preset(name, args)
    model = preset.resolve_model(args.model)
    spec = preset.launch_spec(model)
    res.update(url=spec.url, key_args=preset.key_args(), expected_engines=expected_engines(preset),
               expected_ranks=expected_ranks(preset))
    print(f"== {name}: {preset.key_args()} on {spec.url}", flush=True)
    server = EngineServer(spec, preset_name=name, log_path=log_dir / f"{name}.log")
    pids: list[int] = []
    t0 = time.monotonic()
    try:
        server.start()
        deadline = t0 + args.ready_timeout
        st, phase = server.status, None
        while time.monotonic() < deadline and not cancel.is_set():
            st = server.wait_ready(min(1.0, max(0.0, deadline - time.monotonic())))
            if st.phase and st.phase != phase:
                phase = st.phase
                res["phases"].append([round(time.monotonic() - t0, 1), phase])
                print(f"  {time.monotonic() - t0:6.1f} s  {phase}", flush=True)
            if st.state != ServerState.STARTING:
                break
        res["ready_s"] = round(time.monotonic() - t0, 1)
        if st.state != ServerState.READY:
            err = st.error
            res["error"] = f"not ready: {err.kind.value}: {err.message}" if err else \
                f"not ready after {args.ready_timeout:.0f} s ({st.state.value})"
            print(f"  {res['error']}", flush=True)
            return res
        pids = list(server.engine_pids())
        report = server.report
        res["ranks"] = [asdict(r) for r in report.ranks]
        res["kv_cache_tokens"] = report.kv_cache_tokens
        print(f"  ready in {res['ready_s']} s; KV cache {report.kv_cache_tokens} tokens; "
              f"{len(report.ranks)} rank(s):", flush=True)
        for r in report.ranks:
            print(f"    {r.name:<24} pid {r.pid:<8} KV tokens {r.kv_cache_tokens}  "
                  f"weights {fmt(r.weights_gib, '.2f')} GiB  KV {fmt(r.kv_cache_gib, '.2f')} GiB", flush=True)
        res["burst"] = burst_under_fleet(spec, preset, model, args, cancel, res, run_burst, BurstConfig,
                                         FleetPoller, servers_from_urls)
        res["memory"] = compare_memory()
        mem = res["memory"]
        print(f"  memory: {mem.get('skipped') or 'NVML vs nvidia-smi max diff ' + fmt(mem['max_diff_mib']) + ' MiB'}",
              flush=True)
        return res
    except Exception as exc:  # noqa: BLE001 - recorded, and the next preset still runs
        res["error"] = f"{exc.__class__.__name__}: {exc}"
        print(f"  error: {res['error']}", flush=True)
        return res
    finally:
        pids = sorted(set(pids) | set(server.engine_pids()))
        t_stop = time.monotonic()
        try:
            server.stop()
        finally:
            server.close()
        res["stop_s"] = round(time.monotonic() - t_stop, 1)
        res["left_processes"] = left_alive(pids)
        print(f"  stopped in {res['stop_s']} s; engine processes left: {res['left_processes'] or 'none'}",
              flush=True)
        res["verdict"], res["ok"] = verdict(res, args)
        print(res["verdict"], flush=True)


def burst_under_fleet(spec, preset, model, args, cancel, res, run_burst, BurstConfig, FleetPoller,
                      servers_from_urls) -> dict:
    """The burst on a thread; meanwhile the fleet poller's rows every ~2 s."""
    config = BurstConfig(n=args.burst, concurrency=args.concurrency, max_tokens=args.max_tokens,
                         read_timeout_s=args.request_timeout, request_timeout_s=args.request_timeout)
    # A model dir without tokenizer.json (the stand-in's): the server's /tokenize.
    model_dir = model if (Path(model) / "tokenizer.json").is_file() else None
    out: dict = {}

    def burst() -> None:
        try:
            out["result"] = run_burst(spec.url, config, model=spec.served_model_name, model_dir=model_dir,
                                      api_key=preset.api_key(), cancel=cancel)
        except Exception as exc:  # noqa: BLE001 - the burst thread reports, never dies silently
            out["error"] = f"{exc.__class__.__name__}: {exc}"

    poller = FleetPoller(servers_from_urls([spec.url]), interval=FLEET_INTERVAL_S)
    engines: set[str] = set()
    thread = threading.Thread(target=burst, daemon=True, name="burst")
    thread.start()
    deadline = time.monotonic() + args.burst_timeout
    try:
        while True:
            rows = poller.poll_once()
            t = round(time.monotonic(), 1)
            res["fleet"].append([{"t": t, **asdict(r)} for r in rows])
            engines |= {r.engine for r in rows if r.engine is not None}
            print(f"  fleet @ {time.strftime('%H:%M:%S')}", flush=True)
            for r in rows:
                print(row_line(r), flush=True)
            if not thread.is_alive():
                break
            if time.monotonic() > deadline:
                cancel.set()
                out.setdefault("error", f"burst still running after {args.burst_timeout:.0f} s: cancelled")
                break
            thread.join(FLEET_INTERVAL_S)
    finally:
        poller.close()
    thread.join(30)
    res["engines_seen"] = sorted(engines, key=lambda e: (len(e), e))
    r = out.get("result")
    if r is None:
        print(f"  burst: {out.get('error', 'no result')}", flush=True)
        return {"error": out.get("error", "no result")}
    summary = {"total": r.total, "completed": r.completed, "failed": r.failed, "output_tps": r.output_tps,
               "ttft_p50_ms": None if r.ttft.get("p50") is None else r.ttft["p50"] * 1e3,
               "ttft_p99_ms": None if r.ttft.get("p99") is None else r.ttft["p99"] * 1e3,
               "duration_s": r.duration_s, "errors": r.errors, "error": out.get("error")}
    print(f"  burst: {r.completed}/{r.total} ok, output {fmt(r.output_tps)} tok/s, TTFT p50 "
          f"{fmt(summary['ttft_p50_ms'], '.0f')} ms p99 {fmt(summary['ttft_p99_ms'], '.0f')} ms", flush=True)
    return summary


def left_alive(pids: list[int]) -> list[int]:
    import psutil

    left = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.Error:
            pass
    return left


def verdict(res: dict, args) -> tuple[str, bool]:
    """One line: what was seen, and PASS only when every check held."""
    problems = []
    if res.get("error"):
        problems.append(res["error"])
    ranks = res["ranks"]
    if not args.stand_in and len(ranks) < res["expected_ranks"]:
        problems.append(f"{len(ranks)} rank(s) in the report, expected {res['expected_ranks']}")
    want = res["expected_engines"]
    engines = res["engines_seen"]
    if want > 1 and len(engines) != want:
        problems.append(f"fleet rows for {len(engines)} engine(s), expected {want}")
    b = res.get("burst") or {}
    burst_ok = bool(b) and not b.get("error") and b.get("completed") == b.get("total")
    if not burst_ok and not res.get("error"):
        problems.append(f"burst {b.get('completed')}/{b.get('total')}: {b.get('error') or b.get('errors')}")
    mem = res.get("memory") or {}
    diff = mem.get("max_diff_mib")
    if diff is not None and diff > MEMORY_TOLERANCE_MIB:
        problems.append(f"NVML vs nvidia-smi differ by {diff:.0f} MiB")
    if res["left_processes"]:
        problems.append(f"engine processes left: {res['left_processes']}")
    memory = f"{diff:.1f} MiB" if diff is not None else (mem.get("skipped") or "not measured")
    line = (f"VERDICT {res['preset']}: {'PASS' if not problems else 'FAIL'} | ranks {len(ranks)} "
            f"[{', '.join(r['name'] for r in ranks)}] | fleet engines {len(engines)} [{', '.join(engines)}] | "
            f"burst {'ok' if burst_ok else 'failed'} {b.get('completed')}/{b.get('total')} | memory diff {memory}")
    if problems:
        line += " | " + "; ".join(problems)
    return line, not problems


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("presets_to_run", nargs="+", metavar="PRESET", help="e.g. dp2 tp2-ray")
    ap.add_argument("--model", help="model dir (the stand-in needs none)")
    ap.add_argument("--presets", metavar="FILE", help="an extra presets TOML")
    ap.add_argument("--ready-timeout", type=float, default=400.0, help="seconds to wait for ready (400)")
    ap.add_argument("--burst", type=int, default=64, metavar="N", help="requests in the burst (64)")
    ap.add_argument("--concurrency", type=int, default=16, metavar="C", help="requests at once (16)")
    ap.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (128)")
    ap.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request (120)")
    ap.add_argument("--burst-timeout", type=float, default=300.0, help="seconds for the whole burst (300)")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    ap.add_argument("--stand-in", action="store_true",
                    help="launch tests/tui_fake_vllm.py instead of vLLM (CPU smoke test; no memory comparison)")
    args = ap.parse_args(argv)
    if not args.model and not args.stand_in:
        ap.error("--model DIR is needed (or --stand-in)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cancel = threading.Event()
    log_dir = Path(tempfile.mkdtemp(prefix="ernie-gpu-multi-"))
    if args.stand_in and not args.model:
        args.model = str(log_dir / "stand-in-model")
        Path(args.model).mkdir()
    results = []
    try:
        for name in args.presets_to_run:
            results.append(run_preset(name, args, cancel, log_dir))
    except KeyboardInterrupt:
        cancel.set()  # run_preset's finally has stopped the server
        print("interrupted", file=sys.stderr)
    print("\n".join(r.get("verdict", f"VERDICT {r['preset']}: none") for r in results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"stand_in": args.stand_in, "model": args.model, "logs": str(log_dir),
                                               "presets": results}, indent=2, default=str))
    return 0 if results and all(r["ok"] for r in results) and len(results) == len(args.presets_to_run) else 1


if __name__ == "__main__":
    sys.exit(main())
