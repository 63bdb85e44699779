"""Talking to a serving engine over HTTP: the client and its errors
(http_client, http_errors), server-sent events and their timing (sse,
stream_chunk, stream_timing), /metrics (metrics), prompts of exact length
(prompts, workload), one probe (probe), a burst (burst), objectives (slo),
the capacity search (capacity, capacity_run), plain statistics (stats), the
Pareto front (pareto), the run records on disk (runstore) and a level's
verdict in words (verdict_words: verdict_text).

Never imports launch, logs or control: a load can be aimed at any URL.
"""

from ernie_tui.engine_ctl.load.arrivals import (
    ARRIVALS,
    arrival_offsets,
    arrival_stream,
    drawn_lengths,
    send_lag,
    vllm_bench_ranges,
)
from ernie_tui.engine_ctl.load.burst import BurstConfig, BurstResult, format_burst, run_burst
from ernie_tui.engine_ctl.load.capacity import (
    CEILING_STOPS,
    DEFAULT_ARRIVALS,
    DEFAULT_ATTAINMENT,
    DEFAULT_CONFIDENCE,
    DEFAULT_CONFIRM_WAVES,
    DEFAULT_LEVEL_TIME_S,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_RATE,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_MIN_REQUESTS,
    DEFAULT_MIN_WINDOWS,
    DEFAULT_RESOLUTION,
    DEFAULT_SLO,
    DEFAULT_STABILITY,
    DEFAULT_START,
    DEFAULT_START_RATE,
    DEFAULT_TOLERANCE,
    CapacityResult,
    LevelResult,
    SearchConfig,
    capacity_from_dict,
    format_capacity,
    make_search,
    no_capacity_words,
)
from ernie_tui.engine_ctl.load.capacity_run import RequestSettings, request_setup, run_capacity
from ernie_tui.engine_ctl.load.http_client import (
    DEFAULT_READ_TIMEOUT_S,
    ServedModel,
    check_server_url,
    resolve_model,
    url_problem,
)
from ernie_tui.engine_ctl.load.http_errors import ProbeError, ProbeErrorKind, ProbeFailure
from ernie_tui.engine_ctl.load.level_procs import auto_procs
from ernie_tui.engine_ctl.load.metrics import DEFAULT_TIMEOUT_S as METRICS_TIMEOUT_S
from ernie_tui.engine_ctl.load.metrics import (
    E2E,
    GENERATION_TOKENS,
    INFERENCE,
    ITL,
    KV_USAGE,
    LOAD_SAMPLE_INTERVAL_S,
    PREFIX_HITS,
    PROMPT_TOKENS,
    QUEUE,
    REQUEST_SUCCESS,
    RUNNING,
    TTFT,
    WAITING,
    Histogram,
    LatestScrape,
    MetricsClient,
    MetricsError,
    MetricsFeed,
    MetricsSnapshot,
    counter_delta,
    derive_sample,
    histogram_delta,
    only_metrics,
)
from ernie_tui.engine_ctl.load.pareto import front_of_rows, pareto_front
from ernie_tui.engine_ctl.load.probe import format_probe, probe_error_lines, run_probe
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
from ernie_tui.engine_ctl.load.server_cpu import (
    ServerCpuWatch,
    is_local_host,
    listening_pid,
    server_pid,
    server_processes,
)
from ernie_tui.engine_ctl.load.slo import Objective, limit_ms, parse_slo
from ernie_tui.engine_ctl.load.stats import rate, relative_diff
from ernie_tui.engine_ctl.load.stream_timing import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    ProbeRequest,
    ProbeResult,
)

# Traffic profiles: capture (traffic_capture), the file (traffic), ready-made
# shapes (traffic_shapes) and replay (traffic_replay).
from ernie_tui.engine_ctl.load.traffic import (
    LengthDist,
    TrafficError,
    TrafficProfile,
    format_profile,
    save_profile,
)
from ernie_tui.engine_ctl.load.traffic_capture import (
    build_profile,
    capture_live,
    from_log_file,
    from_log_requests,
    from_metrics,
    from_trace,
    parse_request_log,
    read_trace,
)
from ernie_tui.engine_ctl.load.traffic_replay import OUTPUTS as TRAFFIC_OUTPUTS
from ernie_tui.engine_ctl.load.traffic_replay import replay_settings
from ernie_tui.engine_ctl.load.traffic_shapes import BUILT_IN as BUILT_IN_TRAFFIC
from ernie_tui.engine_ctl.load.traffic_shapes import load_profile
from ernie_tui.engine_ctl.load.verdict_words import second_look, verdict_text
from ernie_tui.engine_ctl.load.workload import Workload, burst_workload, load_jsonl

__all__ = [
    "ARRIVALS",
    "BurstConfig",
    "BurstResult",
    "CHINESE_PROMPT",
    "CEILING_STOPS",
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
    "DEFAULT_RESOLUTION",
    "DEFAULT_SLO",
    "DEFAULT_STABILITY",
    "DEFAULT_CONFIRM_WAVES",
    "DEFAULT_START",
    "DEFAULT_START_RATE",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOLERANCE",
    "DEFAULT_TOP_P",
    "E2E",
    "GENERATION_TOKENS",
    "Histogram",
    "INFERENCE",
    "ITL",
    "KV_USAGE",
    "LOAD_SAMPLE_INTERVAL_S",
    "LONG_PROMPT_TOKENS",
    "LatestScrape",
    "LevelResult",
    "METRICS_TIMEOUT_S",
    "MetricsClient",
    "MetricsError",
    "MetricsFeed",
    "MetricsSnapshot",
    "Objective",
    "PREFIX_HITS",
    "PROMPT_TOKENS",
    "ProbeError",
    "ProbeErrorKind",
    "ProbeFailure",
    "ProbeRequest",
    "ProbeResult",
    "QUEUE",
    "REQUEST_SUCCESS",
    "RUNNING",
    "RUN_KINDS",
    "RunRecord",
    "RunStoreError",
    "SHORT_PROMPT",
    "ServedModel",
    "ServerCpuWatch",
    "TTFT",
    "WAITING",
    "Workload",
    "arrival_offsets",
    "arrival_stream",
    "auto_procs",
    "burst_workload",
    "capacity_from_dict",
    "check_server_url",
    "counter_delta",
    "derive_sample",
    "drawn_lengths",
    "find_tokenizer",
    "format_burst",
    "format_capacity",
    "format_probe",
    "probe_error_lines",
    "front_of_rows",
    "is_local_host",
    "listening_pid",
    "histogram_delta",
    "limit_ms",
    "list_runs",
    "load_jsonl",
    "load_run",
    "long_prompt",
    "make_search",
    "no_capacity_words",
    "only_metrics",
    "pareto_front",
    "parse_slo",
    "rate",
    "ready_prompt",
    "relative_diff",
    "RequestSettings",
    "SearchConfig",
    "request_setup",
    "resolve_model",
    "run_burst",
    "run_capacity",
    "run_probe",
    "save_run",
    "second_look",
    "send_lag",
    "server_pid",
    "server_processes",
    "verdict_text",
    "url_problem",
    "vllm_bench_ranges",
]

__all__ += [
    "BUILT_IN_TRAFFIC",
    "LengthDist",
    "from_log_requests",
    "from_metrics",
    "parse_request_log",
    "TRAFFIC_OUTPUTS",
    "TrafficError",
    "TrafficProfile",
    "build_profile",
    "capture_live",
    "format_profile",
    "from_log_file",
    "from_trace",
    "load_profile",
    "read_trace",
    "replay_settings",
    "save_profile",
]
