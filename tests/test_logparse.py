"""LogParser: real vLLM logs -> EngineReport, older log wording, error root causes, fuzz.

Expected values come from tests/fixtures/vllm-logs/README.md (real captures).
Synthetic lines for forms the fixtures lack use vLLM's own message wording.
"""

from __future__ import annotations

import json
import random
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ernie_tui.cli import main as cli_main
from ernie_tui.engine_ctl.logs.errors import ErrorKind, classify_error
from ernie_tui.engine_ctl.logs.logparse import LogParser, parse_file, parse_lines
from ernie_tui.engine_ctl.logs.report import PHASES

GPU = "gpu-h200-vllm0.26.0"
CPU = "cpu-vllm0.32.0"


def v(msg: str, level: str = "INFO", role: str = "EngineCore", pid: int = 7, src: str = "x.py:1") -> str:
    """A line in vLLM's current format."""
    return f"({role} pid={pid}) {level} 11-30 03:20:09 [{src}] {msg}"


def old(msg: str, level: str = "INFO", src: str = "worker.py:1") -> str:
    """A line in the pre-0.8 format (no process prefix)."""
    return f"{level} 10-10 10:23:27 {src}] {msg}"


def read_lines(path) -> list[str]:
    # newline="" keeps \r inside lines, as parse_file sees them (it splits on \n only)
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        return f.read().split("\n")[:-1]


# --------------------------------------------------------------------------- the fixture logs


def test_gpu_ok_block16_len4096(fixtures_dir):
    r = parse_file(fixtures_dir / GPU / "ok_block16_len4096.log")
    assert r.vllm_version == "0.26.0"
    assert r.platform == "cuda"
    assert r.model == "/models/ernie-4.5-0.3b-shape"
    assert r.architecture == "Ernie4_5ForCausalLM"
    assert r.non_default_args == {"host": "127.0.0.1", "model": "/models/ernie-4.5-0.3b-shape",
                                  "max_model_len": 4096, "served_model_name": ["ernie-4.5-0.3b"],
                                  "block_size": 16}
    assert r.block_size == 16
    assert r.max_model_len == 4096
    assert r.attention_backend == "FLASH_ATTN"
    assert r.weights_gib == 0.7
    assert r.weights_load_seconds == pytest.approx(1.961248)
    assert r.compile_seconds == 17.25
    assert r.kv_cache_gib == 127.4
    assert r.kv_cache_tokens == 7_421_344
    assert r.max_concurrency == 1811.85
    assert r.cuda_graph_seconds == 3
    assert r.cuda_graph_gib == 0.40
    assert r.init_engine_seconds == 37.92
    assert r.server_url == "http://127.0.0.1:8000"
    assert r.ready is True and r.phase == "ready" and r.error is None
    assert r.phases == {"load_weights": pytest.approx(1.961248), "compile": 17.25, "kv_profiling": 0.16,
                        "cuda_graphs": 3.0}
    assert r.pids == {"APIServer": 1938, "EngineCore": 2040}
    assert r.lines == 408
    assert len(r.stats) == 1
    s = r.stats[0]
    assert (s.timestamp, s.prompt_tps, s.generation_tps, s.running, s.waiting, s.kv_usage_pct,
            s.prefix_hit_pct, s.line_no) == ("11-30 03:21:00", 3024.1, 3475.3, 8, 0, 0.0, 31.4, 386)


def test_gpu_ok_util016(fixtures_dir):
    r = parse_file(fixtures_dir / GPU / "ok_util0.16_block16_len4096.log")
    assert (r.kv_cache_gib, r.kv_cache_tokens, r.max_concurrency) == (21.19, 1_234_512, 301.39)
    assert r.non_default_args["gpu_memory_utilization"] == 0.16
    assert r.compile_seconds == 3.58 and r.init_engine_seconds == 24.92
    assert (r.cuda_graph_seconds, r.cuda_graph_gib) == (2, 0.40)
    assert r.ready and r.error is None and r.attention_backend == "FLASH_ATTN"
    assert r.stats[-1].running == 12 and r.stats[-1].prefix_hit_pct == 12.6


def test_gpu_fail_block8(fixtures_dir):
    r = parse_file(fixtures_dir / GPU / "fail_block8_len2048.log")
    assert r.block_size == 8 and r.max_model_len == 2048 and r.platform == "cuda"
    e = r.error
    assert e.kind is ErrorKind.BLOCK_SIZE_UNSUPPORTED
    assert e.message.startswith("ValueError: No valid attention backend found for cuda")
    assert "block_size=8" in e.message
    assert e.detail["block_size"] == 8
    assert e.line_no == 96  # the first ValueError line, not the wrapper at the end
    assert not r.ready and r.phase == "load_weights"


def test_gpu_fail_len_over_derived(fixtures_dir):
    r = parse_file(fixtures_dir / GPU / "fail_len_over_derived.log")
    e = r.error
    assert e.kind is ErrorKind.MAX_MODEL_LEN_TOO_LARGE
    assert "User-specified max_model_len (262144) is greater than the derived max_model_len" in e.message
    assert "[type=" not in e.message and "input_value" not in e.message
    assert e.detail == {"requested": 262144, "derived": 131072}
    assert e.line_no == 47
    assert r.max_model_len == 262144 and not r.ready


def test_gpu_fail_no_cache_memory(fixtures_dir):
    r = parse_file(fixtures_dir / GPU / "fail_no_cache_memory_util0.005.log")
    assert r.error.kind is ErrorKind.NO_CACHE_MEMORY
    assert r.error.message.startswith("ValueError: No available memory for the cache blocks.")
    assert r.error.line_no == 57
    assert r.kv_cache_gib == -0.52
    assert r.compile_seconds == 18.49 and r.max_model_len == 131072
    assert r.phase == "kv_profiling" and not r.ready


def test_gpu_fail_unknown_argument(fixtures_dir):
    r = parse_file(fixtures_dir / GPU / "fail_unknown_arg_enable_paged_attn.log")
    assert r.error.kind is ErrorKind.UNKNOWN_ARGUMENT
    assert r.error.detail["argument"] == "--enable-paged-attn"
    assert r.error.message == "api_server.py: error: unrecognized arguments: --enable-paged-attn"
    assert r.error.line_no == 262 and r.lines == 262


