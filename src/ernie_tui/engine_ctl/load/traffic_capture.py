"""Capture a traffic profile (traffic.py) from what a server already publishes.

Three sources, each seeing a different part of the traffic; when more than
one is given, each part of the profile comes from the richest source that
saw it (build_profile), and the profile's source.fields says which:
- /metrics alone (from_metrics): two scrapes bracket the window. vLLM's
  histograms of prompt tokens, generation tokens and max_tokens give the
  lengths within one bucket; the finished-request counter by reason gives
  the share that stopped early; the prefix-cache counters the hit rate.
  Scrapes taken in between give the rate per interval, and so a burstiness
  read from how much those counts vary. The counters move when a request
  finishes, not when it arrives, so the rate is right over the window and
  the burstiness only roughly.
- vLLM's request log (parse_request_log, from_log_requests), when the
  server runs with --enable-log-requests: one "Received request" line per
  request, with its arrival time and SamplingParams (max_tokens,
  ignore_eos). At DEBUG level (VLLM_LOGGING_LEVEL=DEBUG) a second line
  carries the prompt's token ids, so the exact prompt length.
- a JSONL trace the operator gives (from_trace): OpenAI-style request
  bodies with a timestamp, and the usage of the answer when it was kept.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ernie_tui.engine_ctl.load import metrics as M
from ernie_tui.engine_ctl.load.traffic import (
    Arrivals,
    LengthDist,
    Prefix,
    Source,
    TrafficError,
    TrafficProfile,
)
from ernie_tui.engine_ctl.load.workload import jsonl_lines

PROMPT_HIST = ("vllm:request_prompt_tokens",)
OUTPUT_HIST = ("vllm:request_generation_tokens",)
# max_tokens as asked; vLLM also keeps it capped by the model length (the second).
MAX_TOKENS_HIST = ("vllm:request_params_max_tokens", "vllm:request_max_num_generation_tokens")
# Richest first: a trace sees every request's text; a request log its arrival
# and parameters; /metrics only histograms and counters.
RICHNESS = ("trace", "request-log", "metrics")
# When the server started (since_start): when vLLM created its finished-request
# counter (prometheus_client's `_created` sample), else its API process' start.
COUNTER_CREATED = tuple(name.replace("_total", "_created") for name in M.REQUEST_SUCCESS)
PROCESS_START = ("process_start_time_seconds",)
# The metric families from_metrics and since_start read: a poller that
# prefilters its scrapes (the dashboard's sampler) keeps these on the scrapes
# it hands a capture.
TRAFFIC_METRICS = (*PROMPT_HIST, *OUTPUT_HIST, *MAX_TOKENS_HIST, *M.REQUEST_SUCCESS, *M.PREFIX_QUERIES,
                   *M.PREFIX_HITS, *M.CACHE_CONFIG, *COUNTER_CREATED, *PROCESS_START)
PARTS = ("prompt_tokens", "output_tokens", "max_tokens", "eos_share", "arrivals", "prefix")


@dataclass
class Captured:
    """What one source saw: some of the profile's parts (None: not seen)."""

    kind: str
    requests: float = 0.0
    window_s: float | None = None
    prompt_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    max_tokens: LengthDist | None = None
    eos_share: float | None = None
    arrivals: Arrivals | None = None
    prefix: Prefix | None = None
    notes: list[str] = field(default_factory=list)
    texts: list[str] | None = None


