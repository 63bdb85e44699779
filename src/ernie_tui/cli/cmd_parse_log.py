"""`ernie-tui parse-log FILE [--json]`: the startup report of a captured vLLM log."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ernie_tui.cli.errors import CliError
from ernie_tui.cli.stdout import print_whole


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parse-log", help="read a vLLM server log and print its startup report",
                       description="Parse a vLLM server log (llm.log: stdout+stderr) and print what it says: "
                                   "version, platform, KV cache size, startup phases, readiness, and the root "
                                   "cause of a failure.")
    p.add_argument("file", metavar="FILE", help="the log file")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON: `state` is the log's last word (starting, ready, stopped, "
                        "failed); `ready` is true only while it serves, `was_ready` if it ever did")
    p.add_argument("--all-stats", action="store_true",
                   help="with --json: include every periodic stats sample (default: the last one)")
    p.set_defaults(run=_run)


def _run(args) -> int:
    from ernie_tui.engine_ctl.logs import parse_file  # lazy: --help start-up

    try:
        report = parse_file(args.file)
    except FileNotFoundError:
        raise CliError(f"{args.file}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{args.file}: is a directory, not a log file") from None
    except OSError as exc:
        raise CliError(f"{args.file}: cannot read: {exc.strerror or exc}") from None
    if report.lines == 0:
        raise CliError(f"{args.file}: empty (0 lines): no log to report on; vLLM writes its log there as it starts")
    if args.json:
        # allow_nan=False: the parser drops figures no machine has, so the
        # output is strict JSON (never Infinity or NaN).
        print_whole(json.dumps(report.to_dict(include_stats=args.all_stats), indent=2, default=str, allow_nan=False))
    else:
        print(format_report(report, args.file))
    return 0


def _num(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = f"{value:,.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:,.0f}"
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = str(value)
    return f"{text} {unit}".rstrip()


def format_report(report, source: str = "") -> str:
    """A plain-text report for a terminal (no colours: it is also pasted into issues)."""
    r = report
    title = f"vLLM {r.vllm_version or '?'}" + (f" on {r.platform}" if r.platform else "")
    out = [f"{source}: {title}, {r.lines:,} lines" if source else f"{title}, {r.lines:,} lines"]
    out += _state_lines(r)
    out += _startup_lines(r)
    out += _process_lines(r)
    out += _serving_lines(r)
    out += _parser_error_lines(r)
    return "\n".join(out)


def _state_lines(r) -> list[str]:
    """Failed (with its root cause), stopped, ready, or not ready yet."""
    if r.error is not None:
        e = r.error
        where = f" (line {e.line_no})" if e.line_no else ""
        out = [f"  state           FAILED: {e.kind.value}{where}", f"  root cause      {e.message}"]
        if e.estimated_max_model_len is not None:
            out.append(f"  vLLM estimate   max model len {e.estimated_max_model_len:,} would fit")
        out += [f"    {key:<14}{value}" for key, value in e.detail.items() if key != "arguments"]
        return out
    if r.shutdown_line is not None:
        how = "shut down cleanly" if r.shutdown_complete else "shutdown began"
        was = f"after serving at {r.server_url}" if r.ready and r.server_url else (
            "after it was ready" if r.ready else f"before it was ready (last phase: {r.phase or 'none'})")
        end = "" if r.shutdown_complete else "; the log ends before it finished"
        return [f"  state           STOPPED: {how} at line {r.shutdown_line:,} {was}{end}"]
    if r.ready:
        return [f"  state           READY{' at ' + r.server_url if r.server_url else ''}"]
    return [f"  state           not ready (last phase: {r.phase or 'none'})"]


def _startup_lines(r) -> list[str]:
    """What vLLM logged while starting: the model, its memory, each phase's time."""
    from ernie_tui.engine_ctl.logs import PHASES  # lazy: --help start-up

    model = r.model or "-"
    if r.architecture:
        model += f"  ({r.architecture})"
    implied = " (implied: vLLM's CPU build logs no backend line)" if r.attention_implied else ""
    out = [f"  model           {model}",
           f"  block size      {_num(r.block_size)}        max model len  {_num(r.max_model_len)}",
           f"  attention       {r.attention_backend or '-'}{implied}",
           f"  weights         {_num(r.weights_gib, 'GiB')}, loaded in {_num(r.weights_load_seconds, 's')}",
           f"  torch.compile   {_num(r.compile_seconds, 's')}",
           f"  KV cache        {_num(r.kv_cache_gib, 'GiB', 4 if (r.kv_cache_gib or 1) < 0.1 else 2)}"
           f" = {_num(r.kv_cache_tokens, 'tokens')}, max concurrency "
           f"{_num(r.max_concurrency) + ('x' if r.max_concurrency is not None else '')}"]
    if r.cuda_graph_seconds is not None or r.platform == "cuda":
        out.append(f"  CUDA graphs     {_num(r.cuda_graph_seconds, 's')}, {_num(r.cuda_graph_gib, 'GiB')}")
    out.append(f"  init engine     {_num(r.init_engine_seconds, 's')}")
    phases = "  ".join(f"{p} {_num(r.phases[p], 's')}" for p in PHASES if p in r.phases)
    out.append(f"  phases          {phases or '-'}")
    return out


def _process_lines(r) -> list[str]:
    """The server's pids, and a parallel server's every rank with its own figures."""
    from ernie_tui.engine_ctl.logs import parallel_ranks  # lazy: --help start-up

    out = []
    if r.pids:
        out.append("  pids            " + "  ".join(f"{role}={pid}" for role, pid in r.pids.items()))
    if parallel_ranks(r.ranks):
        from ernie_tui.engine_ctl.logs import describe_rank  # lazy: --help start-up

        out += [f"  {'ranks' if i == 0 else '':<16}{describe_rank(rank)}" for i, rank in enumerate(r.ranks)]
    return out


def _serving_lines(r) -> list[str]:
    """The non-default args, the last periodic stats, and the parser's notes."""
    out = []
    if r.non_default_args:
        args = ", ".join(f"{k}={v!r}" for k, v in r.non_default_args.items())
        out.append(f"  non-default     {args}")
    if r.stats:
        s = r.stats[-1]
        hit = f", prefix hit {s.prefix_hit_pct:.1f}%" if s.prefix_hit_pct is not None else ""
        out.append(f"  last stats      {s.timestamp or '?'}: prompt {s.prompt_tps:,.1f} tok/s, generation "
                   f"{s.generation_tps:,.1f} tok/s, running {s.running}, waiting {s.waiting}, "
                   f"KV {s.kv_usage_pct:.1f}%{hit}  ({len(r.stats)} samples)")
    out += [f"  note            {note}" for note in r.notes]
    return out


def _parser_error_lines(r) -> list[str]:
    """The parser's own bug: said, never only counted."""
    from ernie_tui.engine_ctl.logs import parser_error_notice  # lazy: --help start-up

    notice = parser_error_notice(r)
    if not notice:
        return []
    return [f"  PARSER ERROR    {notice}"] + [f"                  {err}" for err in r.parser_errors[1:]]