def test_cpu_ok_block32(fixtures_dir):
    r = parse_file(fixtures_dir / CPU / "ok_block32_len2048.log")
    assert r.vllm_version == "0.32.0" and r.platform == "cpu"
    assert r.model == "/models/tiny-ernie" and r.architecture == "Ernie4_5ForCausalLM"
    assert r.block_size == 32 and r.max_model_len == 2048
    assert r.kv_cache_tokens == 65_536 and r.max_concurrency == 32.00
    assert r.kv_cache_gib == 64 / 1024  # from kv_cache_memory_bytes, not the rounded "0.06"
    assert r.init_engine_seconds == 10.34 and r.weights_load_seconds == 0.01
    assert r.server_url == "http://127.0.0.1:18001" and r.ready and r.error is None
    assert r.pids == {"APIServer": 13903, "EngineCore": 13938, "Worker_0": 13964}
    # CPU states no compile time: the model runner's warm-up (which compiles)
    # is timed by its stamps, 03:35:37 "Warming up model" to 03:35:47 (issue #18, 8).
    assert r.phases == {"load_weights": 0.01, "compile": 10.0, "kv_profiling": 0.02}
    assert r.compile_seconds == 10.0
    assert r.attention_backend == "CPU_ATTN" and r.attention_implied  # CPU logs no backend line
    assert [s.prompt_tps for s in r.stats] == [13.5, 0.0]
    assert r.stats[0].generation_tps == 225.1 and r.stats[0].timestamp == "11-30 03:35:58"
    assert r.cuda_graph_seconds is None


def test_cpu_fail_block16(fixtures_dir):
    r = parse_file(fixtures_dir / CPU / "fail_block16.log")
    assert r.vllm_version == "0.32.0" and r.model == "/models/tiny-ernie"  # from the ASCII-art banner
    e = r.error
    assert e.kind is ErrorKind.BLOCK_SIZE_UNSUPPORTED
    assert e.message == "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
    assert e.detail["block_size"] == 16
    assert e.line_no == 90


def test_cpu_fail_kv_too_small(fixtures_dir):
    r = parse_file(fixtures_dir / CPU / "fail_kv_too_small.log")
    e = r.error
    assert e.kind is ErrorKind.KV_CACHE_TOO_SMALL
    assert e.estimated_max_model_len == 992
    assert e.detail["max_model_len"] == 4096
    assert e.line_no == 83
    assert r.kv_cache_gib == 1 / 1024


def test_cpu_fail_insufficient_free_memory(fixtures_dir):
    r = parse_file(fixtures_dir / CPU / "fail_insufficient_free_memory.log")
    e = r.error
    assert e.kind is ErrorKind.INSUFFICIENT_FREE_MEMORY
    assert e.message.startswith("ValueError: Available memory on node 0 (9.28/10.59 GiB)")
    assert e.detail == {"free_gib": 9.28, "total_gib": 10.59, "utilization": 0.92, "requested_gib": 9.74}
    assert e.line_no == 49
    assert r.pids["Worker_0"] == 14339  # "(VllmWorker-0 pid=14339)"


def all_fixture_logs(fixtures_dir):
    return sorted(fixtures_dir.glob("*/*.log"))


def test_feed_line_by_line_equals_parse_file(fixtures_dir):
    for path in all_fixture_logs(fixtures_dir):
        parser = LogParser()
        for line in read_lines(path):
            parser.feed(line + "\n")  # a trailing newline is fine
        assert parser.report.to_dict(include_stats=True) == parse_file(path).to_dict(include_stats=True), path
        assert parser.internal_errors == 0


def test_parse_lines_accepts_str_and_bytes(fixtures_dir):
    path = fixtures_dir / CPU / "ok_block32_len2048.log"
    as_bytes = path.read_bytes().split(b"\n")[:-1]
    assert parse_lines(as_bytes).to_dict() == parse_file(path).to_dict()
    assert parse_lines(read_lines(path)).kv_cache_tokens == 65_536


def test_json_keys_of_the_report(fixtures_dir):
    d = parse_file(fixtures_dir / CPU / "fail_kv_too_small.log").to_dict()
    for key in ("vllm_version", "platform", "block_size", "max_model_len", "attention_backend", "kv_cache_gib",
                "kv_cache_tokens", "max_concurrency", "ready", "error", "phases"):
        assert key in d
    assert d["error"]["kind"] == "kv_cache_too_small"
    assert d["error"]["estimated_max_model_len"] == 992
    json.dumps(d)


# --------------------------------------------------------------------------- what feed() returns


def test_feed_counts_the_report_changes_of_a_gpu_startup(fixtures_dir):
    """feed() returns how many report changes a line made: the server
    publishes the report only after lines that changed it."""
    parser = LogParser()
    phases_seen, changed_lines, quiet_lines = [], 0, 0
    for line in read_lines(fixtures_dir / GPU / "ok_block16_len4096.log"):
        before = (parser.report.phase, parser.report.ready, len(parser.report.stats), parser.report.kv_cache_tokens)
        changes = parser.feed(line)
        after = (parser.report.phase, parser.report.ready, len(parser.report.stats), parser.report.kv_cache_tokens)
        if after != before:
            assert changes > 0, f"a report change not counted: {line!r}"
        if changes:
            changed_lines += 1
        else:
            quiet_lines += 1
        if parser.report.phase and parser.report.phase not in phases_seen:
            phases_seen.append(parser.report.phase)
    r = parser.report
    assert phases_seen == list(PHASES)
    assert r.phases["compile"] == 17.25 and r.phases["cuda_graphs"] == 3.0
    assert r.ready and r.server_url == "http://127.0.0.1:8000"
    assert r.vllm_version == "0.26.0"
    assert {("APIServer", 1938), ("EngineCore", 2040)} <= set(r.pids.items())
    assert r.kv_cache_tokens == 7_421_344 and r.platform == "cuda"
    assert [s.prompt_tps for s in r.stats] == [3024.1]
    assert r.error is None
    # most lines of a log change nothing: those publish nothing
    assert changed_lines > 10 and quiet_lines > changed_lines