def build_profile(name: str, captures: list[Captured], *, url: str | None = None,
                  keep_text: bool = False, description: str = "") -> TrafficProfile:
    """One profile from the sources' captures, each part from the richest
    source that saw it. A part no source saw is filled with a plain
    assumption, said in the notes. TrafficError when no source saw any
    request's lengths."""
    order = sorted(captures, key=lambda c: RICHNESS.index(c.kind) if c.kind in RICHNESS else len(RICHNESS))
    picked: dict[str, Any] = {}
    fields: dict[str, str] = {}
    for part in PARTS:
        for c in order:
            value = getattr(c, part)
            # An assumed burstiness or prefix loses to a measured one further down.
            if value is None or (part == "arrivals" and not value.cv_measured and _measured_arrivals(order)) \
                    or (part == "prefix" and value.assumed and _measured_prefix(order)):
                continue
            picked[part] = value
            fields[part] = c.kind
            break
    notes = [n for c in order for n in c.notes]
    if "prompt_tokens" not in picked:
        raise TrafficError("no source saw the prompt lengths (a request log at INFO level has none: "
                           "add --url for /metrics, or run vLLM with VLLM_LOGGING_LEVEL=DEBUG)")
    if "output_tokens" not in picked:
        mt = picked.get("max_tokens")
        if mt is None:
            raise TrafficError("no source saw the output lengths or max_tokens")
        picked["output_tokens"] = mt
        fields["output_tokens"] = fields["max_tokens"] + " (max_tokens: outputs assumed to run to it)"
        notes.append("no output lengths were seen: outputs are taken to run to max_tokens")
    if "arrivals" not in picked:
        raise TrafficError("no source saw the arrival rate")
    kinds = {c.kind for c in captures}
    main = order[0]
    texts = next((c.texts for c in order if c.texts), None) if keep_text else None
    return TrafficProfile(
        name=name, description=description,
        prompt_tokens=picked["prompt_tokens"], output_tokens=picked["output_tokens"],
        max_tokens=picked.get("max_tokens"), eos_share=picked.get("eos_share"),
        arrivals=picked["arrivals"], prefix=picked.get("prefix") or Prefix(),
        source=Source(kind=main.kind if len(kinds) == 1 else "merged", url=url,
                      window_s=max((c.window_s or 0.0 for c in captures), default=None) or None,
                      captured_at=dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
                      requests=max(c.requests for c in captures), fields=fields if len(kinds) > 1 else {}),
        notes=notes, texts=texts)


def _measured_arrivals(order: list[Captured]) -> bool:
    return any(c.arrivals is not None and c.arrivals.cv_measured for c in order)


def _measured_prefix(order: list[Captured]) -> bool:
    return any(c.prefix is not None and not c.prefix.assumed for c in order)


# -- the arrival process from times ---------------------------------------

def arrivals_from_times(times: list[float], window_s: float | None = None, bins: int = 12,
                        resolution_s: float | None = None) -> Arrivals:
    """Mean rate, gap CV and a rate series from arrival times (seconds).
    The rate is over the window when given (arrivals over the time watched),
    else over the span from the first arrival to the last. Times stamped
    only to `resolution_s` (a log's whole seconds) hide the gaps inside a
    stamp: the CV is then read from the counts per stamp, as the square root
    of their index of dispersion (1 for Poisson; for bursty arrivals it
    reads low when the stamps are short beside the bursts)."""
    ts = sorted(times)
    if len(ts) < 2:
        raise TrafficError("fewer than two arrivals: no rate to read")
    span = ts[-1] - ts[0]
    if window_s:
        rate = len(ts) / window_s
    elif span > 0:
        rate = (len(ts) - 1) / span
    else:
        raise TrafficError("every arrival at the same instant: no rate to read")
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    mean_gap = math.fsum(gaps) / len(gaps)
    cv = 1.0
    if resolution_s:
        counts = [0] * (int((ts[-1] - ts[0]) / resolution_s) + 1)
        for t in ts:
            counts[int((t - ts[0]) / resolution_s)] += 1
        m = math.fsum(counts) / len(counts)
        if len(counts) >= 2 and m > 0:
            cv = max(0.05, math.sqrt(math.fsum((c - m) ** 2 for c in counts) / (len(counts) - 1) / m))
    elif mean_gap > 0 and len(gaps) >= 2:
        var = math.fsum((g - mean_gap) ** 2 for g in gaps) / (len(gaps) - 1)
        cv = max(0.05, math.sqrt(var) / mean_gap)
    width = max((window_s or span) / bins, 1e-9)
    series = [0.0] * bins
    for t in ts:
        series[min(bins - 1, int((t - ts[0]) / width))] += 1.0
    return Arrivals(rate_per_s=rate, cv=cv, cv_measured=len(gaps) >= 2, window_s=round(width, 3),
                    rate_series=[c / width for c in series])


