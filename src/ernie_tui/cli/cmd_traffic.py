"""`ernie-tui traffic`: capture what a server serves into a traffic profile, and show one.

    ernie-tui traffic capture --url URL --window 5m [--log LLM.LOG] --out PROFILE.json
    ernie-tui traffic capture --url URL --since-start --out PROFILE.json
    ernie-tui traffic capture --trace REQUESTS.jsonl [--tokenizer PATH] --out PROFILE.json
    ernie-tui traffic capture --log LLM.LOG --out PROFILE.json
    ernie-tui traffic show PROFILE|chat|long-doc-qa|batch-summarise [--json]

A profile replays with `probe --burst/--capacity --traffic PROFILE`.
"""

from __future__ import annotations

import argparse
import os
import sys

from ernie_tui.cli.errors import CliError
from ernie_tui.cli.stdout import print_whole
from ernie_tui.cli.urls import server_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("traffic", help="capture a server's traffic into a profile, or show one",
                       description="Capture the shape of what a server serves (prompt and output lengths, "
                                   "max_tokens, early stops, arrival rate and burstiness, shared prefixes) "
                                   "into a small JSON profile, from its /metrics over a window, from vLLM's "
                                   "request log (--enable-log-requests), or from a JSONL trace; each part "
                                   "comes from the richest source given. Replay it with `ernie-tui probe "
                                   "--burst N --traffic PROFILE` or `--capacity --traffic PROFILE`.")
    tsub = p.add_subparsers(dest="traffic_cmd", metavar="{capture,show}")
    tsub.required = True
    c = tsub.add_parser("capture", help="capture a traffic profile",
                        description="Watch a server for --window (a /metrics scrape every --interval, and the "
                                    "request-log lines --log gains meanwhile), or read a --log or --trace "
                                    "after the fact, and write the profile to --out. No prompt text is kept "
                                    "unless --keep-text (the file is then private, 0600).")
    c.add_argument("--url", help="the server's base URL, e.g. http://127.0.0.1:8000 (its /metrics is watched)")
    c.add_argument("--window", default="5m", metavar="DURATION",
                   help="how long to watch the server: 90s, 5m, 1h (default 5m)")
    c.add_argument("--since-start", action="store_true",
                   help="with --url: all the server served since it started, from one scrape (vLLM's counters and "
                        "histograms run from its start), instead of watching a --window; the mean rate is then "
                        "over its whole uptime and the burstiness is not seen")
    c.add_argument("--interval", type=float, default=5.0, metavar="S",
                   help="seconds between /metrics scrapes inside the window (default 5): the rate per interval, "
                        "and from it the burstiness")
    c.add_argument("--log", metavar="PATH",
                   help="vLLM's log (llm.log) with --enable-log-requests: with --url, the lines it gains during "
                        "the window; without, the whole file")
    c.add_argument("--trace", metavar="FILE",
                   help="a JSONL trace: one OpenAI-style request a line with a \"timestamp\" (see docs/guide/"
                        "traffic.md)")
    c.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer.json or model dir to count a trace's prompts (default: its usage, else an "
                        "estimate)")
    c.add_argument("--name", help="the profile's name (default: the --out file's stem)")
    c.add_argument("--keep-text", action="store_true",
                   help="keep a trace's prompt text in the profile (written 0600)")
    c.add_argument("--out", required=True, metavar="PROFILE", help="the profile file to write (JSON)")
    c.add_argument("--api-key-env", default="VLLM_API_KEY", metavar="VAR",
                   help="environment variable holding the API key (default VLLM_API_KEY)")
    c.add_argument("--json", action="store_true", help="print the profile as JSON instead of a summary")
    c.set_defaults(run=_capture)
    s = tsub.add_parser("show", help="show a traffic profile (a file or a built-in shape)")
    s.add_argument("profile", metavar="PROFILE", help="a profile file, or chat, long-doc-qa, batch-summarise")
    s.add_argument("--json", action="store_true", help="print the profile as JSON")
    s.set_defaults(run=_show)


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '1h' -> seconds (> 0)."""
    t = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:], None)
    try:
        value = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        raise CliError(f"--window takes a duration like 90s, 5m or 1h, got {text!r}") from None
    if not value > 0:
        raise CliError(f"--window must be above 0, got {text!r}")
    return value


def _capture(args) -> int:
    import threading
    from pathlib import Path

    from ernie_tui import paths
    from ernie_tui.cli.interruptible import run_interruptible
    from ernie_tui.engine_ctl.load import (  # lazy: --help start-up
        MetricsError,
        ProbeFailure,
        TrafficError,
        build_profile,
        capture_live,
        find_tokenizer,
        format_profile,
        from_log_file,
        from_trace,
        read_trace,
        save_profile,
    )

    if args.since_start and not args.url:
        raise CliError("--since-start reads a server's /metrics: give --url")
    if not (args.url or args.log or args.trace):
        raise CliError("give a source: --url (with --window), --log or --trace")
    if args.url:
        args.url = server_url(args.url, "--url")
    try:
        out = paths.out_file(args.out)
    except paths.OutPathError as exc:
        raise CliError(f"--out {exc}") from None
    captures = []
    try:
        if args.trace:
            tok = None
            if args.tokenizer:
                try:
                    tok = find_tokenizer(tokenizer_path=args.tokenizer)
                except ProbeFailure as exc:
                    raise CliError(str(exc)) from exc
            captures.append(from_trace(read_trace(args.trace), tok, keep_text=args.keep_text))
        if args.url and args.since_start:
            captures.append(_since_start(args.url, os.environ.get(args.api_key_env) or None))
            if args.log:
                captures.append(from_log_file(args.log))
        elif args.url:
            window = parse_duration(args.window)
            print(f"watching {args.url} for {window:.0f} s (Ctrl-C ends the window early) ...", file=sys.stderr)
            cancel = threading.Event()
            captures.extend(run_interruptible(
                lambda: capture_live(args.url, window, interval_s=args.interval, log_path=args.log,
                                     api_key=os.environ.get(args.api_key_env) or None, cancel=cancel),
                cancel, name="capture", on_interrupt="ending the window now ..."))
        elif args.log:
            captures.append(from_log_file(args.log))
        profile = build_profile(args.name or Path(args.out).stem, captures, url=args.url,
                                keep_text=args.keep_text)
        save_profile(profile, out)
    except TrafficError as exc:
        raise CliError(str(exc)) from exc
    except MetricsError as exc:
        raise CliError(f"cannot read {args.url}/metrics: {exc}") from exc
    if args.json:
        print_whole(profile.to_json())
    else:
        print_whole(format_profile(profile))
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _since_start(url: str, api_key: str | None):
    """What /metrics says of all the server served since it started (one scrape)."""
    from ernie_tui.engine_ctl.load import MetricsClient, from_metrics, since_start  # lazy: --help start-up

    with MetricsClient(url, api_key, timeout=10.0) as client:
        now = client.fetch()
    start = since_start(now)
    if start is None:
        raise CliError(f"{url}/metrics does not say when the server started (no _created samples, no "
                       "process_start_time_seconds): watch a --window instead")
    cap = from_metrics(start, now)
    cap.notes.append("/metrics: all the server served since it started; the mean rate is over its whole uptime, "
                     "idle hours included")
    return cap


def _show(args) -> int:
    from ernie_tui.engine_ctl.load import TrafficError, format_profile, load_profile  # lazy: --help start-up

    try:
        profile = load_profile(args.profile)
    except TrafficError as exc:
        raise CliError(str(exc)) from exc
    print_whole(profile.to_json() if args.json else format_profile(profile))
    return 0