def test_error_root_cause_upgrade(fixtures_dir):
    parser = LogParser()
    errors = []
    for line in read_lines(fixtures_dir / CPU / "fail_block16.log"):
        before = parser.report.error
        if parser.feed(line) and parser.report.error is not before:
            errors.append(parser.report.error)
    # "WorkerProc hit an exception." comes first; the ValueError below it replaces it
    assert [e.kind for e in errors] == [ErrorKind.ENGINE_DEAD, ErrorKind.BLOCK_SIZE_UNSUPPORTED]
    assert parser.report.error.kind is ErrorKind.BLOCK_SIZE_UNSUPPORTED


# --------------------------------------------------------------------------- older and other forms


def test_v0_gpu_blocks_times_block_size():
    r = parse_lines([
        old("non-default args: {'model': 'm', 'block_size': 16}", src="api_server.py:1"),
        old("# GPU blocks: 27153, # CPU blocks: 2048", src="executor_base.py:1"),
        old("Maximum concurrency for 32768 tokens per request: 13.26x", src="executor_base.py:2"),
    ])
    assert r.kv_cache_tokens == 27153 * 16
    assert r.max_concurrency == 13.26
    assert r.platform == "cuda"


def test_v0_gpu_blocks_before_block_size_is_known():
    r = parse_lines([old("# cuda blocks: 1000, # CPU blocks: 512")])
    assert r.kv_cache_tokens is None  # unknown block size: no guess
    r = parse_lines([old("# cuda blocks: 1000, # CPU blocks: 512"),
                     old("Initializing an LLM engine (v0.6.4) with config: model='m', block_size=32, x=1")])
    assert r.kv_cache_tokens == 32_000 and r.vllm_version == "0.6.4"


def test_v0_cpu_backend_blocks():
    r = parse_lines([old("non-default args: {'block_size': 32}"), old("# CPU blocks: 7281")])
    assert r.kv_cache_tokens == 7281 * 32 and r.platform == "cpu"


def test_separate_kv_size_and_concurrency_lines():
    r = parse_lines([v("GPU KV cache size: 1,234 tokens", src="kv_cache_utils.py:1"),
                     v("Maximum concurrency for 4,096 tokens per request: 3.02x")])
    assert (r.kv_cache_tokens, r.max_concurrency, r.platform) == (1234, 3.02, "cuda")


def test_v0_stats_line_and_prefix_hit_line():
    r = parse_lines([
        old("Avg prompt throughput: 12.3 tokens/s, Avg generation throughput: 45.6 tokens/s, Running: 3 reqs, "
            "Swapped: 0 reqs, Pending: 2 reqs, GPU KV cache usage: 5.5%, CPU KV cache usage: 0.0%.",
            src="metrics.py:351"),
        old("Prefix cache hit rate: GPU: 12.50%, CPU: 0.00%", src="metrics.py:367"),
    ])
    s = r.stats[-1]
    assert (s.prompt_tps, s.generation_tps, s.running, s.waiting, s.kv_usage_pct) == (12.3, 45.6, 3, 2, 5.5)
    assert s.prefix_hit_pct == 12.5 and s.timestamp == "10-10 10:23:27"


def test_v1_stats_with_optional_parts():
    r = parse_lines([v("Engine 001: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
                       "Running: 4 reqs, Waiting: 5 reqs, Preemptions: 2, GPU KV cache usage: 7.5%, "
                       "Prefix cache hit rate: 9.0%, External prefix cache hit rate: 99.0%", role="APIServer")])
    s = r.stats[0]
    assert (s.running, s.waiting, s.kv_usage_pct, s.prefix_hit_pct) == (4, 5, 7.5, 9.0)


def test_older_startup_wording():
    r = parse_lines([
        old("vLLM API server version 0.6.3.post1", src="api_server.py:1"),
        old("Automatically detected platform cuda.", src="__init__.py:1"),
        old("Using Flash Attention backend.", src="selector.py:1"),
        old("Loading model weights took 14.9888 GB", src="model_runner.py:1"),
        old("torch.compile takes 10.5 s in total", src="monitor.py:1"),
        old("Capturing cudagraphs for decoding. This may lead to unexpected consequences.", src="mr.py:1"),
        old("Graph capturing finished in 12 secs, took 1.25 GiB", src="mr.py:2"),
        old("init engine (profile, create kv cache, warmup model) took 20.10 seconds", src="core.py:1"),
        old("Starting vLLM API server on http://0.0.0.0:8000", src="api_server.py:2"),
        "INFO:     Started server process [6593]",
        "INFO:     Waiting for application startup.",
        "INFO:     Application startup complete.",
        "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
    ])
    assert r.vllm_version == "0.6.3.post1" and r.platform == "cuda"
    assert r.attention_backend == "FLASH_ATTN"
    assert r.weights_gib == 14.9888 and r.compile_seconds == 10.5
    assert (r.cuda_graph_seconds, r.cuda_graph_gib, r.init_engine_seconds) == (12, 1.25, 20.10)
    assert r.server_url == "http://0.0.0.0:8000" and r.ready and r.phase == "ready"
    assert r.pids == {"APIServer": 6593}


@pytest.mark.parametrize("line, backend", [
    ("Using XFormers backend.", "XFORMERS"),
    ("Using FlashInfer backend.", "FLASHINFER"),
    ("Using Flash Attention backend on V1 engine.", "FLASH_ATTN"),
    ("Using TRITON_ATTN attention backend out of potential backends: ['TRITON_ATTN']", "TRITON_ATTN"),
    ("Using CPU_ATTN backend.", "CPU_ATTN"),
])
def test_attention_backend_names(line, backend):
    assert parse_lines([v(line)]).attention_backend == backend


@pytest.mark.parametrize("line", [
    "Using TRITON Unquantized MoE backend out of potential backends: ['TRITON']",
    "Using 'FLASHINFER' NvFp4 MoE backend out of potential backends",
    "Using FlashAttention version 3",
    "Using cache directory: /x for vLLM's torch.compile",
])
def test_not_attention_backends(line):
    assert parse_lines([v(line)]).attention_backend is None


