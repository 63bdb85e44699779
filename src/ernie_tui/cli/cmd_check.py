"""`ernie-tui check NAME`: preflight a preset in well under a second.

Exit status 1 when any problem is an error (vLLM would refuse to start),
0 otherwise (warnings allowed).
"""

from __future__ import annotations

import argparse
import json
import sys

from ernie_tui.cli.errors import CliError
from ernie_tui.cli.shared_options import shared_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check", parents=[shared_options(top_level=False)],
        help="preflight a preset: problems vLLM would hit, with fixes, and a capacity estimate",
        description="Check a preset against the model's config.json and the machine (or one described by "
                    "--platform/--gpus/--gpu-memory-gib) before launching vLLM. Exit 1 if vLLM would fail.")
    p.add_argument("name", help="preset name")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.add_argument("--platform", choices=["cuda", "cpu"], help="judge for this platform instead of detecting")
    p.add_argument("--gpus", type=int, metavar="N", help="number of visible GPUs to assume")
    p.add_argument("--gpu-memory-gib", type=float, metavar="G", help="memory per GPU to assume (GiB), all free")
    p.add_argument("--no-port", action="store_true", help="skip the port check (judging another machine)")
    p.set_defaults(run=_run)


def _run(args) -> int:
    from ernie_tui.engine_ctl.launch import describe_changes, detect_machine, run_preflight  # lazy: --help start-up
    from ernie_tui.engine_ctl.units import GiB
    from ernie_tui.presets import load_presets

    book = load_presets(args.presets)
    preset = book.get(args.name)
    env = None
    try:
        import os

        env = {**os.environ, **preset.env}
        machine = detect_machine(platform=args.platform, gpus=args.gpus, gpu_memory_gib=args.gpu_memory_gib,
                                 env=env)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    from ernie_tui.cli.model_choice import model_for  # lazy: --help start-up

    choice = model_for(preset, args.model)
    if choice.note:
        print(f"note: {choice.note}", file=sys.stderr)
    result = run_preflight(preset, choice.model, machine)
    if args.no_port:
        result.problems = [p for p in result.problems if p.kind.value != "port_in_use"]
        result.ok = not result.errors
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0 if result.ok else 1

    m = result.machine
    if m.platform == "cuda":
        mem = f", {m.gpu_total_bytes / GiB:.1f} GiB each" if m.gpu_total_bytes else ""
        where = f"cuda ({m.gpu_count} GPU{'s' if m.gpu_count != 1 else ''}{mem})"
    else:
        mem = (f", node {m.cpu_available_bytes / GiB:.2f}/{m.cpu_total_bytes / GiB:.2f} GiB free"
               if m.cpu_total_bytes else "")
        where = f"cpu{mem}"
    info = result.model_info
    print(f"preset {preset.name} on {where}" + (f"; model {info.path}" if info else ""))
    for p in result.problems:
        tag = "ERROR" if p.severity == "error" else "warn "
        print(f"  {tag} {p.kind.value}: {p.message}")
        if p.fix:
            print(f"        fix: {describe_changes(p.fix, set_word='')}")
    e = result.estimate
    if e is not None:
        print(f"estimate: weights {e.weights_gib:.2f} GiB, KV {e.kv_bytes_per_token:,} B/token, "
              f"KV cache {e.kv_cache_gib:.2f} GiB = {e.kv_cache_tokens:,} tokens, "
              f"max concurrency {e.max_concurrency:.2f}x at {e.max_model_len:,} ({e.source})")
        for n in e.notes:
            print(f"  note: {n}")
    print("ok" if result.ok else f"{len(result.errors)} error(s): vLLM would not start")
    return 0 if result.ok else 1
