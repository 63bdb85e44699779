"""Before and at launch: what the machine has (machine), free ports and bind
addresses (ports), a model dir's shape (modelinfo), the KV-cache estimate
(estimate), how TP/PP/DP spread over GPUs (parallel_layout), the checks
before a start (preflight, preflight_parallel) and the plain-words diagnosis
of a failure with its fix as a preset change (diagnose).

May read logs (a diagnosis reads a report); never load or control.
"""

# preflight and diagnose are also module names here: the front door gives the
# functions names of their own, so an import of them is never read as one of
# the file (by import-linter, or by a reader).
from ernie_tui.engine_ctl.launch.diagnose import apply_fix, describe_changes
from ernie_tui.engine_ctl.launch.diagnose import diagnose as diagnose_failure
from ernie_tui.engine_ctl.launch.machine import detect_machine, nvml_gpus
from ernie_tui.engine_ctl.launch.parallel_layout import gpus_needed, layout_of
from ernie_tui.engine_ctl.launch.ports import (
    DETACHED_FILE,
    clear_detached,
    detached_port,
    free_port,
    next_free_port,
    port_is_free,
    read_detached,
)
from ernie_tui.engine_ctl.launch.preflight import launcher_python, unknown_arguments, vllm_args
from ernie_tui.engine_ctl.launch.preflight import preflight as run_preflight

__all__ = [
    "DETACHED_FILE",
    "apply_fix",
    "clear_detached",
    "describe_changes",
    "detached_port",
    "detect_machine",
    "diagnose_failure",
    "free_port",
    "gpus_needed",
    "launcher_python",
    "layout_of",
    "next_free_port",
    "nvml_gpus",
    "port_is_free",
    "read_detached",
    "run_preflight",
    "unknown_arguments",
    "vllm_args",
]