def test_backbone_tag_before_message():
    r = parse_lines([v("[backbone] torch.compile took 4.50 s in total", src="monitor.py:91"),
                     v("[backbone] Initial profiling/warmup run took 0.02 s", src="monitor.py:91")])
    assert r.compile_seconds == 4.5 and r.phases["kv_profiling"] == 0.02 and r.phase == "kv_profiling"


def test_non_default_args_with_non_literal_values():
    r = parse_lines([v("non-default args: {'model': 'm', 'compilation_config': {'mode': <CompilationMode.VLLM_"
                       "COMPILE: 3>, 'level': 3}, 'block_size': 32, 'dtype': torch.bfloat16, 'x': 'a, b'}",
                       role="APIServer")])
    args = r.non_default_args
    assert args["model"] == "m" and args["block_size"] == 32 and args["x"] == "a, b"
    assert args["dtype"] == "torch.bfloat16"
    assert args["compilation_config"].startswith("{'mode': <CompilationMode")
    assert r.block_size == 32


def test_model_from_args_positional_model_tag():
    r = parse_lines([v("non-default args: {'model_tag': '/m/x', 'max_model_len': 100}", role="APIServer")])
    assert r.model == "/m/x" and r.max_model_len == 100


def test_pid_role_names_are_normalized():
    r = parse_lines(["(APIServer pid=1) INFO 11-30 [a.py:1] x", "(EngineCore_DP0 pid=2) INFO 11-30 [a.py:1] x",
                     "(Worker_TP0 pid=3) INFO 11-30 [a.py:1] x", "(Worker_TP1 pid=4) INFO 11-30 [a.py:1] x",
                     "(EngineCore_DP1 pid=5) INFO 11-30 [a.py:1] x", "(Worker pid=3) INFO 11-30 [a.py:1] x",
                     "(Worker_PP1_TP0 pid=6) INFO 11-30 [a.py:1] x"])
    assert r.pids == {"APIServer": 1, "EngineCore": 2, "Worker_0": 3, "Worker_1": 4, "EngineCore_DP1": 5,
                      "Worker_PP1_TP0": 6}


def test_ansi_colored_lines():
    line = "\x1b[32m(APIServer pid=5)\x1b[0m INFO 11-30 03:20:09 [x.py:1] Starting vLLM server on http://h:1"
    r = LogParser()
    r.feed(line)
    assert r.report.server_url == "http://h:1"


def test_ready_when_uvicorn_serves_not_when_vllm_announces_it():
    """The one ready rule: "Starting vLLM server on URL" comes before the
    routes are listed and uvicorn binds; the server is ready at uvicorn's
    "Application startup complete" (or at a stats line, when uvicorn's INFO
    lines are turned off: only a serving API server logs them)."""
    announce = v("Starting vLLM server on http://127.0.0.1:8000", role="APIServer")
    r = parse_lines([announce, v("Available routes are:", role="APIServer")])
    assert not r.ready and r.server_url == "http://127.0.0.1:8000" and r.phase != "ready"
    r = parse_lines([announce, "(APIServer pid=1) INFO:     Application startup complete."])
    assert r.ready and r.phase == "ready"
    stats = v("Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
              "Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%",
              role="APIServer")
    assert parse_lines([announce, stats]).ready


def test_unterminated_osc_escape_ends_with_its_line(tmp_path, fixtures_dir):
    """An ESC ] (a terminal title or hyperlink) whose BEL never comes: it used
    to swallow every line after it up to the next BEL or ESC, so parse_file
    lost lines (found by bench/reliability.py parser-fuzz on random bytes),
    shifted the line numbers and missed the error below it."""
    good = (fixtures_dir / CPU / "fail_block16.log").read_bytes()
    data = b"(APIServer pid=5) INFO 11-30 03:20:09 [x.py:1] \x1b]8;;http://a\n" + good
    path = tmp_path / "llm.log"
    path.write_bytes(data)
    want = parse_file(fixtures_dir / CPU / "fail_block16.log")
    got = parse_file(path)
    assert got.lines == data.count(b"\n")
    assert got.error is not None and got.error.kind == want.error.kind
    assert got.error.line_no == want.error.line_no + 1


def test_non_ascii_and_invalid_bytes_same_through_file_and_feed(tmp_path):
    data = ("\n".join([
        v("vLLM server version 0.9.9, serving model /models/\u6a21\u578b-\u00e9", role="APIServer"),
        v("  \u2584\u2584 \u2584\u2588 \u2588  model   /m/\u00fc", role="APIServer"),
        v("Resolved architecture: \u00c4rch", role="APIServer"),
        v("Using max model len 2048", role="APIServer"),
    ]) + "\n").encode() + b"(EngineCore pid=9) \xff\xfe ValueError: bad \xe9 byte\n" + \
        "RuntimeError: Engine core proc \u2588 died unexpectedly\n".encode()
    path = tmp_path / "llm.log"
    path.write_bytes(data)
    from_file = parse_file(path)
    parser = LogParser()
    for line in data.decode("utf-8", errors="replace").split("\n")[:-1]:
        parser.feed(line)
    assert from_file.to_dict(include_stats=True) == parser.report.to_dict(include_stats=True)
    assert from_file.model == "/models/\u6a21\u578b-\u00e9" and from_file.architecture == "\u00c4rch"
    assert from_file.max_model_len == 2048 and from_file.lines == 6
    assert from_file.error.kind is ErrorKind.ENGINE_DEAD and "\u2588" in from_file.error.message


def test_new_run_in_the_same_log_resets_the_report(fixtures_dir):
    lines = read_lines(fixtures_dir / CPU / "fail_kv_too_small.log") + \
        read_lines(fixtures_dir / CPU / "ok_block32_len2048.log")
    r = parse_lines(lines)
    assert r.error is None and r.ready and r.kv_cache_tokens == 65_536
    assert r.lines == len(lines)


# --------------------------------------------------------------------------- errors


def err(*lines: str):
    return parse_lines(lines).error


