"""How much CPU does a load-generating client spend per streamed token?

The burst must never be the bottleneck of what it measures. This script
starts a fast stand-in for vLLM's streaming /v1/completions endpoint in its
own process (pre-built bytes; one SSE event per request per engine "step",
with vLLM's continuous usage stats; tokens held back and merged into one event
while a connection's socket is full, as vLLM's output loop merges them for a
slow reader), then runs each candidate client in a fresh process at
concurrency C and reports, side by side in one run:

- CPU seconds per streamed token of the client process (user + system,
  getrusage) and of the stand-in server (psutil), so it is visible that the
  server was not the limit;
- delivered output tokens/s with the server stepping as fast as it can
  (`--step-ms 0`, the client's ceiling) or at a fixed step (a paced engine);
- mean TTFT as the client saw it minus the server's own (request fully read
  -> first token written): the client's TTFT overhead.

Candidates: our burst path (`probe.stream_request`, httpx or aiohttp
transport, optionally uvloop, optionally several processes) and vLLM's own
benchmark client (`vllm.benchmarks.lib.endpoint_request_func`, aiohttp), the
reference. Every candidate counts tokens from the server's usage, so a client
that loses tokens shows it.

    .venv/bin/python bench/client_cpu.py [--concurrency 256 1024] [--tokens 64]
        [--requests-per-conn 2] [--step-ms 0] [--candidates ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parent.parent / "src"

# ---------------------------------------------------------------------------
# The stand-in server


_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")
_MAX_TOKENS = re.compile(rb'"max_tokens"\s*:\s*(\d+)')
PROMPT_TOKENS = 100


def _event(k: int, n: int, finish: str | None) -> bytes:
    """One vLLM completions chunk carrying tokens k-n+1..k, as an HTTP/1.1 chunk."""
    obj = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1764000000,
           "model": "m", "choices": [{"index": 0, "text": " tok" * n, "logprobs": None,
                                      "finish_reason": finish, "stop_reason": None}],
           "usage": {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS + k,
                     "completion_tokens": k}}
    data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _tail(k: int) -> bytes:
    obj = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1764000000,
           "model": "m", "choices": [],
           "usage": {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS + k, "completion_tokens": k}}
    usage = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
    done = b"data: [DONE]\n\n"
    return (b"%x\r\n%s\r\n" % (len(usage), usage)) + (b"%x\r\n%s\r\n" % (len(done), done)) + b"0\r\n\r\n"


_STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"transfer-encoding: chunked\r\n\r\n")


class _Stream:
    __slots__ = ("conn", "sent", "total", "t_arrival", "held")

    def __init__(self, conn, total: int, t_arrival: float) -> None:
        self.conn = conn
        self.sent = 0
        self.total = total
        self.t_arrival = t_arrival
        self.held = 0


class StandIn:
    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.streams: list[_Stream] = []
        self.wake = asyncio.Event()
        self.events: dict[tuple[int, int, bool], bytes] = {}
        self.tails: dict[int, bytes] = {}
        self.stats = {"requests": 0, "ttft_sum": 0.0, "tokens": 0, "merged_events": 0}

    def event(self, k: int, n: int, last: bool) -> bytes:
        key = (k, n, last)
        b = self.events.get(key)
        if b is None:
            b = self.events[key] = _event(k, n, "length" if last else None)
        return b

    def start(self, conn, total: int) -> None:
        conn.transport.write(_STREAM_HEAD)
        self.streams.append(_Stream(conn, total, time.perf_counter()))
        self.wake.set()

    async def stepper(self) -> None:
        next_t = time.perf_counter()
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
                next_t = time.perf_counter()
            keep = []
            now = time.perf_counter()
            for s in self.streams:
                tr = s.conn.transport
                if tr.is_closing():
                    continue
                if s.sent and tr.get_write_buffer_size() > 0:
                    s.held += 1  # the reader is behind: hold the token, send it merged later
                    keep.append(s)
                    continue
                n = min(1 + s.held, s.total - s.sent) if s.sent else 1
                if n > 1:
                    self.stats["merged_events"] += 1
                k = s.sent + n
                last = k >= s.total
                data = self.event(k, n, last)
                if s.sent == 0:
                    self.stats["requests"] += 1
                    self.stats["ttft_sum"] += now - s.t_arrival
                if last:
                    tail = self.tails.get(k)
                    if tail is None:
                        tail = self.tails[k] = _tail(k)
                    tr.write(data + tail)
                else:
                    tr.write(data)
                    keep.append(s)
                s.sent = k
                s.held = 0
                self.stats["tokens"] += n
            self.streams = keep
            if self.step_s > 0:
                next_t += self.step_s
                delay = next_t - time.perf_counter()
                if delay < 0:
                    next_t = time.perf_counter()
                await asyncio.sleep(max(0.0, delay))
            else:
                await asyncio.sleep(0)


class _Conn(asyncio.Protocol):
    def __init__(self, server: StandIn) -> None:
        self.server = server
        self.buf = b""
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            m = _CONTENT_LENGTH.search(head)
            length = int(m.group(1)) if m else 0
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            self.request(head, body)

    def _json(self, obj) -> None:
        body = json.dumps(obj).encode()
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))

    def request(self, head: bytes, body: bytes) -> None:
        s = self.server
        if head.startswith(b"GET /stats"):
            self._json(s.stats)
        elif head.startswith(b"GET /reset"):
            s.stats = {"requests": 0, "ttft_sum": 0.0, "tokens": 0, "merged_events": 0}
            self._json(s.stats)
        elif head.startswith(b"GET"):
            self._json({"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]})
        else:
            m = _MAX_TOKENS.search(body)
            s.start(self, int(m.group(1)) if m else 16)


def serve_main(args: argparse.Namespace) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def main() -> None:
        server = StandIn(args.step_ms / 1000.0)
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(lambda: _Conn(server), "127.0.0.1", args.port, backlog=4096)
        print("ready", flush=True)
        async with srv:
            await server.stepper()

    asyncio.run(main())


# ---------------------------------------------------------------------------
# The candidate clients (each runs in its own process)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


BASE_COMMIT = "6182abe"  # the probe before this benchmark: httpx, the per-line SSE parser


def _probe_module(kind: str):
    """Our probe module: as it is now, or (kind "before") as it was at
    BASE_COMMIT, read from git, so the old path runs side by side."""
    if kind != "before":
        # The module itself, not its names: the 'before' side is a whole module too.
        import ernie_tui.engine_ctl.load.probe as probe

        return probe
    import importlib.util
    import tempfile

    src = subprocess.run(["git", "-C", str(HERE.parent), "show", f"{BASE_COMMIT}:src/ernie_tui/engine_ctl/probe.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "probe_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("probe_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["probe_before"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


async def _run_ours(url: str, conc: int, n: int, tokens: int, kind: str) -> dict:
    P = _probe_module(kind)
    req = P.ProbeRequest(prompt="hello " * 10, max_tokens=tokens, temperature=None, top_p=None, ignore_eos=True)
    client = (P.new_async_client(None, 60.0, max_connections=conc + 2) if kind == "before"
              else P.new_async_client(None, 60.0, max_connections=conc + 2, transport=kind))
    results = []
    async with client:
        warm = P.ProbeRequest(prompt="hi", max_tokens=1, temperature=None, top_p=None)
        await asyncio.gather(*(P.stream_request(client, url, warm, "m") for _ in range(conc)))
        queue = list(range(n))

        async def worker() -> None:
            while queue:
                queue.pop()
                results.append(await P.stream_request(client, url, req, "m", read_timeout=60.0))

        cpu0, t0 = _cpu(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    ok = [r for r in results if r.ok]
    errors = sorted({str(r.error) for r in results if not r.ok})[:3]
    return {"wall_s": wall, "cpu_s": cpu, "requests": len(ok), "tokens": sum(r.completion_tokens or 0 for r in ok),
            "ttft_sum": sum(r.ttft_s or 0.0 for r in ok), "errors": errors}


async def vllm_bench_outputs(url: str, conc: int, n: int, tokens: int) -> tuple[list, float, float]:
    """vLLM's bench client's request function, closed loop at `conc`: n
    requests of `tokens` output tokens after one 1-token request per
    connection. Its RequestFuncOutputs, the wall and the CPU seconds of the
    timed part (bench/level_client_cost.py uses it too)."""
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    # The session as vllm.benchmarks.serve makes it.
    connector = aiohttp.TCPConnector(limit=conc, limit_per_host=conc, ttl_dns_cache=300, use_dns_cache=True,
                                     keepalive_timeout=60, enable_cleanup_closed=True, force_close=False,
                                     ssl=False)
    results = []
    async with aiohttp.ClientSession(connector=connector, trust_env=True,
                                     timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
        api = url + "/v1/completions"

        def inp(out_len: int) -> RequestFuncInput:
            return RequestFuncInput(prompt="hello " * 10, api_url=api, prompt_len=11, output_len=out_len,
                                    model="m", ignore_eos=True)
        await asyncio.gather(*(async_request_openai_completions(inp(1), session) for _ in range(conc)))
        queue = list(range(n))

        async def worker() -> None:
            while queue:
                queue.pop()
                results.append(await async_request_openai_completions(inp(tokens), session))

        cpu0, t0 = _cpu(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    return results, wall, cpu


async def _run_vllm_bench(url: str, conc: int, n: int, tokens: int) -> dict:
    results, wall, cpu = await vllm_bench_outputs(url, conc, n, tokens)
    ok = [r for r in results if r.success]
    errors = sorted({r.error[-200:] for r in results if not r.success})[:3]
    return {"wall_s": wall, "cpu_s": cpu, "requests": len(ok), "tokens": sum(r.output_tokens or 0 for r in ok),
            "ttft_sum": sum(r.ttft for r in ok), "errors": errors}


def client_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(SRC))
    if args.uvloop:
        import uvloop
        uvloop.install()
    if args.kind == "vllm-bench":
        coro = _run_vllm_bench(args.url, args.concurrency, args.requests, args.tokens)
    else:
        coro = _run_ours(args.url, args.concurrency, args.requests, args.tokens, args.kind)
    print(json.dumps(asyncio.run(coro)), flush=True)


# ---------------------------------------------------------------------------
# The comparison

CANDIDATES = {
    # name: (kind, uvloop, processes)
    "before: httpx, old parser": ("before", False, 1),
    "httpx, new parser": ("httpx", False, 1),
    "aiohttp": ("aiohttp", False, 1),
    "aiohttp + uvloop (burst now)": ("aiohttp", True, 1),
    "aiohttp + uvloop, 2 procs": ("aiohttp", True, 2),
    "vLLM bench client": ("vllm-bench", False, 1),
}


def _get(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def run_candidate(name: str, url: str, conc: int, requests: int, tokens: int, server_pid: int) -> dict:
    import psutil

    kind, uvloop_on, procs = CANDIDATES[name]
    _get(url + "/reset")
    server = psutil.Process(server_pid)
    s0 = sum(server.cpu_times()[:2])
    argv = [sys.executable, str(HERE), "client", "--kind", kind, "--url", url,
            "--concurrency", str(max(1, conc // procs)), "--requests", str(requests // procs),
            "--tokens", str(tokens)] + (["--uvloop"] if uvloop_on else [])
    t0 = time.perf_counter()
    children = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    outs = [json.loads(c.communicate()[0].strip().splitlines()[-1]) for c in children]
    wall_total = time.perf_counter() - t0
    server_cpu = sum(server.cpu_times()[:2]) - s0
    st = _get(url + "/stats")
    tok = sum(o["tokens"] for o in outs)
    reqs = sum(o["requests"] for o in outs)
    wall = max(o["wall_s"] for o in outs)
    cpu = sum(o["cpu_s"] for o in outs)
    ttft_client = sum(o["ttft_sum"] for o in outs) / max(1, reqs)
    # the server's stats include the warm-up requests (1 token each); subtract them
    warm = conc if procs == 1 else (conc // procs) * procs
    srv_ttft = st["ttft_sum"] / max(1, st["requests"])
    return {"candidate": name, "concurrency": conc, "requests": reqs, "tokens": tok,
            "expected_tokens": requests // procs * procs * tokens, "server_tokens": st["tokens"] - warm,
            "wall_s": wall, "tok_per_s": tok / wall, "client_cpu_s": cpu,
            "client_cpu_us_per_token": cpu / max(1, tok) * 1e6, "client_cpu_util": cpu / wall,
            "server_cpu_us_per_token": server_cpu / max(1, tok) * 1e6,
            "server_cpu_util": server_cpu / max(1e-9, wall_total),
            "merged_events": st["merged_events"], "ttft_client_ms": ttft_client * 1e3,
            "ttft_server_ms": srv_ttft * 1e3, "ttft_overhead_ms": (ttft_client - srv_ttft) * 1e3,
            "errors": [e for o in outs for e in o["errors"]]}


def main_compare(args: argparse.Namespace) -> None:
    from ernie_tui.engine_ctl.launch import free_port

    port = free_port("127.0.0.1")
    server = subprocess.Popen([sys.executable, str(HERE), "serve", "--port", str(port),
                               "--step-ms", str(args.step_ms)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        rows = []
        for conc in args.concurrency:
            for rnd in range(args.rounds):
                for name in args.candidates:
                    row = run_candidate(name, url, conc, conc * args.requests_per_conn, args.tokens, server.pid)
                    row["round"] = rnd
                    rows.append(row)
                    print(f"C={conc:5d} {name:30s} {row['tok_per_s']:9.0f} tok/s  "
                          f"client {row['client_cpu_us_per_token']:6.1f} us/tok ({row['client_cpu_util']:.2f} core)  "
                          f"server {row['server_cpu_us_per_token']:5.1f} us/tok ({row['server_cpu_util']:.2f} core)  "
                          f"TTFT overhead {row['ttft_overhead_ms']:7.1f} ms  merged {row['merged_events']}"
                          f"  tokens {row['tokens']}/{row['expected_tokens']}"
                          + (f"  errors {row['errors']}" if row["errors"] else ""), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--step-ms", type=float, default=0.0)
    c = sub.add_parser("client")
    c.add_argument("--kind", required=True)
    c.add_argument("--url", required=True)
    c.add_argument("--concurrency", type=int, required=True)
    c.add_argument("--requests", type=int, required=True)
    c.add_argument("--tokens", type=int, required=True)
    c.add_argument("--uvloop", action="store_true")
    for p in (ap,):
        p.add_argument("--concurrency", type=int, nargs="+", default=[256, 1024])
        p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
        p.add_argument("--requests-per-conn", type=int, default=2)
        p.add_argument("--step-ms", type=float, default=0.0, help="engine step of the stand-in; 0: as fast as it can")
        p.add_argument("--rounds", type=int, default=1)
        p.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
        p.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if args.cmd == "serve":
        serve_main(args)
    elif args.cmd == "client":
        client_main(args)
    else:
        sys.path.insert(0, str(SRC))
        main_compare(args)


if __name__ == "__main__":
    main()