# -- /metrics --------------------------------------------------------------

def from_metrics(before: M.MetricsSnapshot, after: M.MetricsSnapshot,
                 between: list[M.MetricsSnapshot] | None = None) -> Captured:
    """What /metrics says about the window between two scrapes; `between`:
    scrapes taken inside the window, in order, for the rate per interval."""
    window = M.elapsed(before, after)
    if window <= 0:
        raise TrafficError("the two /metrics scrapes are not in order")
    cap = Captured(kind="metrics", window_s=window)
    hp, ho, hm = window_histograms(before, after)
    if hp is None and ho is None:
        raise TrafficError("/metrics has no prompt or generation token histograms (or the server restarted "
                           "within the window)")
    cap.prompt_tokens = LengthDist.from_histogram(hp) if hp else None
    cap.output_tokens = LengthDist.from_histogram(ho) if ho else None
    cap.max_tokens = LengthDist.from_histogram(hm) if hm else None
    by_reason = _finished_by_reason(before, after)
    finished = by_reason.get("stop", 0.0) + by_reason.get("length", 0.0)
    cap.eos_share = by_reason.get("stop", 0.0) / finished if finished > 0 else None
    n = (hp.count if hp else None) or sum(by_reason.values())
    cap.requests = n
    if n <= 0:
        raise TrafficError(f"no request finished in the {window:.0f} s window")
    cap.arrivals = _metrics_arrivals(before, after, between or [], n, window)
    if not cap.arrivals.cv_measured:
        cap.notes.append("/metrics: burstiness assumed Poisson (gap CV 1): too few scrapes inside the window "
                         "to read it")
    cap.prefix = _metrics_prefix(before, after, cap.prompt_tokens)
    if cap.prompt_tokens is not None:
        cap.notes.append("/metrics: lengths are read within one histogram bucket (vLLM's 1-2-5 bounds), spread "
                         "inside the buckets so that their mean is vLLM's exact one")
    return cap


def since_start(after: M.MetricsSnapshot) -> M.MetricsSnapshot | None:
    """A scrape as the server stood at its start (every counter and
    histogram 0), so that from_metrics(since_start(after), after) reads all
    it served, not only a window watched: last night's traffic, from a
    dashboard attached this morning. The start is when vLLM created its
    finished-request counter, else its API process' start time; None when
    /metrics gives neither. The mean rate is then over the whole uptime,
    idle hours included."""
    created = [v for name in COUNTER_CREATED for _, v in after.samples(name) if v > 0]
    start = min(created) if created else after.maximum(PROCESS_START)
    if not start or start >= after.timestamp:
        return None
    return after.zeroed(start, float(after.mono) - (after.timestamp - start))  # type: ignore[arg-type]


def window_histograms(before: M.MetricsSnapshot, after: M.MetricsSnapshot
                      ) -> tuple[M.Histogram | None, M.Histogram | None, M.Histogram | None]:
    """The window's histograms from_metrics reads (prompt tokens, generation
    tokens, max_tokens asked), whole buckets, for showing; None where
    /metrics has none or the server restarted within the window."""
    return (M.histogram_delta(before, after, PROMPT_HIST), M.histogram_delta(before, after, OUTPUT_HIST),
            M.histogram_delta(before, after, MAX_TOKENS_HIST))


def _finished_by_reason(before: M.MetricsSnapshot, after: M.MetricsSnapshot) -> dict[str, float]:
    out: dict[str, float] = {}
    for reason in after.label_values("finished_reason"):
        d = M.counter_delta(before.where("finished_reason", reason), after.where("finished_reason", reason),
                            M.REQUEST_SUCCESS)
        if d:
            out[reason] = d
    return out