def test_tp_exceeds_gpus():
    e = err(v("World size (2) is larger than the number of available GPUs (1) in this node. If this is intentional "
              "and you are using:", role="APIServer").replace("INFO 11-30 03:20:09 [x.py:1] ", "ValueError: "),
            "(APIServer pid=7) - ray, set '--distributed-executor-backend ray'.")
    assert e.kind is ErrorKind.TP_EXCEEDS_GPUS
    assert e.detail == {"world_size": 2, "available_gpus": 1}


def test_tp_exceeds_gpus_as_pydantic_error():
    e = err("(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig",
            "(APIServer pid=1)   Value error, World size (4) is larger than the number of available GPUs (1) in "
            "this node. [type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]",
            "(APIServer pid=1)     For further information visit https://errors.pydantic.dev/2.11/v/value_error")
    assert e.kind is ErrorKind.TP_EXCEEDS_GPUS and e.detail["world_size"] == 4
    assert e.message.startswith("Value error, World size (4)") and "[type=" not in e.message


def test_heads_not_divisible():
    e = err("ValueError: Total number of attention heads (16) must be divisible by tensor parallel size (3).")
    assert e.kind is ErrorKind.HEADS_NOT_DIVISIBLE
    assert e.detail == {"heads": 16, "tensor_parallel_size": 3}


def test_port_in_use_uvicorn_after_startup_complete():
    r = parse_lines(["INFO:     Application startup complete.",
                     "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): "
                     "address already in use",
                     "INFO:     Waiting for application shutdown."])
    assert r.error.kind is ErrorKind.PORT_IN_USE
    assert r.error.detail == {"host": "0.0.0.0", "port": 8000}
    assert r.ready is False  # uvicorn said "startup complete" but never served


def test_port_in_use_oserror():
    e = err("(APIServer pid=3) Traceback (most recent call last):",
            '(APIServer pid=3)   File "/x/api_server.py", line 9, in run_server',
            "(APIServer pid=3) OSError: [Errno 98] Address already in use")
    assert e.kind is ErrorKind.PORT_IN_USE and e.message == "OSError: [Errno 98] Address already in use"


def test_port_busy_info_line_is_not_an_error():
    assert err(v("Port 29500 is already in use, trying port 29501")) is None


