"""`ernie-tui probe`: one streaming prompt, or a load burst, against a server.

    ernie-tui probe --url URL [--prompt TEXT | --ready short|chinese|long]
    ernie-tui probe --url URL --burst N [--concurrency C --min-tokens A
                    --max-tokens-in B --max-tokens M --min-output-tokens A] [--json]
    ernie-tui probe --url URL --burst N --rate R [--arrivals poisson|constant]
    ernie-tui probe --url URL --capacity --slo ttft_p99=500ms [--slo ...]
                    [--workload FILE.jsonl] [--json]

The API key is read from an environment variable named by --api-key-env
(default VLLM_API_KEY), never from the command line, where `ps` and shell
history would show it. Bursts and capacity searches are stored as run records (see runstore).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ernie_tui.cli.capacity_args import RATE_SEARCH, add_capacity_args
from ernie_tui.cli.cmd_report import check_out, write_from_refs
from ernie_tui.cli.errors import CliError
from ernie_tui.cli.interruptible import run_interruptible
from ernie_tui.cli.stdout import print_whole
from ernie_tui.cli.traffic_args import add_traffic_args, traffic_fields
from ernie_tui.cli.urls import server_url
from ernie_tui.engine_ctl.load import DEFAULT_TEMPERATURE, DEFAULT_TOP_P, LOAD_SAMPLE_INTERVAL_S


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe", help="stream one prompt, run a load burst, or find the capacity under an SLO",
        description="Send one streaming prompt and show TTFT, inter-token latency, tok/s and the server's "
                    "token usage; or, with --burst N, send N prompts of exact token lengths at a given "
                    "concurrency and show throughput and latency percentiles beside vLLM's own figures "
                    "from /metrics (with --rate R sent instead on a Poisson or constant schedule of R requests "
                    "a second whether or not earlier ones have finished, late sends counted); or, with "
                    "--capacity, find the highest concurrency (with --rate: request rate) whose requests meet "
                    "the --slo objectives, with the goodput there and the curve of every level measured. "
                    "Bursts and searches are saved as run records. Ctrl-C, SIGTERM or SIGHUP ends a search, "
                    "winding its running level down and keeping the levels measured (exit status 130).")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--prompt", metavar="TEXT", help="the prompt to send (default: a short English question)")
    what.add_argument("--ready", choices=["short", "chinese", "long"],
                      help="a ready-made prompt: short English, the articles' Chinese question, or an "
                           "exactly 1,500-token prompt built with the served model's tokenizer")
    what.add_argument("--burst", type=int, metavar="N", help="run a load burst of N requests instead")
    what.add_argument("--capacity", action="store_true",
                      help="search the capacity under the --slo objectives (see the capacity options below)")
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions (default: /v1/completions)")
    p.add_argument("--model", dest="probe_model", metavar="NAME",
                   help="served model name (default: the first one /v1/models lists)")
    p.add_argument("--max-tokens", type=int, metavar="M",
                   help="tokens to generate (default 512 for a probe, 128 per burst request)")
    p.add_argument("--temperature", type=float, default=None,
                   help="default 0.7 for a single probe; a burst and a capacity search send none unless given "
                        "(the server's default, as vLLM's bench client)")
    p.add_argument("--top-p", type=float, default=None,
                   help="default 0.9 for a single probe; a burst and a capacity search send none unless given "
                        "(a top_p below 1 makes vLLM sort the vocabulary at every step: a heavier load)")
    p.add_argument("--stop-token-ids", metavar="IDS", help="comma-separated token ids that end generation")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds without data before a request fails (default 60 probe, 120 burst)")
    p.add_argument("--api-key-env", default="VLLM_API_KEY", metavar="VAR",
                   help="environment variable holding the API key (default VLLM_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    b = p.add_argument_group("burst")
    b.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="requests in flight (default 4); with --rate, a cap on them (default: none)")
    # --rate R and --arrivals are declared once, with the capacity options (capacity_args):
    # --burst N --rate R is an open-loop burst, --capacity --rate an open-loop search.
    b.add_argument("--arrival-seed", type=int, default=0, metavar="N",
                   help="seed of the arrival times (default 0); the same seed as vLLM's bench client --seed "
                        "gives its arrival times")
    b.add_argument("--metrics-interval", type=float, default=LOAD_SAMPLE_INTERVAL_S, metavar="S",
                   help="seconds between the /metrics samples taken while a burst runs (KV-cache and queue "
                        f"peaks; default {LOAD_SAMPLE_INTERVAL_S:g}). vLLM's API server renders each one, in the "
                        "process that also streams every token: 4 a second showed in the tokens' timing "
                        "(docs/lab/load-generator.md)")
    b.add_argument("--min-output-tokens", type=int, metavar="A",
                   help="draw each request's max_tokens uniformly from A..--max-tokens (from --seed), as "
                        "vLLM's bench client --random-range-ratio does (a capacity search's built prompts too); "
                        "default: all --max-tokens")
    b.add_argument("--min-tokens", type=int, default=30, metavar="A", help="shortest prompt in tokens (default 30)")
    b.add_argument("--max-tokens-in", type=int, default=300, metavar="B",
                   help="longest prompt in tokens (default 300)")
    b.add_argument("--seed", type=int, default=0,
                   help="seed for the prompt and output lengths (default 0); with vLLM's bench client's ranges, "
                        "its --seed of the same value draws the same lengths in the same order")
    b.add_argument("--word-seed", type=int, metavar="N",
                   help="seed for the prompts' words; default: new words every run, so a run repeated on the "
                        "same server is not served from vLLM's prefix cache (set it to resend the same prompts)")
    b.add_argument("--no-ignore-eos", action="store_true",
                   help="let requests stop at EOS (default: ignore_eos, so every request does the same work)")
    b.add_argument("--tokenizer", metavar="PATH",
                   help="tokenizer.json or model dir (default: the server's model dir, else its /tokenize)")
    b.add_argument("--preset", dest="probe_preset", metavar="NAME",
                   help="tag the run record with this preset (its engine args are recorded)")
    b.add_argument("--no-save", action="store_true", help="do not store a run record")
    add_traffic_args(b)
    p.add_argument("--report", metavar="FILE", action="append", default=[],
                   help="with --capacity: at the end, draw the search into FILE.html (self-contained), FILE.png "
                        "or FILE.svg, as `ernie-tui report` does (may repeat; needs ernie-tui[report])")
    add_capacity_args(p)
    p.set_defaults(run=_run)


def _stop_ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise CliError(f"--stop-token-ids takes comma-separated integers, got {text!r}") from exc


def _api_key(var: str) -> str | None:
    return os.environ.get(var) or None


def _run(args) -> int:
    args.url = server_url(args.url, "--url")
    if args.report:
        if not args.capacity:
            raise CliError("--report belongs to --capacity (for a burst: ernie-tui report RUN --out FILE)")
        if args.no_save:
            raise CliError("--report draws the run record: drop --no-save")
        check_out(args.report, "--report")
    if args.burst is None and not args.capacity:
        # A single probe keeps the articles' sampling settings (Chainlit's); a
        # burst and a capacity search send the server's defaults unless given,
        # as vLLM's bench client does, so they load the server as it does.
        if args.temperature is None:
            args.temperature = DEFAULT_TEMPERATURE
        if args.top_p is None:
            args.top_p = DEFAULT_TOP_P
    if args.capacity:
        return _run_capacity(args)
    if args.rate is not None and args.burst is None:
        raise CliError("--rate belongs to --burst (--burst N --rate R) or to --capacity (a search over rates)")
    if args.rate == RATE_SEARCH:
        raise CliError("--burst N --rate needs a rate: --rate R, in requests a second")
    if args.slo or args.workload:
        raise CliError("--slo and --workload belong to --capacity")
    if args.burst is not None:
        return _run_burst(args)
    if args.traffic:
        raise CliError("--traffic belongs to --burst or --capacity")
    return _run_probe(args)


def _run_probe(args) -> int:
    from ernie_tui.engine_ctl.load import (  # lazy: --help start-up
        DEFAULT_MAX_TOKENS,
        DEFAULT_READ_TIMEOUT_S,
        SHORT_PROMPT,
        ProbeFailure,
        ProbeRequest,
        find_tokenizer,
        format_probe,
        probe_error_lines,
        ready_prompt,
        run_probe,
    )

    api_key = _api_key(args.api_key_env)
    if args.ready == "long":
        try:
            tok = find_tokenizer(tokenizer_path=args.tokenizer, url=args.url, model=args.probe_model,
                                   api_key=api_key)
        except ProbeFailure as exc:
            raise CliError(f"cannot build the long prompt: {exc}") from exc
        prompt = ready_prompt("long", tok)
    elif args.ready:
        prompt = ready_prompt(args.ready)
    else:
        prompt = args.prompt if args.prompt is not None else SHORT_PROMPT
    req = ProbeRequest(prompt=prompt,
                         max_tokens=args.max_tokens if args.max_tokens is not None else DEFAULT_MAX_TOKENS,
                         temperature=args.temperature, top_p=args.top_p,
                         stop_token_ids=_stop_ids(args.stop_token_ids), chat=args.chat, model=args.probe_model)
    stream_out = None
    if not args.json:
        def stream_out(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()
    result = run_probe(args.url, request=req, api_key=api_key, on_text=stream_out,
                         read_timeout=args.timeout or DEFAULT_READ_TIMEOUT_S)
    if args.json:
        print_whole(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    else:
        if result.text:
            print()
        # The error reads as every command's does (`ernie-tui: error: KIND: ...`,
        # on stderr); what was measured before it, if anything, on stdout.
        for line in probe_error_lines(result):
            print(f"ernie-tui: error: {line}", file=sys.stderr)
        measured = format_probe(result, errors=False)
        if measured:
            print(measured)
    return 0 if result.ok else 1


def _preset_for(name: str | None, extra_files: list[str]):
    if not name:
        return None
    from ernie_tui.presets import PresetError, load_presets  # lazy: --help start-up

    try:
        return load_presets(extra_files).get(name)
    except PresetError:
        # An unknown preset name still tags the record; its args are just unknown.
        return name


def _run_burst(args) -> int:
    import threading

    from ernie_tui.engine_ctl.load import (  # lazy: --help start-up
        BurstConfig,
        ProbeFailure,
        find_tokenizer,
        format_burst,
        run_burst,
    )

    concurrency = args.concurrency if args.concurrency is not None else (0 if args.rate is not None else 4)
    cfg = BurstConfig(
        n=args.burst, min_tokens=args.min_tokens, max_tokens_in=args.max_tokens_in,
        concurrency=concurrency,
        max_tokens=args.max_tokens if args.max_tokens is not None else 128,
        min_output_tokens=args.min_output_tokens,
        ignore_eos=not args.no_ignore_eos, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
        word_seed=args.word_seed, chat=args.chat, read_timeout_s=args.timeout or 120.0,
        rate=args.rate, arrivals=args.arrivals, arrival_seed=args.arrival_seed,
        sample_interval_s=args.metrics_interval,
    )
    traffic = traffic_fields(args)
    if traffic is not None:
        from dataclasses import replace

        profile, fields = traffic
        cfg = replace(cfg, **fields)
        if args.rate is None and args.concurrency is None:
            # The profile's own arrivals: its mean rate, its burstiness.
            cfg = replace(cfg, rate=profile.arrivals.rate_per_s, concurrency=0)
    try:
        cfg.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    api_key = _api_key(args.api_key_env)
    tokenizer = None
    if args.tokenizer:
        try:
            tokenizer = find_tokenizer(tokenizer_path=args.tokenizer)
        except ProbeFailure as exc:
            raise CliError(str(exc)) from exc

    show = not args.json and sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if show:
            width = 30
            filled = int(width * done / max(total, 1))
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            sys.stderr.flush()

    cancel = threading.Event()
    try:
        result = run_burst(args.url, cfg, model=args.probe_model, api_key=api_key, tokenizer=tokenizer,
                             progress=progress, cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        raise
    if show:
        sys.stderr.write("\n")
    _save_and_print(args, result, format_burst, measured=result.duration_s > 0)
    return 0 if result.completed > 0 else 1


def _save_and_print(args, result, format_result, *, measured: bool):
    """Save a burst's or a search's run record (unless --no-save, or nothing
    was measured) and print the result: text, or JSON naming the record."""
    from ernie_tui.engine_ctl.load import RunStoreError  # lazy: --help start-up

    record = None
    if not args.no_save and measured:
        preset = _preset_for(args.probe_preset, list(getattr(args, "presets", []) or []))
        try:
            record = result.save(preset=preset)
        except RunStoreError as exc:
            print(f"ernie-tui: warning: {exc}", file=sys.stderr)
    if not measured and not args.json:
        # Nothing was sent (a refused URL, no model): a table of dashes says
        # nothing; the reason is the whole answer.
        for line in result.warnings or [getattr(result, "stop_message", "") or "nothing was measured"]:
            print(f"ernie-tui: error: {line}", file=sys.stderr)
        return
    if args.json:
        out = result.to_dict()
        out["run_record"] = str(record.path) if record else None
        print_whole(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        print_whole(format_result(result))
        if record is not None:
            print(f"saved run record {record.path}")
    return record


def _run_capacity(args) -> int:
    import threading

    from ernie_tui.cli.capacity_args import capacity_options, load_workload  # lazy: --help start-up
    from ernie_tui.engine_ctl.load import (
        CapacityResult,
        ProbeFailure,
        find_tokenizer,
        format_capacity,
        request_setup,
        run_capacity,
        verdict_text,
    )

    opts = capacity_options(args)
    max_tokens = args.max_tokens if args.max_tokens is not None else 128
    workload = load_workload(args.workload, max_tokens)
    try:
        cfg, settings = request_setup(min_tokens=args.min_tokens, max_tokens_in=args.max_tokens_in,
                                        max_tokens=max_tokens, min_output_tokens=args.min_output_tokens,
                                        ignore_eos=not args.no_ignore_eos, chat=args.chat,
                                        temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                                        word_seed=args.word_seed, read_timeout_s=args.timeout or 120.0)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    traffic = traffic_fields(args)
    if traffic is not None:
        from dataclasses import replace

        if workload is not None:
            raise CliError("--traffic and --workload are two sources of prompts: give one")
        cfg = replace(cfg, **traffic[1])
        settings.ignore_eos = cfg.ignore_eos  # how the profile's outputs end
    settings.client_procs = opts.client_procs
    api_key = _api_key(args.api_key_env)
    tokenizer = None
    if args.tokenizer and workload is None:
        try:
            tokenizer = find_tokenizer(tokenizer_path=args.tokenizer)
        except ProbeFailure as exc:
            raise CliError(str(exc)) from exc

    live = sys.stderr.isatty()

    def progress(ev: dict) -> None:
        # The curve as it grows, on stderr: stdout keeps the result (or the JSON).
        kind = ev.get("event")
        load = f"rate {ev['rate']:g} req/s" if ev.get("rate") is not None else f"concurrency {ev.get('concurrency')}"
        if kind == "level_start":
            again = (" again (the bracket's lowest fail, once more before it bounds the capacity)"
                     if ev.get("recheck") else " (the confirmation)" if ev.get("confirm") else "")
            print(f"level {ev['index'] + 1}: {load}{again} ...", file=sys.stderr, flush=True)
        elif kind == "level_progress" and live:
            # One line rewritten in place, only on a terminal (a log keeps the level lines).
            def f(v, fmt=".0f"):
                return "-" if v is None else format(v, fmt)

            att = "-" if ev.get("attainment") is None else f"{ev['attainment'] * 100:.0f}%"
            line = (f"  {ev.get('phase')}: {ev.get('requests')} done, {ev.get('in_flight')} in flight, "
                    f"{ev.get('elapsed_s', 0):.0f} s, {ev.get('windows')} windows; TTFT p99 "
                    f"{f(ev.get('ttft_p99_ms'))} ms, ITL p99 {f(ev.get('itl_p99_ms'), '.1f')} ms, attainment {att}")
            print("\r\033[K" + line, end="", file=sys.stderr, flush=True)
        elif kind == "level_done":
            lv = ev["level"]
            att = "-" if lv.attainment is None else f"{lv.attainment * 100:.1f}%"
            print(("\r\033[K" if live else "")
                  + f"  {lv.requests} requests counted in {lv.seconds:.1f} s of {lv.windows or 0} windows "
                  f"(level {lv.elapsed_s or lv.seconds:.1f} s), attainment {att}: "
                  f"{verdict_text(lv)} ({lv.stop})",
                  file=sys.stderr, flush=True)

    cancel = threading.Event()
    result: CapacityResult = run_interruptible(
        lambda: run_capacity(args.url, opts.slo, search_config=opts.search, rules=opts.rules,
                               settings=settings, workload=workload, burst_config=cfg,
                               tokenizer=tokenizer, model=args.probe_model, api_key=api_key,
                               progress=progress, cancel=cancel),
        cancel, name="capacity", on_interrupt="ending the running level, keeping the levels measured ...")
    record = _save_and_print(args, result, format_capacity, measured=bool(result.levels))
    if args.report and record is not None:

        written = write_from_refs([str(record.path)], args.report)
        print(f"wrote {', '.join(written)}", file=sys.stderr)
    if cancel.is_set():
        return 130
    return 0 if result.levels and result.stop_reason != "server_down" else 1