def _metrics_arrivals(before: M.MetricsSnapshot, after: M.MetricsSnapshot, between: list[M.MetricsSnapshot],
                      n: float, window: float) -> Arrivals:
    """The rate over the window; with scrapes between, the completions per
    interval, and a gap CV from their index of dispersion (variance over
    mean of the counts: 1 for Poisson, CV squared for a renewal process
    watched over intervals long beside its gaps)."""
    intervals = interval_completions([before, *between, after])
    counts = [c for _, _, c in intervals]
    widths = [w for _, w, _ in intervals]
    rate = n / window
    if len(counts) < 4:
        return Arrivals(rate_per_s=rate, window_s=window, rate_series=[rate])
    width = math.fsum(widths) / len(widths)
    mean = math.fsum(counts) / len(counts)
    var = math.fsum((c - mean) ** 2 for c in counts) / (len(counts) - 1)
    cv = math.sqrt(var / mean) if mean > 0 else 1.0
    return Arrivals(rate_per_s=rate, cv=min(max(cv, 0.2), 5.0), cv_measured=True, window_s=round(width, 3),
                    rate_series=[c / w for c, w in zip(counts, widths, strict=True)])


def interval_completions(snaps: list[M.MetricsSnapshot]) -> list[tuple[float, float, float]]:
    """(end, width, requests finished) for each interval between consecutive
    scrapes, in seconds of the scrapes' monotonic clock; an interval across a
    counter reset, or out of order, is left out."""
    out = []
    for a, b in zip(snaps, snaps[1:], strict=False):
        d = M.counter_delta(a, b, M.REQUEST_SUCCESS)
        w = M.elapsed(a, b)
        if d is not None and w > 0:
            out.append((float(b.mono), w, d))  # type: ignore[arg-type]
    return out


def _metrics_prefix(before: M.MetricsSnapshot, after: M.MetricsSnapshot,
                    prompts: LengthDist | None) -> Prefix | None:
    """The hit rate as vLLM counts it (hit tokens over queried tokens). The
    share and length of the prefix behind it cannot be seen, only their
    product: H = hit rate x mean prompt tokens a request. The profile
    assumes (and says so) the shortest whole-block prefix L that the
    prompts longer than it can carry, share H / L of the requests: a system
    prompt sits in front of longer prompts, and vLLM counts hits in whole
    blocks (block_size from cache_config_info, else 16). Where no L is
    carried by enough longer prompts (lengths read within wide buckets),
    the L that comes nearest, shorter prompts taking part of it."""
    q = M.counter_delta(before, after, M.PREFIX_QUERIES)
    h = M.counter_delta(before, after, M.PREFIX_HITS)
    if not q or h is None:
        return None
    hit = h / q
    mean = prompts.mean if prompts is not None and prompts.mean else None
    if not mean or hit <= 0 or prompts is None:
        return Prefix(hit_rate=round(hit, 4), assumed=True)
    cache = after.cache_config()
    block = (cache.block_size if cache is not None else None) or 16
    per_request = hit * mean
    candidates = range(block, max(block, int(prompts.quantile(1.0))) + 1, block)
    carried = {L: L * (1.0 - prompts.cdf(L + 1)) for L in candidates}
    length = next((L for L in candidates if carried[L] >= per_request), max(carried, key=carried.__getitem__))
    share = min(1.0, per_request / length)
    return Prefix(share=round(share, 4), tokens=int(length), hit_rate=round(hit, 4), assumed=True)


# -- vLLM's request log ------------------------------------------------------