def test_cuda_oom_during_serving_counts():
    r = parse_lines([v("Application startup complete.", role="APIServer"),
                     "(APIServer pid=1) INFO:     Application startup complete.",
                     v("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                       "capacity of 79.19 GiB of which 1.20 GiB is free.", level="ERROR")])
    assert r.error.kind is ErrorKind.CUDA_OOM
    assert r.error.detail["tried_to_allocate"] == "2.00 GiB"


def test_missing_module():
    e = err("ModuleNotFoundError: No module named 'vllm._C'")
    assert e.kind is ErrorKind.MISSING_MODULE and e.detail["module"] == "vllm._C"


@pytest.mark.parametrize("line, module", [
    ("/usr/bin/python3: Error while finding module specification for 'vllm.entrypoints.openai.api_server' "
     "(ModuleNotFoundError: No module named 'vllm')", "vllm"),
    ("/opt/venv/bin/python: No module named vllm", "vllm"),
])
def test_interpreter_without_vllm(line, module):
    """The launcher's Python has no vLLM: the interpreter's own one-line complaint."""
    r = parse_lines([line])
    assert r.error is not None and r.error.kind is ErrorKind.MISSING_MODULE
    assert r.error.detail["module"] == module and r.error.line_no == 1 and r.error.message == line


def test_interpreter_cannot_open_the_launcher_script():
    line = "/usr/bin/python3: can't open file '/srv/run_vllm.py': [Errno 2] No such file or directory"
    assert parse_lines([line]).error.message == line


def test_engine_dead_after_ready():
    r = parse_lines(["(APIServer pid=1) INFO:     Application startup complete.",
                     v("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.", level="ERROR",
                       role="APIServer"),
                     "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
                     "issue. See stack trace (above) for the root cause."])
    assert r.error.kind is ErrorKind.ENGINE_DEAD
    assert "died unexpectedly" in r.error.message


def test_root_cause_replaces_a_wrapper_printed_first():
    e = err("(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}",
            v("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
              level="ERROR"))
    assert e.kind is ErrorKind.NO_CACHE_MEMORY and e.line_no == 2


def test_wrapper_alone_is_engine_dead():
    e = err("(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}")
    assert e.kind is ErrorKind.ENGINE_DEAD


def test_first_specific_cause_wins():
    e = err("ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).",
            "torch.OutOfMemoryError: CUDA out of memory.")
    assert e.kind is ErrorKind.BLOCK_SIZE_UNSUPPORTED and e.line_no == 1


def test_worker_failed_wrapper_quotes_the_cause():
    e = err("RuntimeError: Worker failed with error 'No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).', "
            "please check the stack trace above for the root cause")
    assert e.kind is ErrorKind.BLOCK_SIZE_UNSUPPORTED and e.detail["block_size"] == 16


def test_v0_kv_cache_too_small_wording():
    e = err("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
            "stored in KV cache (13104). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`")
    assert e.kind is ErrorKind.KV_CACHE_TOO_SMALL and e.estimated_max_model_len == 13104


def test_gpu_insufficient_free_memory_wording():
    e = err("ValueError: Free memory on device cuda:0 (5.2/79.1 GiB) on startup is less than desired GPU memory "
            "utilization (0.9, 71.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
            "processes.")
    assert e.kind is ErrorKind.INSUFFICIENT_FREE_MEMORY
    assert e.detail == {"free_gib": 5.2, "total_gib": 79.1, "utilization": 0.9, "requested_gib": 71.2}


def test_argparse_invalid_block_size_choice():
    e = err("vllm serve: error: argument --block-size: invalid choice: 7 (choose from 1, 8, 16, 32, 64, 128)")
    assert e.kind is ErrorKind.BLOCK_SIZE_UNSUPPORTED and e.detail["block_size"] == 7


def test_several_unknown_arguments():
    e = err("api_server.py: error: unrecognized arguments: --foo 3 --bar")
    assert e.detail["argument"] == "--foo" and e.detail["arguments"] == ["--foo", "3", "--bar"]


def test_request_error_after_ready_is_not_a_server_failure():
    r = parse_lines(["(APIServer pid=1) INFO:     Application startup complete.",
                     v("Error in preprocessing prompt inputs", level="ERROR", role="APIServer"),
                     "(APIServer pid=1) ValueError: This model's maximum context length is 2048 tokens. However, "
                     "you requested 4000 tokens."])
    assert r.error is None and r.ready


def test_non_fatal_error_before_ready_is_cleared():
    r = parse_lines(["KeyError: 'optional_feature'", "(APIServer pid=1) INFO:     Application startup complete."])
    assert r.error is None and r.ready


def test_shutdown_noise_is_not_an_error():
    r = parse_lines([v("[shutdown] EngineCore: trigger received signal=SIGINT"),
                     "KeyboardInterrupt",
                     "asyncio.exceptions.CancelledError",
                     "RuntimeError: cannot schedule new futures after shutdown"])
    assert r.error is None


def test_warning_mentioning_an_exception_is_not_an_error():
    assert err(v("Found ulimit of 20000 ... errors like `OSError: [Errno 24] Too many open files`.",
                 level="WARNING")) is None


def test_uvicorn_traceback_header_is_not_a_cause():
    r = parse_lines(["ERROR:    Traceback (most recent call last):", "ERROR:    Exception in ASGI application"])
    assert r.error is None


@pytest.mark.parametrize("message, kind", [
    ("CUDA error: out of memory", ErrorKind.CUDA_OOM),
    ("No available memory for the cache blocks.", ErrorKind.NO_CACHE_MEMORY),
    ("The attention backends share no supported KV cache block size (A: [16]; B: [32]).",
     ErrorKind.BLOCK_SIZE_UNSUPPORTED),
    ("EngineDeadError: EngineCore encountered an issue.", ErrorKind.ENGINE_DEAD),
    ("something else entirely", ErrorKind.OTHER),
])
def test_classify_error(message, kind):
    assert classify_error(message)[0] is kind


# --------------------------------------------------------------------------- never raises, bounded


def fixture_lines(fixtures_dir) -> list[str]:
    out: list[str] = []
    for path in all_fixture_logs(fixtures_dir):
        out += read_lines(path)
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=4000))
def test_random_bytes_never_raise(data):
    parser = LogParser()
    for line in data.decode("utf-8", errors="replace").split("\n"):
        parser.feed(line)
    parser.feed(data)  # bytes are accepted too
    parse_lines(data.split(b"\n"))
    assert parser.internal_errors == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_fixture_lines_cut_at_random_points(fixtures_dir, seed):
    rng = random.Random(seed)
    lines = fixture_lines(fixtures_dir)
    parser = LogParser()
    for _ in range(60):
        line = rng.choice(lines)
        a = rng.randrange(len(line) + 1)
        b = rng.randrange(a, len(line) + 1)
        for piece in (line[:a], line[a:], line[a:b], line[:b] + rng.choice(lines)[a:]):
            parser.feed(piece)
    assert parser.internal_errors == 0


PIECES = ["(APIServer pid=1) ", "(Worker pid=", "INFO 11-30 03:20:09 [x.py:1] ", "ERROR 11-30 [c.py:2] ", "INFO:  ",
          "ERROR:  ", "  ", "Value error, ", "vLLM server version ", "non-default args: {", "'block_size': ",
          "# GPU blocks: ", "GPU KV cache size: ", "Maximum concurrency for ", "Engine 000: Avg prompt throughput: ",
          "Explicitly set (", "Model loading took ", "init engine (", "Graph capturing finished in ", "took ",
          "ValueError: ", "RuntimeError: Worker failed with error '", "estimated maximum model length is ",
          "unrecognized arguments: ", "[Errno 98] ", "Capturing CUDA graphs: ", "%|", "/", "[shutdown] ", "[",
          "] ", "(", ")", ":", ",", "'", "\r", "\x1b[3", "1", "-2.5", "99999999999999999999", "9" * 400, "1e999",
          "\u2588", "\ufffd", "Starting vLLM server on http://h:", "Loading weights took ", " seconds", " GiB",
          "Running: ", "CPU KV cache usage: ", "%"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.sampled_from(PIECES), max_size=12).map("".join), max_size=30))
def test_keyword_soup_never_raises(lines):
    parser = LogParser()
    for line in lines:
        parser.feed(line)
    json.dumps(parser.report.to_dict(include_stats=True), allow_nan=False, default=str)  # strict JSON, always
    assert parser.internal_errors == 0


