"""Running servers and trials: the vLLM process and its group (server), its
memory (resources), many servers at once (fleet), presets measured in turn or
side by side (sweep, trial_schedule, trial_load) or on a Ray cluster's nodes
(ray_trials, orphan_guard; ray_status: its nodes and trials for a screen), or
all served at once and compared pair by pair while the host drifts
(paired_sweep, turn_gate, ranking; knee_ladder: each duel round's ladder
around a knee and the checks that hold a verdict back); tune's search (tune,
its shared study: tune_storage, and its --trials over every driver: tune_budget).

The top district: it may use launch, load and logs; none of them uses it.
"""

from ernie_tui.engine_ctl.control.fleet import FleetError, FleetPoller, connecting_rows, load_fleet, servers_from_urls
from ernie_tui.engine_ctl.control.paired_rows import PAIRED_TABLE_NOTE
from ernie_tui.engine_ctl.control.paired_sweep import DEFAULT_ROUNDS, PairedResult, knees_from, run_paired_sweep
from ernie_tui.engine_ctl.control.ranking import DEFAULT_MIN_DIFFERENCE, PairVerdict, Ranking, floor_words
from ernie_tui.engine_ctl.control.ray_status import RayNodeView, RaySnapshot, RayTrialView, build_snapshot
from ernie_tui.engine_ctl.control.ray_trials import RayTrials, RayTrialsError, parse_resources  # Ray: only on use
from ernie_tui.engine_ctl.control.resources import EngineMemory, ResourceSampler
from ernie_tui.engine_ctl.control.server import (
    AttachedServer,
    EngineServer,
    LogLines,
    LogRead,
    LogReplay,
    ReportPublished,
    ServerError,
    ServerState,
    ServerStatus,
    StatusChanged,
    find_detached,
    group_members,
    stop_detached,
)
from ernie_tui.engine_ctl.control.sweep import (
    CAPACITY_COLUMNS,
    COLUMNS,
    CapacitySweep,
    SweepOptions,
    SweepPlan,
    SweepRow,
    SweepRun,
    at_ceiling,
    cell,
    export_sweep,
    fold,
    measured,
    not_measured_why,
    run_sweep,
    score_column,
    speed_moved_note,
    sweep_meta,
    to_markdown,
)
from ernie_tui.engine_ctl.control.trial_load import LoadJob, LoadProcess
from ernie_tui.engine_ctl.control.trial_schedule import GpuIdsError, detect_gpu_ids, parse_gpu_ids
from ernie_tui.engine_ctl.control.tune import (  # Optuna is imported only when a tune runs
    INSTALL_HINT,
    Measurement,
    PresetChoice,
    TrialRow,
    TuneError,
    TuneResult,
    TuneSetup,
    Verdict,
    compare_to_base,
    measure_candidate,
    preset_choice,
    require_optuna,
    run_tune,
    tuned_preset,
)
from ernie_tui.engine_ctl.control.tune_storage import StorageError
from ernie_tui.engine_ctl.control.tune_storage import reachable as storage_reachable

__all__ = [
    "AttachedServer",
    "CAPACITY_COLUMNS",
    "COLUMNS",
    "CapacitySweep",
    "DEFAULT_ROUNDS",
    "EngineMemory",
    "EngineServer",
    "FleetError",
    "FleetPoller",
    "GpuIdsError",
    "INSTALL_HINT",
    "LoadJob",
    "LoadProcess",
    "PAIRED_TABLE_NOTE",
    "PairVerdict",
    "PairedResult",
    "knees_from",
    "Ranking",
    "RayNodeView",
    "RaySnapshot",
    "RayTrialView",
    "RayTrials",
    "RayTrialsError",
    "LogLines",
    "LogRead",
    "LogReplay",
    "Measurement",
    "PresetChoice",
    "ReportPublished",
    "ResourceSampler",
    "ServerError",
    "ServerState",
    "ServerStatus",
    "StatusChanged",
    "StorageError",
    "SweepOptions",
    "SweepPlan",
    "SweepRow",
    "SweepRun",
    "TuneError",
    "TrialRow",
    "TuneResult",
    "TuneSetup",
    "Verdict",
    "at_ceiling",
    "build_snapshot",
    "cell",
    "compare_to_base",
    "connecting_rows",
    "detect_gpu_ids",
    "storage_reachable",
    "export_sweep",
    "find_detached",
    "fold",
    "measured",
    "not_measured_why",
    "group_members",
    "load_fleet",
    "measure_candidate",
    "parse_gpu_ids",
    "parse_resources",
    "preset_choice",
    "require_optuna",
    "run_paired_sweep",
    "floor_words",
    "DEFAULT_MIN_DIFFERENCE",
    "run_sweep",
    "run_tune",
    "score_column",
    "servers_from_urls",
    "speed_moved_note",
    "stop_detached",
    "sweep_meta",
    "to_markdown",
    "tuned_preset",
]