# "(APIServer pid=1) INFO 12-07 04:56:20 [request_logger.py:65] Received request cmpl-...-0: params: ..."
_TIME = r"(?P<mon>\d\d)-(?P<day>\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?"
_RECEIVED = re.compile(_TIME + r" \[[^\]]*\] Received request (?P<id>\S+): params: (?P<params>.*), lora_request:")
_DETAILS = re.compile(r"Request (?P<id>\S+) details: prompt: .*?, prompt_token_ids: (?P<ids>\[[\d, ]*\]|None)")
_PARAM = re.compile(r"\b(max_tokens|ignore_eos|n)=([\w.]+)")


@dataclass
class LoggedRequest:
    request_id: str
    at: float  # seconds, from the log's clock (the year taken as this one)
    max_tokens: int | None = None
    ignore_eos: bool | None = None
    prompt_tokens: int | None = None  # from the DEBUG details line, when logged
    prompt_ids: list[int] | None = None  # its token ids (for the shared prefix; never written to a profile)


def parse_request_log(lines: Iterable[str], year: int | None = None) -> list[LoggedRequest]:
    """The requests vLLM logged, in order. Lines of other kinds are skipped;
    a DEBUG details line adds its request's prompt length."""
    year = year or dt.datetime.now().year
    out: dict[str, LoggedRequest] = {}
    ids_by_id: dict[str, list[int]] = {}
    for line in lines:
        if "Received request" in line:
            m = _RECEIVED.search(line)
            if m is None:
                continue
            when = dt.datetime.strptime(f"{year}-{m['mon']}-{m['day']} {m['hms']}", "%Y-%m-%d %H:%M:%S")
            at = when.timestamp() + (float("0." + m["frac"]) if m["frac"] else 0.0)
            params = dict(_PARAM.findall(m["params"]))
            mt = params.get("max_tokens")
            out[m["id"]] = LoggedRequest(m["id"], at, max_tokens=int(mt) if mt and mt.isdigit() else None,
                                         ignore_eos=params.get("ignore_eos") == "True"
                                         if "ignore_eos" in params else None)
        elif " details: prompt: " in line:
            d = _DETAILS.search(line)
            if d is not None and d["ids"] != "None":
                ids_by_id[d["id"]] = json.loads(d["ids"])
    for rid, ids in ids_by_id.items():
        if rid in out:
            out[rid].prompt_tokens = len(ids)
            out[rid].prompt_ids = ids
    return sorted(out.values(), key=lambda r: r.at)


def from_log_requests(reqs: list[LoggedRequest], window_s: float | None = None) -> Captured:
    """What the request log says: arrivals, max_tokens, and (DEBUG) prompt lengths."""
    if not reqs:
        raise TrafficError("the log holds no \"Received request\" lines in the window: start vLLM with "
                           "--enable-log-requests")
    cap = Captured(kind="request-log", requests=float(len(reqs)), window_s=window_s)
    times = [r.at for r in reqs]
    if len(times) >= 2:
        whole = all(t == int(t) for t in times)
        cap.arrivals = arrivals_from_times(times, window_s, resolution_s=1.0 if whole else None)
        if whole:
            cap.notes.append("request log: its times are to the second; the burstiness is read from the "
                             "arrivals per second")
    mts = [r.max_tokens for r in reqs if r.max_tokens is not None]
    if mts:
        cap.max_tokens = LengthDist.from_values(mts)
    pts = [r.prompt_tokens for r in reqs if r.prompt_tokens is not None]
    if pts:
        cap.prompt_tokens = LengthDist.from_values(pts)
        # The token ids show the shared prefix itself (a --max-log-len cut
        # would shorten it, and the lengths: vLLM's default keeps them whole).
        cap.prefix = shared_prefix([r.prompt_ids for r in reqs if r.prompt_ids], len, key=16)
    else:
        cap.notes.append("request log: no prompt lengths (vLLM logs the prompt's tokens only at DEBUG level)")
    return cap


# -- a JSONL trace -------------------------------------------------------------

@dataclass
class TraceRequest:
    at: float
    text: str
    prompt_tokens: int | None
    max_tokens: int | None
    output_tokens: int | None
    finish_reason: str | None


