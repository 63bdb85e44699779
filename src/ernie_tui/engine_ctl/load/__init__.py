"""Talking to a serving engine over HTTP: the client and its errors
(http_client, http_errors), server-sent events and their timing (sse,
stream_chunk, stream_timing), /metrics (metrics), prompts of exact length
(prompts, workload), one probe (probe), a burst (burst), objectives (slo),
the capacity search (capacity, capacity_run), plain statistics (stats), the
Pareto front (pareto) and the run records on disk (runstore).

Never imports launch, logs or control: a load can be aimed at any URL.
"""

from ernie_tui.engine_ctl.load.arrivals import (
    ARRIVALS,
    arrival_offsets,
    arrival_stream,
    output_lengths,
    send_lag,
    vllm_bench_ranges,
)
from ernie_tui.engine_ctl.load.burst import BurstConfig, BurstResult, format_burst, run_burst
from ernie_tui.engine_ctl.load.capacity import (
    DEFAULT_ARRIVALS,
    DEFAULT_ATTAINMENT,
    DEFAULT_CONFIDENCE,
    DEFAULT_LEVEL_TIME_S,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_RATE,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_MIN_REQUESTS,
    DEFAULT_MIN_WINDOWS,
    DEFAULT_SLO,
    DEFAULT_STABILITY,
    DEFAULT_START,
    DEFAULT_START_RATE,
    DEFAULT_TOLERANCE,
    CapacityResult,
    LevelResult,
    capacity_from_dict,
    format_capacity,
    make_search,
)
from ernie_tui.engine_ctl.load.capacity_run import request_setup, run_capacity
from ernie_tui.engine_ctl.load.http_client import DEFAULT_READ_TIMEOUT_S, ServedModel, resolve_model
from ernie_tui.engine_ctl.load.http_errors import ProbeError, ProbeErrorKind, ProbeFailure
from ernie_tui.engine_ctl.load.metrics import DEFAULT_TIMEOUT_S as METRICS_TIMEOUT_S
from ernie_tui.engine_ctl.load.metrics import (
    GENERATION_TOKENS,
    ITL,
    KV_USAGE,
    PREFIX_HITS,
    REQUEST_SUCCESS,
    RUNNING,
    TTFT,
    WAITING,
    Histogram,
    MetricsClient,
    MetricsError,
    MetricsSnapshot,
    counter_delta,
    derive_sample,
    histogram_delta,
    only_metrics,
)
from ernie_tui.engine_ctl.load.pareto import front_of_rows
from ernie_tui.engine_ctl.load.probe import format_probe, run_probe
from ernie_tui.engine_ctl.load.prompts import (
    CHINESE_PROMPT,
    LONG_PROMPT_TOKENS,
    SHORT_PROMPT,
    find_tokenizer,
    long_prompt,
    ready_prompt,
)
from ernie_tui.engine_ctl.load.runstore import KINDS as RUN_KINDS
from ernie_tui.engine_ctl.load.runstore import RunRecord, RunStoreError, list_runs, load_run, save_run
from ernie_tui.engine_ctl.load.slo import Objective, limit_ms, parse_slo
from ernie_tui.engine_ctl.load.stats import rate, relative_diff
from ernie_tui.engine_ctl.load.stream_timing import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    ProbeRequest,
    ProbeResult,
)
from ernie_tui.engine_ctl.load.workload import Workload, burst_workload, load_jsonl

__all__ = [
    "ARRIVALS",
    "BurstConfig",
    "BurstResult",
    "CHINESE_PROMPT",
    "CapacityResult",
    "DEFAULT_ARRIVALS",
    "DEFAULT_ATTAINMENT",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_LEVEL_TIME_S",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_RATE",
    "DEFAULT_MAX_REQUESTS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MIN_REQUESTS",
    "DEFAULT_MIN_WINDOWS",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_SLO",
    "DEFAULT_STABILITY",
    "DEFAULT_START",
    "DEFAULT_START_RATE",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOLERANCE",
    "DEFAULT_TOP_P",
    "GENERATION_TOKENS",
    "Histogram",
    "ITL",
    "KV_USAGE",
    "LONG_PROMPT_TOKENS",
    "LevelResult",
    "METRICS_TIMEOUT_S",
    "MetricsClient",
    "MetricsError",
    "MetricsSnapshot",
    "Objective",
    "PREFIX_HITS",
    "ProbeError",
    "ProbeErrorKind",
    "ProbeFailure",
    "ProbeRequest",
    "ProbeResult",
    "REQUEST_SUCCESS",
    "RUNNING",
    "RUN_KINDS",
    "RunRecord",
    "RunStoreError",
    "SHORT_PROMPT",
    "ServedModel",
    "TTFT",
    "WAITING",
    "Workload",
    "arrival_offsets",
    "arrival_stream",
    "burst_workload",
    "capacity_from_dict",
    "counter_delta",
    "derive_sample",
    "find_tokenizer",
    "format_burst",
    "format_capacity",
    "format_probe",
    "front_of_rows",
    "histogram_delta",
    "limit_ms",
    "list_runs",
    "load_jsonl",
    "load_run",
    "long_prompt",
    "make_search",
    "only_metrics",
    "output_lengths",
    "parse_slo",
    "rate",
    "ready_prompt",
    "relative_diff",
    "request_setup",
    "resolve_model",
    "run_burst",
    "run_capacity",
    "run_probe",
    "save_run",
    "send_lag",
    "vllm_bench_ranges",
]
