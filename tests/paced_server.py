"""A local OpenAI-style streaming server whose pacing and capacity are set.

For testing timing and the capacity search over real HTTP without vLLM:
- POST /v1/completions and /v1/chat/completions stream SSE as vLLM does:
  usage in every chunk (the running token count) only when the request's
  stream_options ask for continuous_usage_stats, a final usage chunk when
  they ask include_usage, then `data: [DONE]`; chunked transfer, keep-alive;
- N slots are its capacity: a request takes a slot, waits --ttft-ms, then
  sends one token every --itl-ms up to max_tokens; requests beyond N wait
  for a slot (queued in arrival order), so TTFT grows with the queue;
- GET /metrics (prometheus_client; --metrics-delay-ms makes it slow to
  answer): vllm:num_requests_running/waiting,
  vllm:kv_cache_usage_perc (running / slots), the TTFT, ITL and e2e
  histograms, the queue and prefill phase histograms, generation/prompt
  token and finished-request counters, the per-request prompt, generation
  and max_tokens histograms (vLLM's 1-2-5 buckets), all
  measured here, server side; the length histograms' bounds are vLLM's
  1-2-5 series up to --max-model-len, as its own are; the prefix-cache
  query/hit counters, where a hit is a whole prompt sent before (its every
  token), or with --prefix-block N whole blocks, as vLLM counts them;
- --prefix-block N: a prefix cache of N-token blocks, as vLLM's: a prompt's
  hits are the longest run of whole blocks that opened an earlier prompt
  (registered when a request takes its slot), prefill (--prefill-ms-per-token)
  is paid only for the tokens after them, and /metrics publishes
  vllm:cache_config_info with that block_size (a shared system prompt is
  then served as vLLM serves it: its blocks once, then from the cache);
- --drop-completions N closes the connections of the first N completion
  requests that ask for more than one token without an answer (-1: all),
  while every other path answers: transport failures from a server that is up;
- GET /v1/models, /health; POST /tokenize and /detokenize with a word-level
  vocabulary (one word = one token), so prompts of exact lengths can be built;
- GET /requests: the server's log of every completions/chat request, in
  arrival order: when it arrived, took a slot, sent its first token and
  ended (time.monotonic(), the clock of time.perf_counter() on Linux, so a
  test can lay them beside its own), the sampling fields the body held and
  its max_tokens, so a test can see the load a client put on it (requests
  in flight over time, send times, what each asked for); a request dropped
  (--drop-completions) is there as {"arrive", "dropped": true, "max_tokens"}.

Load-shaped pacing, each off unless asked for (the capacity search's tests):
- --prefill-ms-per-token: prefill takes this long per prompt token (TTFT
  grows with the prompt; prompts of different lengths break up waves);
- --interference-ms: prefill competes with decodes, as a batch that mixes
  them does: each request's TTFT grows by this much for every other request
  already decoding when it arrives and still decoding when its prefill
  would end. A wave of requests that
  all start together sees none; the steady state, where requests come and
  go at random times, sees most of them;
- --itl-spread F: each decoding request gets its own ITL, drawn (seeded by
  its order among decoding requests) uniformly within itl x (1 +- F), as
  real requests of one batch do not all decode alike: requests that start
  together then end apart, and a wave breaks up within a turnover;
- --slow-every K --slow-ms X: every K-th decoding request waits X ms more
  for its first token (slow requests that come back last);
- --itl-knee K --itl-slope-ms X: the decode step slows with the batch, as
  a GPU's does once it is no longer bound by reading the weights: every
  gap between tokens grows by X ms for each request in a slot beyond K
  (counted when the gap starts). Under an ITL objective the capacity is
  then known: the largest concurrency whose gaps stay within the limit;
- --itl-wander F --itl-wander-s P: the server's speed wanders, as a busy
  host's does: every gap that starts in the same P-second period (from the
  server's start) is scaled by one factor drawn within 1 +- F, seeded by the
  period's number. Gaps of one period move together, so a level's windows
  disagree and a percentile near its limit is hard to decide;
- --itl-scale-knee K: the decode step slows in proportion to the batch
  beyond K requests in slots: every gap is itl x max(1, running / K). Under
  an ITL objective of limit L the capacity is then K x L / itl (the batch
  whose gap reaches L) and the throughput past K is K / itl tokens/s: both
  proportional to K, so two stand-ins' K set their capacities' ratio;
- --drift A --drift-period-s P (env PACED_DRIFT, PACED_DRIFT_PERIOD_S): the
  host's speed drifts, as an H200's did (16 k to 26.5 k tok/s within ten
  minutes, nothing changed): every gap and every time to first token is
  multiplied by the host factor f(t) = 1 + A x sin(2 pi t / P), t the WALL
  clock (time.time()), so every stand-in on the machine, whenever it was
  started, is slowed by the same factor at the same moment. The truth under
  drift, with --itl-scale-knee K and an ITL limit L: at time t the capacity
  is K x L / (itl x f(t)) and the throughput at it K / (itl x f(t)); the
  ratio of two stand-ins' capacities (and goodputs) is K_B / K_A at every
  moment, whatever f(t). host_factor() is that f, for tests and benches;
- --tail-jitter P --tail-jitter-ms X --tail-jitter-s S (env PACED_TAIL_JITTER,
  PACED_TAIL_JITTER_MS, PACED_TAIL_JITTER_S): the tail sometimes spikes, as
  a busy box's scheduling makes it (issue #56: a level read ITL p99 23.6 ms
  against a 20 ms limit where its gaps were 10-13 ms): each S-second period
  of wall time is spiky with probability P, drawn per server (seeded by its
  port and the period's number); in a spiky period one gap in 20 is X ms
  longer. A p99 then rises by about X where it sits, so a level near its
  limit fails by a little while one far under it passes: the search's
  evidence contradicts itself near the knee, which is what the paired
  sweep's knee checks look for;
- --busy-child: a child process titled as vLLM's engine core
  (VLLM::EngineCore) that keeps one CPU core busy for as long as this
  server lives, as vLLM's engine core did on an H200 (a server bound by a
  single Python thread, for the capacity search's server-CPU note);
- --stall-period-s P --stall-s S --stall-ms X: correlated latency. The clock
  starts at the first request that decodes more than one token; every
  request arriving in the last S seconds of each P-second period waits X ms
  more for its first token (a slow second slows every request in it).

    python tests/paced_server.py --slots 4 --ttft-ms 20 --itl-ms 10 [--port 0]

As a preset's `launcher` it takes vLLM's command line (its engine arguments
are ignored; the pacing comes from the preset's env: PACED_SLOTS,
PACED_TTFT_MS, PACED_ITL_MS).

It prints `listening on http://HOST:PORT` once it accepts connections, then
the CUDA_VISIBLE_DEVICES it was started with (`(unset)` when absent), so a
parallel sweep's test can see which GPUs each trial was given.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vLLM's bucket bounds (seconds), so the histogram deltas read like its own.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


def length_buckets(max_model_len: int) -> list[float]:
    """vLLM's bounds for its per-request length histograms: 1, 2, 5, 10, 20,
    50 ... up to max_model_len (a 4,096 model: up to 2,000; 16,384: 10,000)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return out
            out.append(float(m * scale))
        scale *= 10