def read_trace(path: str | Path) -> list[TraceRequest]:
    """One request a line: {"timestamp": 1733550000.5 | "2026-12-07T04:00:00Z",
    "body": {OpenAI-style request}, optional "usage": {"prompt_tokens",
    "completion_tokens"}, "finish_reason"}; the body's fields may also sit
    at the top level. TrafficError names the first bad line."""
    p = Path(path).expanduser()
    out = []
    for n, s in jsonl_lines(p, "the trace", TrafficError):
        try:
            obj = json.loads(s)
            out.append(_trace_line(obj))
        except (json.JSONDecodeError, TypeError, ValueError, KeyError) as exc:
            raise TrafficError(f"{p}:{n}: not a trace line ({exc})") from exc
    if not out:
        raise TrafficError(f"{p} holds no requests")
    return out


def _trace_line(obj: dict[str, Any]) -> TraceRequest:
    body = obj.get("body") or obj.get("request") or obj
    ts = obj.get("timestamp", obj.get("time"))
    if isinstance(ts, str):
        at = dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    elif isinstance(ts, (int, float)) and not isinstance(ts, bool):
        at = float(ts)
    else:
        raise ValueError("needs a \"timestamp\" (seconds or ISO 8601)")
    if "messages" in body:
        text = "\n".join(_content(m.get("content")) for m in body["messages"])
    else:
        prompt = body["prompt"]
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    usage = obj.get("usage") or (obj.get("response") or {}).get("usage") or {}
    mt = body.get("max_tokens", body.get("max_completion_tokens"))
    return TraceRequest(at=at, text=text, prompt_tokens=_int(usage.get("prompt_tokens", obj.get("prompt_tokens"))),
                        max_tokens=_int(mt), output_tokens=_int(usage.get("completion_tokens",
                                                                          obj.get("output_tokens"))),
                        finish_reason=obj.get("finish_reason"))