def test_ten_megabyte_line(tmp_path):
    big = "(APIServer pid=1) INFO 11-30 03:20:09 [api_utils.py:1] non-default args: {" + "'k': 1, " * 1_300_000 + "}"
    parser = LogParser()
    parser.feed(big)
    parser.feed("ValueError: " + "x" * 10_000_000)
    assert parser.internal_errors == 0
    path = tmp_path / "llm.log"
    path.write_text("(APIServer pid=1) INFO 11-30 [a.py:1] vLLM server version 1.2.3, serving model m\n"
                    + "Q" * 10_000_000 + "\n" + v("GPU KV cache size: 5 tokens") + "\n")
    tracemalloc.start()
    try:
        r = parse_file(path, chunk_size=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.lines == 3 and r.vllm_version == "1.2.3" and r.kv_cache_tokens == 5
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes for a file with a 10 MB line"


# --------------------------------------------------------------------------- ernie-tui parse-log


def test_cli_parse_log_text(fixtures_dir, capsys):
    assert cli_main(["parse-log", str(fixtures_dir / GPU / "ok_block16_len4096.log")]) == 0
    out = capsys.readouterr().out
    # The capture ends with the server's SIGINT shutdown: it was ready, and is stopped now (#18, 4).
    assert "STOPPED: shut down cleanly at line 389 after serving at http://127.0.0.1:8000" in out
    assert "READY" not in out
    assert "7,421,344 tokens" in out and "127.4 GiB" in out and "1,811.85x" in out and "FLASH_ATTN" in out


def test_cli_parse_log_failure_text(fixtures_dir, capsys):
    assert cli_main(["parse-log", str(fixtures_dir / CPU / "fail_kv_too_small.log")]) == 0
    out = capsys.readouterr().out
    assert "FAILED: kv_cache_too_small" in out and "992" in out


def test_cli_parse_log_json(fixtures_dir, capsys):
    assert cli_main(["parse-log", "--json", str(fixtures_dir / CPU / "ok_block32_len2048.log")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["vllm_version"] == "0.32.0" and d["platform"] == "cpu" and d["block_size"] == 32
    assert d["kv_cache_tokens"] == 65536 and d["max_concurrency"] == 32.0 and d["was_ready"] is True
    assert d["error"] is None and d["phases"]["load_weights"] == 0.01
    assert d["attention_backend"] == "CPU_ATTN" and d["attention_implied"] is True  # issue #18, 8
    assert d["max_model_len"] == 2048 and d["kv_cache_gib"] == 0.0625


def test_cli_parse_log_json_of_a_stopped_server_is_not_ready(fixtures_dir, capsys, tmp_path):
    # The capture ends with its SIGINT shutdown. It said "state": "stopped"
    # beside "ready": true and "phase": "ready" (issue #44, 7): a script that
    # reads `ready` thought the server served.
    log = fixtures_dir / CPU / "ok_block32_len2048.log"
    assert cli_main(["parse-log", "--json", str(log)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["state"] == "stopped" and d["ready"] is False and d["phase"] == "shutdown"
    assert d["was_ready"] is True and d["startup_phase"] == "ready"
    # The same log cut before its shutdown: serving, and every field says so.
    lines = log.read_text().splitlines(keepends=True)
    serving = tmp_path / "serving.log"
    serving.write_text("".join(lines[:next(i for i, line in enumerate(lines) if "[shutdown]" in line)]))
    assert cli_main(["parse-log", "--json", str(serving)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["state"], d["ready"], d["was_ready"], d["phase"]) == ("ready", True, True, "ready")
    # A start that failed was never ready; its phase says failed, the start's furthest phase is kept.
    assert cli_main(["parse-log", "--json", str(fixtures_dir / CPU / "fail_kv_too_small.log")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["state"], d["ready"], d["was_ready"], d["phase"]) == ("failed", False, False, "failed")
    assert d["startup_phase"] not in (None, "ready", "failed")


def test_cli_parse_log_json_error(fixtures_dir, capsys):
    assert cli_main(["parse-log", "--json", str(fixtures_dir / GPU / "fail_block8_len2048.log")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["error"]["kind"] == "block_size_unsupported" and d["error"]["estimated_max_model_len"] is None
    assert d["error"]["message"].startswith("ValueError: No valid attention backend")


def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_cli_parse_log_json_drops_figures_no_machine_has(tmp_path, capsys):
    """Numbers that overflow a float printed `Infinity` (not JSON); absurd ones
    were reported as facts. Both are dropped, and the report says why."""
    digits = "9" * 400
    log = tmp_path / "llm.log"
    log.write_text("\n".join([
        v("vLLM server version 0.32.0, serving model m", role="APIServer"),
        v("non-default args: {'model': 'm', 'block_size': 32, 'swap_space': 1e999}", role="APIServer"),
        v(f"Loading weights took {digits} seconds"),
        v("Model loading took 0.7 GiB and 1.5 s"),
        v("CPU KV cache size: 100,000,000,000,000,000,000,000,000 tokens, Maximum concurrency for "
          "2,048 tokens per request: 32.00x"),
        v(f"init engine (profile, create kv cache, warmup model) took {digits}.5 seconds"),
        v(f"Engine 000: Avg prompt throughput: {digits} tokens/s, Avg generation throughput: 1.0 tokens/s, "
          "Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%",
          role="APIServer"),
        "(APIServer pid=7) INFO:     Uvicorn running on http://inf:-1 (Press CTRL+C to quit)",
        f"(EngineCore pid={digits}) INFO 11-30 03:20:09 [x.py:1] Graph capturing finished in 5 secs, "
        f"took -{digits} GiB",
        "ValueError: To serve at least one request with the model's max seq len (" + digits + "), (1.00 GiB KV "
        "cache is needed, which is larger than the available KV cache memory (0.06 GiB). Based on the available "
        "memory, the estimated maximum model length is " + digits + ".",
    ]) + "\n")
    assert cli_main(["parse-log", "--json", "--all-stats", str(log)]) == 0
    d = _strict_json(capsys.readouterr().out)
    assert d["weights_load_seconds"] == 1.5 and d["weights_gib"] == 0.7  # the sane line still counts
    assert d["kv_cache_tokens"] is None and d["max_concurrency"] == 32.0
    assert d["init_engine_seconds"] is None and d["cuda_graph_gib"] is None and d["cuda_graph_seconds"] == 5.0
    assert d["stats"] == [] and d["server_url"] is None
    assert d["non_default_args"] == {"model": "m", "block_size": 32} and d["pids"] == {"APIServer": 7}
    assert d["error"]["kind"] == "kv_cache_too_small" and d["error"]["estimated_max_model_len"] is None
    assert d["error"]["detail"] == {"needed_gib": 1.0, "available_gib": 0.06}
    notes = "\n".join(d["notes"])
    for what in ("weights load time", "KV cache size", "init engine time", "Avg prompt throughput",
                 "server URL http://inf:-1", "swap_space", "EngineCore pid", "CUDA graph memory",
                 "estimated max model len", "max model len"):
        assert what in notes, what
    assert len(d["notes"]) == 10
    assert cli_main(["parse-log", str(log)]) == 0
    text = capsys.readouterr().out
    figures = [ln for ln in text.splitlines()[1:] if not ln.startswith("  note ")]
    assert text.count("dropped") == 10 and not any("inf" in ln for ln in figures)
    r = parse_lines([v("Starting vLLM server on http://inf:-1", role="APIServer"),
                     v("Starting vLLM server on http://[::1]:99999", role="APIServer")])
    assert r.server_url is None and len(r.notes) == 2
    assert parse_lines([v("Starting vLLM server on http://[::1]:8000", role="APIServer")]).server_url \
        == "http://[::1]:8000"


def test_cli_parse_log_missing_file(tmp_path, capsys):
    assert cli_main(["parse-log", str(tmp_path / "nope.log")]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"ernie-tui: error: {tmp_path / 'nope.log'}: no such file"
    assert "Traceback" not in err


def test_stats_are_bounded_for_a_server_that_runs_for_days():
    from ernie_tui.engine_ctl.logs.logparse import MAX_STATS, LogParser

    line = ("(APIServer pid=1) INFO 11-30 03:35:58 [loggers.py:335] Engine 000: Avg prompt throughput: "
            "13.5 tokens/s, Avg generation throughput: {} tokens/s, Running: 0 reqs, Waiting: 0 reqs, "
            "CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%")
    parser = LogParser()
    for i in range(3 * MAX_STATS):
        parser.feed(line.format(i))
    stats = parser.report.stats
    assert MAX_STATS <= len(stats) <= 2 * MAX_STATS
    assert stats[-1].generation_tps == 3 * MAX_STATS - 1  # the newest are the ones kept


def test_peek_moves_the_phase_without_consuming_the_line(fixtures_dir):
    """While CUDA graphs are captured the line is still being redrawn: peeking
    at the live bar moves the phase on; the line counts once it ends."""
    path = fixtures_dir / "gpu-h200-vllm0.26.0" / "ok_block16_len4096.log"
    lines = path.read_text(errors="replace").split("\n")
    at = next(i for i, ln in enumerate(lines) if "Capturing CUDA graphs" in ln)
    parser = LogParser()
    for ln in lines[:at]:
        parser.feed(ln)
    before = parser.report.phase
    assert before != "cuda_graphs" and parser.report.lines == at
    changes = parser.peek("Capturing CUDA graphs (PIECEWISE):  12%|█▏        | 6/51 [00:00<00:01, 23.97it/s]")
    assert parser.report.phase == "cuda_graphs" and parser.report.lines == at
    assert changes > 0  # the phase moved on: the report is published
    assert parser.peek("INFO something else") == 0 and parser.report.lines == at


def test_report_state_from_the_last_lines(fixtures_dir, tmp_path, capsys):
    """A cleanly stopped server's log reads STOPPED, not READY (issue #18, 4): the
    same capture cut before its shutdown is READY, cut inside it 'shutdown began'."""
    full = (fixtures_dir / "cpu-vllm0.32.0" / "ok_block32_len2048.log").read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(full) if "[shutdown]" in line)
    done = next(i for i, line in enumerate(full) if "Application shutdown complete" in line)
    cases = {"serving.log": full[:first], "stopping.log": full[:first + 3], "stopped.log": full}
    for name, lines in cases.items():
        (tmp_path / name).write_text("".join(lines))
    serving, stopping, stopped = (parse_file(tmp_path / n) for n in cases)
    assert serving.state == "ready" and serving.shutdown_line is None
    assert stopping.state == "stopped" and stopping.shutdown_line == first + 1 and not stopping.shutdown_complete
    assert stopped.state == "stopped" and stopped.shutdown_complete and stopped.ready
    assert done > first
    assert cli_main(["parse-log", str(tmp_path / "stopped.log")]) == 0
    assert "STOPPED: shut down cleanly at line" in capsys.readouterr().out
    assert cli_main(["parse-log", str(tmp_path / "stopping.log")]) == 0
    assert "the log ends before it finished" in capsys.readouterr().out
    assert cli_main(["parse-log", str(tmp_path / "serving.log")]) == 0
    assert "state           READY at http://127.0.0.1:18001" in capsys.readouterr().out
    assert cli_main(["parse-log", "--json", str(tmp_path / "stopped.log")]) == 0
    assert '"state": "stopped"' in capsys.readouterr().out


def test_an_engine_core_killed_while_serving_reads_as_a_crash_not_a_stop(fixtures_dir, capsys):
    """vLLM 0.32 after its EngineCore was SIGKILLed while idle (as the OOM
    killer does): it logs its cleanup as "[shutdown]" lines and the API server
    exits 0, like a stop. The parser read "stopped" with no error, so the
    dashboard showed STOPPED for a dead engine. It is a crash, and the
    unexpected exit is its reason (the EngineDeadError after it is the echo)."""
    log = fixtures_dir / CPU / "engine_core_killed.log"
    r = parse_file(log)
    assert r.ready and r.state == "failed", r.state
    assert r.error is not None and r.error.kind is ErrorKind.ENGINE_DEAD
    assert "engine core exited unexpectedly" in r.error.message
    lines = log.read_bytes().split(b"\n")  # the parser's line numbers count newlines only
    assert b"exited unexpectedly" in lines[r.error.line_no - 1]
    # A stop the operator asked for has "[shutdown]" lines too, and no error.
    stopped = parse_file(fixtures_dir / CPU / "ok_block32_len2048.log")
    assert stopped.state == "stopped" and stopped.error is None


@pytest.mark.parametrize("name, line", [
    ("cpu-vllm0.32.0/fail_block16.log", 67), ("cpu-vllm0.32.0/fail_kv_too_small.log", 60),
    ("cpu-vllm0.32.0/fail_insufficient_free_memory.log", 31), ("gpu-h200-vllm0.26.0/fail_block8_len2048.log", 15),
    ("gpu-h200-vllm0.26.0/fail_no_cache_memory_util0.005.log", 34),
    # Not vLLM giving a start up: a start that served, a crash after ready, and failures
    # where the launcher itself exits at once (argparse, pydantic).
    ("cpu-vllm0.32.0/ok_block32_len2048.log", None), ("cpu-vllm0.32.0/engine_core_killed.log", None),
    ("gpu-h200-vllm0.26.0/fail_unknown_arg_enable_paged_attn.log", None),
    ("gpu-h200-vllm0.26.0/fail_len_over_derived.log", None),
])
def test_the_line_where_vllm_gave_its_start_up(fixtures_dir, name, line):
    """EngineServer ends the teardown that follows this line (once the root
    cause is in) instead of waiting it out."""
    parser = LogParser()
    parser.feed_many((fixtures_dir / name).read_bytes().decode("utf-8", "replace").split("\n"))
    assert parser.start_failed_line == line
    if line is not None:
        assert parser.report.error is not None and parser.report.error.line_no > line  # the root cause comes after
