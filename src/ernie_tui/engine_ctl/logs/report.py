"""Typed results of reading a vLLM log: events, errors, and the EngineReport.

These are the data contract between the log parser, process control, the
diagnosis and the dashboard. Plain dataclasses, JSON-friendly via to_dict().
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from ernie_tui.engine_ctl.logs.errors import ErrorKind


class Phase(StrEnum):
    """Startup phases, in the order the dashboard's progress bar shows them."""

    LOAD_WEIGHTS = "load_weights"
    COMPILE = "compile"
    KV_PROFILING = "kv_profiling"
    CUDA_GRAPHS = "cuda_graphs"
    READY = "ready"


PHASES = tuple(Phase)


@dataclass
class EngineError:
    kind: ErrorKind
    message: str  # the root-cause line, cleaned of prefixes
    line_no: int | None = None  # 1-based line in the log where the root cause is
    estimated_max_model_len: int | None = None  # kv_cache_too_small: vLLM's own estimate
    detail: dict[str, Any] = field(default_factory=dict)  # e.g. {"argument": "--enable-paged-attn"}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "message": self.message, "line_no": self.line_no,
                "estimated_max_model_len": self.estimated_max_model_len, "detail": self.detail}


@dataclass
class StatsSample:
    """One periodic 'Engine 000: Avg prompt throughput ...' line (or the V0 form)."""

    timestamp: str | None  # as printed, e.g. '11-30 03:35:58'
    prompt_tps: float
    generation_tps: float
    running: int
    waiting: int
    kv_usage_pct: float
    prefix_hit_pct: float | None = None
    line_no: int | None = None


@dataclass(frozen=True)
class RankInfo:
    """One engine process (a data-parallel engine core, a TP/PP worker) as
    its log prefix names it, with the figures it logged itself (ranks.py)."""

    name: str  # "EngineCore_DP1", "Worker_TP0", "Worker_DP1_TP0", "RayWorkerWrapper"
    pid: int
    weights_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None


@dataclass
class EngineReport:
    vllm_version: str | None = None
    platform: str | None = None  # "cuda" | "cpu" | None if unknown
    model: str | None = None
    non_default_args: dict[str, Any] = field(default_factory=dict)
    architecture: str | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    attention_backend: str | None = None
    attention_implied: bool = False  # CPU: vLLM logs no backend line; CPU_ATTN is the one it runs
    weights_gib: float | None = None
    weights_load_seconds: float | None = None
    compile_seconds: float | None = None
    kv_cache_gib: float | None = None  # "Available KV cache memory" (GPU) or explicit KV size (CPU)
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    cuda_graph_seconds: float | None = None
    cuda_graph_gib: float | None = None
    init_engine_seconds: float | None = None
    server_url: str | None = None
    ready: bool = False
    phase: str | None = None  # the latest phase reached (one of PHASES), or None
    phases: dict[str, float] = field(default_factory=dict)  # phase name -> seconds it took
    stats: list[StatsSample] = field(default_factory=list)
    error: EngineError | None = None
    pids: dict[str, int] = field(default_factory=dict)  # "APIServer" / "EngineCore" / "Worker_0" -> pid
    # Every rank in order of appearance (copy-on-write: replaced, never mutated).
    ranks: list[RankInfo] = field(default_factory=list)
    lines: int = 0
    # The server was shut down (SIGINT, a preset switch, `x`): the line its
    # shutdown began on, and whether uvicorn said it finished. A shut-down
    # server is no longer READY, whatever it reached before.
    shutdown_line: int | None = None
    shutdown_complete: bool = False
    # Figures the log stated that no machine can have (inf seconds, 10^26 KV
    # tokens, port -1): left out of the fields above, each said here.
    notes: list[str] = field(default_factory=list)
    # The parser's own bugs: a line one of its handlers raised on (the field
    # that line carried is missing above). "line N: Error: message | the line",
    # the first PARSER_ERRORS_KEPT of them; parser_error_count counts them all.
    parser_errors: list[str] = field(default_factory=list)
    parser_error_count: int = 0

    @property
    def state(self) -> str:
        """What the log's last lines say: "failed", "stopped" (shut down),
        "ready" or "starting"."""
        if self.error is not None:
            return "failed"
        if self.shutdown_line is not None:
            return "stopped"
        return "ready" if self.ready else "starting"

    def to_dict(self, include_stats: bool = False) -> dict[str, Any]:
        """The report for a script (`parse-log --json`, run records). Its
        fields agree with `state`, the log's last word: `ready` is true only
        while the server serves (a stopped or failed one had been ready:
        `was_ready`), and `phase` is "shutdown" or "failed" once it is;
        `startup_phase` keeps the furthest phase its start reached."""
        d = asdict(self)
        state = self.state
        d["state"] = state
        d["ready"] = state == "ready"
        d["was_ready"] = self.ready
        d["startup_phase"] = self.phase
        d["phase"] = {"stopped": "shutdown", "failed": "failed"}.get(state, self.phase)
        d["error"] = self.error.to_dict() if self.error else None
        if not include_stats:
            d["stats"] = [asdict(s) for s in self.stats[-1:]]
        return d


PARSER_ERRORS_KEPT = 20


def parser_error_notice(report: EngineReport) -> str | None:
    """One line for the user when the parser hit its own bug, else None."""
    n = report.parser_error_count
    if not n:
        return None
    first = report.parser_errors[0] if report.parser_errors else ""
    return (f"the log parser failed on {n} line{'s' if n != 1 else ''} (a bug: please report it; "
            f"fields from those lines are missing). First: {first}")


# A snapshot keeps the newest stats samples only: the report panel shows the
# latest, a replay's charts their 15-minute window (90 samples at vLLM's 10 s
# interval), and copying a day's worth (8,640) under the server's lock once
# cost 0.1 s a copy.
SNAPSHOT_STATS = 1024


@dataclass(frozen=True)
class ReportSnapshot:
    """One published state of a server's report, for any thread to read.

    The monitor that owns the parser makes one when the report changed
    (`version` counts them) and never touches it again; readers must not
    change it either. `run` names the log it comes from (a restart starts a
    new llm.log, and a new run)."""

    version: int
    run: object
    report: EngineReport

    @classmethod
    def of(cls, report: EngineReport, version: int, run: object) -> ReportSnapshot:
        """Copy what the parser goes on changing (its dicts and lists, the
        newest stats) once; the rest (strings, numbers, the error) is shared."""
        stats = report.stats[-SNAPSHOT_STATS:]
        if stats:
            stats[-1] = replace(stats[-1])  # V0 logs fill in its prefix hit rate a line later
        copy = replace(report, stats=stats, phases=dict(report.phases), pids=dict(report.pids),
                       non_default_args=dict(report.non_default_args), notes=list(report.notes),
                       parser_errors=list(report.parser_errors))
        return cls(version, run, copy)