def _content(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return ""


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def from_trace(reqs: list[TraceRequest], tokenizer: Any = None, keep_text: bool = False) -> Captured:
    """Lengths, arrivals and the shared prefix of a trace. Prompt lengths:
    the usage kept with the request, else the tokenizer's count, else an
    estimate (said in the notes). The estimate, and the shared prefix's
    length without a tokenizer, take the characters a token that the
    usage shows over the trace's own prompts (4 where no usage was kept):
    a tokenizer's ratio differs by model and language, the usage's is
    this traffic's."""
    cap = Captured(kind="trace", requests=float(len(reqs)))
    estimated = 0
    known = [(len(r.text), r.prompt_tokens) for r in reqs if r.prompt_tokens]
    per_token = math.fsum(c for c, _ in known) / sum(t for _, t in known) if known else 4.0
    per_token = per_token if per_token > 0 else 4.0

    def count(text: str) -> int:
        nonlocal estimated
        if tokenizer is not None:
            return len(tokenizer.encode(text))
        estimated += 1
        return max(1, round(len(text) / per_token))

    prompt_lens = [r.prompt_tokens if r.prompt_tokens is not None else count(r.text) for r in reqs]
    cap.prompt_tokens = LengthDist.from_values(prompt_lens)
    how = f"{per_token:.2f} characters a token, the usage's" if known else "4 characters a token"
    if estimated:
        cap.notes.append(f"trace: {estimated} prompt lengths estimated at {how} (give --tokenizer or keep the "
                         "usage)")
    outs = [r.output_tokens for r in reqs if r.output_tokens is not None]
    if outs:
        cap.output_tokens = LengthDist.from_values(outs)
    mts = [r.max_tokens for r in reqs if r.max_tokens is not None]
    if mts:
        cap.max_tokens = LengthDist.from_values(mts)
    reasons = [r.finish_reason for r in reqs if r.finish_reason in ("stop", "length")]
    if reasons:
        cap.eos_share = reasons.count("stop") / len(reasons)
    if len(reqs) >= 2:
        cap.arrivals = arrivals_from_times([r.at for r in reqs])
        cap.window_s = max(r.at for r in reqs) - min(r.at for r in reqs)
    cap.prefix = shared_prefix([r.text for r in reqs], count)
    if tokenizer is None and cap.prefix.tokens:
        cap.notes.append(f"trace: the shared prefix's length estimated at {how} (give --tokenizer to count it)")
    if keep_text:
        cap.texts = [r.text for r in reqs]
    return cap


def shared_prefix(texts: list[Any], count: Any, key: int = 64) -> Prefix:
    """The largest group of prompts (texts, or token-id lists) that open
    with the same `key` characters (ids): its share of all, and the length
    of what they all share, counted by `count`."""
    groups: dict[Any, list[Any]] = {}
    for t in texts:
        if len(t) >= key:
            groups.setdefault(tuple(t[:key]), []).append(t)
    best = max(groups.values(), key=len, default=[])
    if len(best) < 2:
        return Prefix()
    common = best[0]
    for t in best[1:]:
        k = 0
        for a, b in zip(common, t, strict=False):
            if a != b:
                break
            k += 1
        common = common[:k]
    return Prefix(share=round(len(best) / len(texts), 4), tokens=int(count(common)))


# -- live: a window on a running server --------------------------------------------

def capture_live(url: str, window_s: float, *, interval_s: float = 5.0, log_path: str | Path | None = None,
                 api_key: str | None = None, cancel: Any = None) -> list[Captured]:
    """Watch a server for `window_s` seconds: a /metrics scrape at the start,
    every `interval_s` and at the end, and (log_path) the request-log lines
    vLLM appends meanwhile. A cancel (threading.Event) set early ends the
    window there. The captures, /metrics' first; TrafficError when /metrics
    cannot be read and no log was given."""
    import time

    def sleep(s: float) -> None:
        if cancel is not None:
            cancel.wait(s)  # a cancel ends the pause, not only the next one
        else:
            time.sleep(s)
    offset = _log_size(log_path)
    with M.MetricsClient(url, api_key, timeout=10.0) as client:
        snaps = [client.fetch()]
        t0 = time.monotonic()
        while time.monotonic() - t0 < window_s:
            if cancel is not None and cancel.is_set():
                break
            sleep(min(interval_s, max(0.0, window_s - (time.monotonic() - t0))))
            snap = client.try_fetch()
            if snap is not None:
                snaps.append(snap)
    captures: list[Captured] = []
    note = "" if len(snaps) >= 2 else "the window ended before a second scrape"
    if len(snaps) >= 2:
        try:
            captures.append(from_metrics(snaps[0], snaps[-1], snaps[1:-1]))
        except TrafficError as exc:
            if log_path is None:
                raise
            note = str(exc)
    elif log_path is None:
        raise TrafficError(note)
    if log_path is not None:
        lines = _log_lines_since(log_path, offset)
        watched = M.elapsed(snaps[0], snaps[-1]) if len(snaps) >= 2 else 0.0
        cap = from_log_requests(parse_request_log(lines), window_s=watched or window_s)
        if not captures and note:
            cap.notes.append(f"/metrics: {note}")
        captures.append(cap)
    return captures


def _log_size(path: str | Path | None) -> int:
    if path is None:
        return 0
    try:
        return Path(path).expanduser().stat().st_size
    except OSError as exc:
        raise TrafficError(f"cannot read the log {path}: {exc.strerror or exc}") from exc


def _log_lines_since(path: str | Path, offset: int) -> list[str]:
    with open(Path(path).expanduser(), "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", errors="replace").splitlines()


def from_log_file(path: str | Path) -> Captured:
    """A whole request log read after the fact (no /metrics window)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TrafficError(f"cannot read the log {p}: {exc.strerror or exc}") from exc
    return from_log_requests(parse_request_log(text.splitlines()))