def block_hits(ids: list[int], block: int, seen: set[int]) -> int:
    """Tokens of `ids` served from a prefix cache of `block`-token blocks:
    the longest run of whole blocks from the start whose chain (every block
    up to it) opened a prompt before. Adds this prompt's chains to `seen`."""
    hits, h, cached = 0, 0, True
    for k in range(len(ids) // block):
        h = hash((h, tuple(ids[k * block:(k + 1) * block])))
        if cached and h in seen:
            hits += block
        else:
            cached = False
            seen.add(h)
    return hits


def host_factor(amplitude: float, period_s: float, t: float | None = None) -> float:
    """The --drift factor on every gap and TTFT at wall time t (now when
    None): 1 + A x sin(2 pi t / P). A function of the wall clock only, so
    servers started at different moments share it."""
    if not amplitude or period_s <= 0:
        return 1.0
    now = time.time() if t is None else t
    return 1.0 + amplitude * math.sin(2.0 * math.pi * now / period_s)


@functools.lru_cache(maxsize=64)
def _wander_draw(period: int) -> float:
    """The --itl-wander draw of one period, within -1..1, seeded by its number
    (cached: every gap of every request asks for it)."""
    return random.Random(f"wander-{period}").uniform(-1.0, 1.0)


class Slots:
    """N slots handed out in arrival order, with the running/waiting counts."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cond = threading.Condition()
        self.running = 0
        self.queue: list[object] = []

    def acquire(self) -> None:
        me = object()
        with self.cond:
            self.queue.append(me)
            while self.queue[0] is not me or self.running >= self.n:
                self.cond.wait()
            self.queue.pop(0)
            self.running += 1
            self.cond.notify_all()

    def release(self) -> None:
        with self.cond:
            self.running -= 1
            self.cond.notify_all()

    def counts(self) -> tuple[int, int]:
        with self.cond:
            return self.running, len(self.queue)


class Vocab:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: dict[str, int] = {}
        self.words: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        with self.lock:
            for w in text.split():
                if w not in self.ids:
                    self.ids[w] = len(self.words)
                    self.words.append(w)
                out.append(self.ids[w])
        return out

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return " ".join(self.words[i] for i in ids if 0 <= i < len(self.words))


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.slots = Slots(args.slots)
        self.cold_left = args.cold_requests
        self.cold_lock = threading.Lock()
        self.vocab = Vocab()
        self.registry = CollectorRegistry()
        lbl = ["model_name"]
        r = self.registry
        self.g_running = Gauge("vllm:num_requests_running", "running", lbl, registry=r)
        self.g_waiting = Gauge("vllm:num_requests_waiting", "waiting", lbl, registry=r)
        self.g_kv = Gauge("vllm:kv_cache_usage_perc", "KV usage 0..1", lbl, registry=r)
        self.c_gen = Counter("vllm:generation_tokens", "generated tokens", lbl, registry=r)
        self.c_prompt = Counter("vllm:prompt_tokens", "prompt tokens", lbl, registry=r)
        self.c_ok = Counter("vllm:request_success", "finished requests", lbl, registry=r)
        self.c_preempt = Counter("vllm:num_preemptions", "preemptions", lbl, registry=r)
        # vLLM's prefix-cache counters (tokens), for whole prompts only: a
        # prompt sent before counts all its tokens as hits.
        self.c_prefix_q = Counter("vllm:prefix_cache_queries", "prefix cache queries", lbl, registry=r)
        self.c_prefix_hits = Counter("vllm:prefix_cache_hits", "prefix cache hits", lbl, registry=r)
        self.seen_prompts: set[str] = set()
        self.seen_blocks: set[int] = set()  # --prefix-block: the chain hash of every block prefix served
        if args.prefix_block > 0:
            Gauge("vllm:cache_config_info", "cache config", ["block_size", "enable_prefix_caching"],
                  registry=r).labels(str(args.prefix_block), "True").set(1)
        # Load-shaped pacing (see the module's docstring).
        self.pace_lock = threading.Lock()
        # request -> when its first and its last token are due
        self.decode_ends: dict[int, tuple[float, float]] = {}
        self.decoding_requests = 0  # requests that asked for more than one token
        self.stall_t0: float | None = None
        self.t0 = time.perf_counter()  # --itl-wander's periods count from here
        self.seen_lock = threading.Lock()
        self.drop_left = args.drop_completions
        self.drop_lock = threading.Lock()
        self.log: list[dict] = []
        self.log_lock = threading.Lock()
        self.h_ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", lbl, buckets=TTFT_BUCKETS, registry=r)
        self.h_itl = Histogram("vllm:inter_token_latency_seconds", "ITL", lbl, buckets=ITL_BUCKETS, registry=r)
        self.h_e2e = Histogram("vllm:e2e_request_latency_seconds", "e2e", lbl, buckets=E2E_BUCKETS, registry=r)
        # vLLM's request phases: waiting for a slot, then slot to first token.
        self.h_queue = Histogram("vllm:request_queue_time_seconds", "queued", lbl, buckets=E2E_BUCKETS, registry=r)
        self.h_prefill = Histogram("vllm:request_prefill_time_seconds", "prefill", lbl, buckets=TTFT_BUCKETS,
                                   registry=r)
        # ... and slot to last token (prefill + decode), vLLM's "inference" phase.
        self.h_inference = Histogram("vllm:request_inference_time_seconds", "in a slot", lbl,
                                     buckets=E2E_BUCKETS, registry=r)
        # vLLM's per-request length histograms (its 1-2-5 buckets), observed as
        # a request ends: what a traffic capture reads from /metrics.
        lengths = length_buckets(args.max_model_len)
        self.h_prompt = Histogram("vllm:request_prompt_tokens", "prompt", lbl, buckets=lengths, registry=r)
        self.h_gen = Histogram("vllm:request_generation_tokens", "generated", lbl, buckets=lengths, registry=r)
        self.h_max = Histogram("vllm:request_params_max_tokens", "max_tokens", lbl, buckets=lengths, registry=r)
        # Every series exists from the start, as vLLM's do: a window opened
        # before the first request still has its counters to subtract from.
        for c in (self.c_preempt, self.c_gen, self.c_prompt, self.c_ok, self.c_prefix_q, self.c_prefix_hits):
            c.labels(args.model_name).inc(0)
        self.gauges()

    def cold_delay_s(self, n_out: int) -> float:
        """A fresh server's first decodes are slow (vLLM JIT-compiles kernels on the
        first batches that decode): the first --cold-requests requests that ask for
        more than one token wait --cold-ms more for their first token."""
        if n_out <= 1 or self.args.cold_requests <= 0:
            return 0.0
        with self.cold_lock:
            if self.cold_left <= 0:
                return 0.0
            self.cold_left -= 1
        return self.args.cold_ms / 1000.0

    def paced_ttft_s(self, key: int, n_prompt: int, n_out: int, now: float,
                     n_cached: int = 0) -> tuple[float, float]:
        """This request's time to first token, with the load-shaped pacing
        (prefill paid for the prompt tokens not served from the prefix
        cache), and its time between tokens (--itl-spread); registers when
        its decoding ends (for --interference-ms)."""
        a = self.args
        base = a.ttft_ms / 1000.0 + a.prefill_ms_per_token * (n_prompt - n_cached) / 1000.0
        extra = 0.0
        itl_s = a.itl_ms / 1000.0
        with self.pace_lock:
            if n_out > 1:
                self.decoding_requests += 1
                if a.itl_spread:
                    itl_s *= 1.0 + a.itl_spread * random.Random(self.decoding_requests).uniform(-1.0, 1.0)
                if self.stall_t0 is None:
                    self.stall_t0 = now
                if a.slow_every and self.decoding_requests % a.slow_every == 0:
                    extra += a.slow_ms / 1000.0
                if a.stall_period_s and a.stall_s:
                    phase = (now - self.stall_t0) % a.stall_period_s
                    if phase >= a.stall_period_s - a.stall_s:
                        extra += a.stall_ms / 1000.0
            if a.interference_ms:
                done_at = now + base
                competing = sum(1 for k, (first, end) in self.decode_ends.items()
                                if k != key and first <= now and end > done_at)
                extra += competing * a.interference_ms / 1000.0
            ttft = base + extra
            self.decode_ends[key] = (now + ttft, now + ttft + max(0, n_out - 1) * itl_s)
        return ttft, itl_s

    def batch_scale(self) -> float:
        """The --itl-scale-knee factor on the next gap: max(1, running / K)."""
        k = self.args.itl_scale_knee
        if k <= 0:
            return 1.0
        running, _waiting = self.slots.counts()
        return max(1.0, running / k)

    def drift(self) -> float:
        """The host factor (--drift) now."""
        return host_factor(self.args.drift, self.args.drift_period_s)

    def batch_extra_s(self) -> float:
        """What the batch adds to the next gap between tokens (--itl-slope-ms
        for each request in a slot beyond --itl-knee)."""
        a = self.args
        if not a.itl_slope_ms:
            return 0.0
        running, _waiting = self.slots.counts()
        return max(0, running - a.itl_knee) * a.itl_slope_ms / 1000.0

    def wander(self, now: float) -> float:
        """The speed factor of the --itl-wander-s period `now` falls in."""
        a = self.args
        if not a.itl_wander or a.itl_wander_s <= 0:
            return 1.0
        return 1.0 + a.itl_wander * _wander_draw(int((now - self.t0) // a.itl_wander_s))

    def jitter_s(self, now: float, draw: float) -> float:
        """What --tail-jitter adds to a gap that starts at wall time `now`
        (`draw`: the gap's own uniform draw, one in 20 of a spiky period's gaps
        gets --tail-jitter-ms)."""
        a = self.args
        if not a.tail_jitter or a.tail_jitter_s <= 0 or draw >= 0.05:
            return 0.0
        period = int(now // a.tail_jitter_s)
        spiky = random.Random(f"jitter-{a.port or os.getpid()}-{period}").random() < a.tail_jitter
        return a.tail_jitter_ms / 1000.0 if spiky else 0.0

    def done(self, key: int) -> None:
        with self.pace_lock:
            self.decode_ends.pop(key, None)

    def drop_this(self) -> bool:
        """Whether this completion request is dropped (--drop-completions)."""
        with self.drop_lock:
            if self.drop_left == 0:
                return False
            if self.drop_left > 0:
                self.drop_left -= 1
            return True

    def gauges(self) -> None:
        running, waiting = self.slots.counts()
        m = self.args.model_name
        self.g_running.labels(m).set(running)
        self.g_waiting.labels(m).set(waiting)
        self.g_kv.labels(m).set(running / self.slots.n)


def make_handler(srv: Server):
    args = srv.args
    model = args.model_name

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # As uvicorn does: without it, Nagle holds each small SSE chunk
            # back behind the client's delayed ACK (~40 ms) and the pacing is lost.
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *a) -> None:
            pass

        def _send(self, status: int, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            try:
                obj = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                return {}
            return obj if isinstance(obj, dict) else {}

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send(200, "", "text/plain")
            elif self.path == "/metrics":
                if args.metrics_delay_ms:
                    time.sleep(args.metrics_delay_ms / 1000.0)
                srv.gauges()
                self._send(200, generate_latest(srv.registry).decode(), "text/plain; version=0.0.4")
            elif self.path == "/requests":
                with srv.log_lock:
                    entries = [dict(e) for e in srv.log]
                self._send(200, json.dumps(entries))
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [
                    {"id": model, "object": "model", "root": None, "max_model_len": args.max_model_len}]}))
            else:
                self._send(404, json.dumps({"error": {"message": "not found", "code": 404}}))

        def do_POST(self) -> None:  # noqa: N802
            body = self._body()
            if self.path == "/tokenize":
                toks = srv.vocab.encode(str(body.get("prompt", "")))
                self._send(200, json.dumps({"tokens": toks, "count": len(toks), "max_model_len": args.max_model_len}))
            elif self.path == "/detokenize":
                self._send(200, json.dumps({"prompt": srv.vocab.decode(list(body.get("tokens") or []))}))
            elif self.path in ("/v1/completions", "/v1/chat/completions"):
                if (body.get("max_tokens") or 16) > 1 and srv.drop_this():
                    # Closed without a word: the client reads "disconnected"
                    # while /v1/models still answers.
                    with srv.log_lock:
                        srv.log.append({"arrive": time.monotonic(), "dropped": True,
                                        "max_tokens": body.get("max_tokens")})
                    self.close_connection = True
                    return
                self._stream(body, chat=self.path.endswith("chat/completions"))
            else:
                self._send(404, json.dumps({"error": {"message": "not found", "code": 404}}))

        def _chunk(self, payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _stream(self, body: dict, chat: bool) -> None:
            t_arrive = time.perf_counter()
            entry = {"arrive": time.monotonic(), "slot": None, "first": None, "end": None,
                     "max_tokens": body.get("max_tokens"), "ignore_eos": body.get("ignore_eos"),
                     "stream_options": body.get("stream_options"),
                     "sampling": {k: body[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty")
                                  if k in body}}
            with srv.log_lock:
                srv.log.append(entry)
            if chat:
                msgs = body.get("messages") or []
                prompt = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
            else:
                prompt = str(body.get("prompt", ""))
            n_prompt = len(prompt.split())
            n_out = int(body.get("max_tokens") or 16)
            if n_prompt + n_out > args.max_model_len:
                msg = (f"This model's maximum context length is {args.max_model_len} tokens. However, you "
                       f"requested {n_prompt + n_out} tokens ({n_prompt} in the messages, {n_out} in the "
                       "completion). Please reduce the length of the messages or completion.")
                self._send(400, json.dumps({"error": {"message": msg, "type": "BadRequestError", "code": 400}}))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            obj = "chat.completion.chunk" if chat else "text_completion"
            rid = f"cmpl-{id(self):x}"
            opts = body.get("stream_options") or {}
            final_usage = bool(opts.get("include_usage"))
            usage_every_chunk = final_usage and bool(opts.get("continuous_usage_stats"))

            def event(k: int, finish: str | None, choices: bool = True) -> str:
                usage = {"prompt_tokens": n_prompt, "completion_tokens": k, "total_tokens": n_prompt + k}
                ch: list = []
                if choices:
                    piece = f" w{k}"
                    ch = [{"index": 0, "delta": {"content": piece}, "finish_reason": finish} if chat else
                          {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}]
                out = {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": ch}
                if usage_every_chunk or not choices:
                    out["usage"] = usage
                return json.dumps(out)

            entry["prompt_tokens"] = n_prompt
            srv.slots.acquire()
            entry["slot"] = time.monotonic()
            srv.gauges()
            m = model
            try:
                srv.c_prompt.labels(m).inc(n_prompt)
                with srv.seen_lock:
                    if args.prefix_block > 0:
                        cached = block_hits(srv.vocab.encode(prompt), args.prefix_block, srv.seen_blocks)
                    else:
                        cached = n_prompt if prompt in srv.seen_prompts else 0
                        srv.seen_prompts.add(prompt)
                srv.c_prefix_q.labels(m).inc(n_prompt)
                srv.c_prefix_hits.labels(m).inc(cached)
                if chat:
                    self._chunk(json.dumps({"id": rid, "object": obj, "model": model, "choices": [
                        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}))
                # Pace against deadlines, not sleeps in a row, so delays do not add up.
                t_slot = time.perf_counter()
                ttft_s, itl_s = srv.paced_ttft_s(id(self), n_prompt, n_out, t_slot,
                                                 cached if args.prefix_block > 0 else 0)
                t_first = t_slot + ttft_s * srv.drift() + srv.cold_delay_s(n_out)
                prev = None
                due = t_first
                for k in range(1, n_out + 1):
                    if k > 1:
                        gap = (itl_s * srv.batch_scale() + srv.batch_extra_s()) * srv.wander(due)
                        due += gap * srv.drift() + srv.jitter_s(time.time(), random.random())
                    delay = due - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    self._chunk(event(k, "length" if k == n_out else None))
                    now = time.perf_counter()
                    if prev is None:
                        entry["first"] = time.monotonic()
                        srv.h_ttft.labels(m).observe(now - t_arrive)
                        srv.h_queue.labels(m).observe(t_slot - t_arrive)
                        srv.h_prefill.labels(m).observe(now - t_slot)
                    else:
                        srv.h_itl.labels(m).observe(now - prev)
                    prev = now
                    srv.c_gen.labels(m).inc()
                if final_usage:
                    self._chunk(event(n_out, None, choices=False))
                # Counted and logged before the stream's last bytes: a client that
                # has read its whole stream then finds its request done in
                # /requests and /metrics, with no race against this thread.
                srv.h_e2e.labels(m).observe(time.perf_counter() - t_arrive)
                srv.h_inference.labels(m).observe(time.perf_counter() - t_slot)
                srv.c_ok.labels(m).inc()
                srv.h_prompt.labels(m).observe(n_prompt)
                srv.h_gen.labels(m).observe(n_out)
                srv.h_max.labels(m).observe(n_out)
                entry["end"] = time.monotonic()
                self._chunk("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away: vLLM aborts the request
            finally:
                srv.done(id(self))
                srv.slots.release()
                srv.gauges()

    return Handler


class _Http(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


# -- engine-shaped pacing (issue #46, `ernie-tui tune`'s stand-in) -----------------
# With --engine-shaped (env PACED_ENGINE_SHAPED=1, as a preset's env sets it)
# the pacing comes from two of vLLM's engine arguments on the command line,
# so a tune over them has a known answer. With S = --max-num-seqs and
# B = --max-num-batched-tokens:
#   slots = min(S, B // 512)   a step's token budget holds B/512 requests' work
#   gap   = 20 ms + 2 ms x B/1024 + 0.25 ms x slots**2
#           (a step that may carry a bigger prefill chunk is slower; a bigger
#           batch is slower per step, faster than linearly: #17598's ITL growth)
# Under a TTFT objective that queueing breaks (ttft_p90=100ms) the capacity is
# the slots, and the goodput at it is engine_shaped_goodput(S, B) below.
# Over S in {2,4,8,16,32} x B in {1024,...,16384} (max_tokens 16) the true
# optimum is B = 4096 with S >= 8: 8 slots, 44 ms gaps, 188 tok/s; only those
# 3 of the 25 cells are within 10 % of it (the next, S >= 16 B 8192: 168 tok/s, 89 %).
SHAPE_TOKENS_PER_SLOT = 512


def engine_shape(max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, float]:
    """(slots, gap between tokens in ms) of the engine-shaped stand-in."""
    slots = max(1, min(max_num_seqs, max_num_batched_tokens // SHAPE_TOKENS_PER_SLOT))
    return slots, 20.0 + 2.0 * max_num_batched_tokens / 1024 + 0.25 * slots * slots


def engine_shaped_goodput(max_num_seqs: int, max_num_batched_tokens: int, max_tokens: int = 16,
                          ttft_ms: float = 20.0) -> float:
    """The true goodput (output tok/s) at capacity: every slot busy, each
    request its TTFT then max_tokens - 1 gaps."""
    slots, gap_ms = engine_shape(max_num_seqs, max_num_batched_tokens)
    return slots * max_tokens * 1000.0 / (ttft_ms + (max_tokens - 1) * gap_ms)


def apply_engine_shape(args: argparse.Namespace, engine_argv: list[str]) -> None:
    """Set --slots and --itl-ms from vLLM's --max-num-seqs and
    --max-num-batched-tokens (vLLM's defaults, 256 and 8192, when absent)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    engine, _rest = p.parse_known_args(engine_argv)
    args.slots, args.itl_ms = engine_shape(engine.max_num_seqs, engine.max_num_batched_tokens)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    env = os.environ.get
    p.add_argument("--slots", type=int, default=int(env("PACED_SLOTS", "4")),
                   help="requests served at once (the capacity; env PACED_SLOTS)")
    p.add_argument("--ttft-ms", type=float, default=float(env("PACED_TTFT_MS", "20")),
                   help="slot taken -> first token (env PACED_TTFT_MS)")
    p.add_argument("--itl-ms", type=float, default=float(env("PACED_ITL_MS", "10")),
                   help="between tokens (env PACED_ITL_MS)")
    p.add_argument("--cold-requests", type=int, default=int(env("PACED_COLD_REQUESTS", "0")),
                   help="the first N requests that decode more than one token are cold (env PACED_COLD_REQUESTS)")
    p.add_argument("--cold-ms", type=float, default=float(env("PACED_COLD_MS", "0")),
                   help="extra time to first token of a cold request (env PACED_COLD_MS)")
    p.add_argument("--metrics-delay-ms", type=float, default=float(env("PACED_METRICS_DELAY_MS", "0")),
                   help="/metrics answers this late, as a busy vLLM CPU server does (env PACED_METRICS_DELAY_MS)")
    p.add_argument("--prefill-ms-per-token", type=float, default=float(env("PACED_PREFILL_MS_PER_TOKEN", "0")),
                   help="prefill time per prompt token, added to the TTFT (env PACED_PREFILL_MS_PER_TOKEN)")
    p.add_argument("--prefix-block", type=int, default=int(env("PACED_PREFIX_BLOCK", "0")), metavar="N",
                   help="a prefix cache of N-token blocks: hits in whole blocks, prefill paid only after them "
                        "(env PACED_PREFIX_BLOCK; 0: a hit is a whole prompt sent before, prefill paid in full)")
    p.add_argument("--interference-ms", type=float, default=float(env("PACED_INTERFERENCE_MS", "0")),
                   help="TTFT added per other request still decoding when this one's prefill ends")
    p.add_argument("--itl-spread", type=float, default=0.0, metavar="F",
                   help="each decoding request's ITL drawn within itl x (1 +- F), seeded by its order")
    p.add_argument("--itl-knee", type=int, default=int(env("PACED_ITL_KNEE", "0")), metavar="K",
                   help="with --itl-slope-ms: requests in slots beyond K slow every gap (env PACED_ITL_KNEE)")
    p.add_argument("--itl-slope-ms", type=float, default=float(env("PACED_ITL_SLOPE_MS", "0")), metavar="X",
                   help="each gap between tokens grows X ms per request in a slot beyond --itl-knee "
                        "(env PACED_ITL_SLOPE_MS)")
    p.add_argument("--itl-scale-knee", type=int, default=int(env("PACED_ITL_SCALE_KNEE", "0")), metavar="K",
                   help="every gap is itl x max(1, requests in slots / K) (env PACED_ITL_SCALE_KNEE)")
    p.add_argument("--drift", type=float, default=float(env("PACED_DRIFT", "0")), metavar="A",
                   help="host speed drift: gaps and TTFT x (1 + A sin(2 pi wall_time / P)) (env PACED_DRIFT)")
    p.add_argument("--drift-period-s", type=float, default=float(env("PACED_DRIFT_PERIOD_S", "120")), metavar="P",
                   help="the drift's period, seconds of wall time (env PACED_DRIFT_PERIOD_S; 120)")
    p.add_argument("--tail-jitter", type=float, default=float(env("PACED_TAIL_JITTER", "0")), metavar="P",
                   help="the share of --tail-jitter-s periods whose tail spikes (env PACED_TAIL_JITTER)")
    p.add_argument("--tail-jitter-ms", type=float, default=float(env("PACED_TAIL_JITTER_MS", "0")), metavar="X",
                   help="in a spiky period one gap in 20 is this much longer (env PACED_TAIL_JITTER_MS)")
    p.add_argument("--tail-jitter-s", type=float, default=float(env("PACED_TAIL_JITTER_S", "5")), metavar="S",
                   help="the spiky periods' length, seconds of wall time (env PACED_TAIL_JITTER_S; 5)")
    p.add_argument("--itl-wander", type=float, default=0.0, metavar="F",
                   help="gaps that start in one --itl-wander-s period share one factor within 1 +- F")
    p.add_argument("--itl-wander-s", type=float, default=1.0, metavar="P")
    p.add_argument("--slow-every", type=int, default=0, metavar="K",
                   help="every K-th decoding request waits --slow-ms more for its first token")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--stall-period-s", type=float, default=0.0,
                   help="correlated latency: requests arriving in the last --stall-s of each period "
                        "wait --stall-ms more for their first token")
    p.add_argument("--stall-s", type=float, default=0.0)
    p.add_argument("--stall-ms", type=float, default=0.0)
    p.add_argument("--drop-completions", type=int, default=0, metavar="N",
                   help="close the connections of the first N completion requests that ask for more than one token "
                        "(a warm-up's 1-token requests are answered) without an answer (-1: all of them)")
    p.add_argument("--busy-child", action="store_true",
                   help="a child titled VLLM::EngineCore keeps one CPU core busy while this server lives")
    p.add_argument("--model-name", default="paced")
    p.add_argument("--max-model-len", type=int, default=4096)
    # Launched as a preset's `launcher` it gets vLLM's command line: take the
    # model's name, ignore the engine arguments it has no use for.
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--engine-shaped", action="store_true", default=env("PACED_ENGINE_SHAPED", "") == "1",
                   help="slots and token gaps from --max-num-seqs and --max-num-batched-tokens (see "
                        "engine_shape; env PACED_ENGINE_SHAPED=1)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args, _engine_args = p.parse_known_args(argv)
    if not 0 <= args.drift < 1:
        p.error("--drift is a share below 1 (0.3: the host's speed within +-30 %)")
    if args.engine_shaped:
        apply_engine_shape(args, _engine_args)
    if args.served_model_name:
        args.model_name = args.served_model_name
    srv = Server(args)
    if args.busy_child:
        # Spins until its parent, whose pid it is handed, is gone: a server
        # killed outright leaves no busy orphan behind (its own getppid() at
        # start would be init's where the server died before it got there).
        spin = "import os, sys\nq = int(sys.argv[1])\nwhile os.getppid() == q: pass"
        subprocess.Popen(["VLLM::EngineCore", "-c", spin, str(os.getpid())], executable=sys.executable)
    httpd = _Http((args.host, args.port), make_handler(srv))
    host, port = httpd.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')} pid={os.getpid()}", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
