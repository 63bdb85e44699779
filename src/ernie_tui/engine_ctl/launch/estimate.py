"""Capacity estimate: how much KV cache a preset gets, before vLLM is started.

The model of vLLM (checked against its source, vllm/v1/worker/gpu_worker.py,
cpu_worker.py and vllm/v1/core/kv_cache_utils.py, and against the fixture
logs in tests/fixtures/vllm-logs):

CUDA   available KV = gpu_memory_utilization x GPU total
                      - weights - peak activation - non-torch memory
       (or exactly kv_cache_memory_bytes when that is set: vLLM then skips
       the profile). The H200 fixture, vLLM 0.26:
           0.92 x 139.8 = 128.62 GiB - 0.70 weights - 0.29 activation
           - 0.22 non-torch = 127.41 -> "Available KV cache memory: 127.4 GiB"
           0.16 x 139.8 =  22.37 GiB - 0.70 - 0.25 - 0.22 = 21.20 -> "21.19 GiB"
       CUDA-graph memory (0.40 GiB there) is captured *after* sizing and is
       not subtracted, so it is not subtracted here either.
CPU    exactly kv_cache_memory_bytes (or VLLM_CPU_KVCACHE_SPACE GiB in the
       environment); otherwise ceil(node total x utilization) minus what the
       worker process already holds, and vLLM refuses to start when that
       requested share is more than the node has free.

Then  blocks = KV bytes // (block_size x bytes per token), tokens = blocks x
block_size, max concurrency = blocks / ceil(max_model_len / block_size), and
one block is held back (BlockPool's null block) when vLLM checks that one
request of max_model_len fits: the longest max_model_len that fits is
(blocks - 1) x block_size. That is what produced "estimated maximum model
length is 992" for a 1 MiB KV cache in the CPU fixture (32 blocks of 32).

Peak activation and non-torch memory cannot be read off the config; they
are calibrated against the H200 fixture (see ACTIVATION_CALIBRATION and
NON_TORCH_BYTES) and are small next to the KV pool for this model, which is
why the token estimate lands within a fraction of a percent there. For much
larger models, other GPUs or TP > 1 they are rougher; `notes` says so.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from ernie_tui.engine_ctl.launch.machine import Machine
from ernie_tui.engine_ctl.launch.modelinfo import DTYPE_BYTES, ModelInfo, dtype_bytes
from ernie_tui.engine_ctl.units import GiB
from ernie_tui.presets.model import Preset

# vLLM defaults (vllm/config/cache.py, vllm/platforms/cpu.py, arg_utils.py).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE = {"cuda": 16, "cpu": 128}

# Measured on the H200 fixture (vLLM 0.26, ERNIE-4.5-0.3B shapes, 8192
# batched tokens): "0.29 GiB for peak activation" and "0.25 GiB" in two runs,
# "0.22 GiB for non-torch memory" in both. Our shape model of the largest live
# tensors in one layer's forward gives 0.242 GiB for that case, so it is
# scaled by 1.1 to land on the measured mean (0.27 GiB).
ACTIVATION_CALIBRATION = 1.1
NON_TORCH_BYTES = int(0.22 * GiB)  # CUDA context, cuBLAS workspaces: per GPU
# What a CPU worker holds besides weights before it sizes an automatic KV
# cache (torch, the compiled graph, Python). Not calibrated: a rough figure.
CPU_WORKER_OVERHEAD_BYTES = int(1.0 * GiB)


def default_batched_tokens(platform: str, gpu_total_bytes: int | None, world_size: int = 1) -> int:
    """vLLM's default max_num_batched_tokens for the OpenAI server."""
    if platform == "cpu":
        return 2048 * world_size
    total = gpu_total_bytes or 0
    if total >= 160 * GiB:
        return 16384
    if total >= 70 * GiB:  # H100/H200 class (A100 80 GB excepted by vLLM: name unknown here)
        return 8192
    return 2048


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- the KV block rules: their one home (preflight, estimate and diagnose read them) ---------

# Block sizes the attention backends take (vLLM's get_supported_kernel_block_sizes):
# FlashAttention / Triton on CUDA take multiples of 16; the CPU backend MultipleOf(32).
BLOCK_MULTIPLE = {"cuda": 16, "cpu": 32}
MIB = 1 << 20
CPU_KV_FLOOR_BYTES = 64 * MIB  # the cpu-demo preset's size: a sane floor for a proposed CPU KV cache


def _platform_key(platform: str) -> str:
    return "cuda" if platform == "cuda" else "cpu"


def default_block_size(platform: str) -> int:
    """vLLM's block size when the preset sets none: 16 on CUDA, 128 on CPU."""
    return DEFAULT_BLOCK_SIZE[_platform_key(platform)]


def block_size_fix(platform: str) -> int:
    """The block size a fix proposes for one the backend refuses: the
    smallest it takes, 16 on CUDA, 32 on CPU."""
    return BLOCK_MULTIPLE[_platform_key(platform)]


def kv_blocks_needed(max_model_len: int, block_size: int, requests: int = 1) -> int:
    """KV blocks for `requests` requests of max_model_len tokens each, plus
    vLLM's null block (held back from every cache)."""
    return requests * cdiv(max_model_len, block_size) + 1


def kv_bytes_needed(max_model_len: int, block_size: int, bytes_per_token: int, requests: int = 1) -> int:
    """(ceil(len / block) x requests + 1) x block x bytes per token: the KV
    cache `requests` full-length requests need."""
    return kv_blocks_needed(max_model_len, block_size, requests) * block_size * bytes_per_token


def round_up_mib(n: float) -> int:
    return int(cdiv(int(math.ceil(n)), MIB) * MIB)


def cpu_kv_fix_bytes(est: "Estimate", available_bytes: float | None, requests: int = 8) -> int:
    """A CPU KV size to propose: room for a few full-length requests plus the
    null block, never less than CPU_KV_FLOOR_BYTES nor more than half of what
    the node has free (`available_bytes`, when known)."""
    need = kv_bytes_needed(est.max_model_len, est.block_size, est.kv_bytes_per_token, requests)
    need = max(round_up_mib(need), CPU_KV_FLOOR_BYTES)
    if available_bytes:
        need = min(need, int(available_bytes // 2) // MIB * MIB)
    return max(need, MIB)


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """vLLM shards KV heads over TP ranks and replicates them once TP exceeds
    their number (ModelConfig.get_num_kv_heads): max(1, kv_heads // tp)."""
    return max(1, kv_heads // max(1, tp))


def kv_cache_dtype_bytes(preset: Preset, info: ModelInfo) -> float:
    kv = str(preset.get("kv_cache_dtype", "auto")).lower()
    # Quantized KV formats (vLLM 0.32's --kv-cache-dtype choices); scales add
    # a little on top, which this ignores.
    if "k8v4" in kv:  # 8-bit keys, 4-bit values
        return 0.75
    if kv.startswith("fp8") or kv.startswith("int8") or kv == "uint8":
        return 1
    if kv.startswith(("int4", "nvfp4")) or "4bit" in kv:
        return 0.5
    if "3bit" in kv:
        return 0.375
    if kv not in ("auto", ""):
        try:
            return dtype_bytes(kv)
        except ValueError:
            pass
    return dtype_bytes(serving_dtype(preset, info))


def serving_dtype(preset: Preset, info: ModelInfo) -> str:
    d = str(preset.get("dtype", "auto")).lower()
    # An invalid dtype is the argument check's business; size as vLLM's auto would.
    return info.serving_dtype if d == "auto" or d not in DTYPE_BYTES else d


def kv_bytes_per_token(info: ModelInfo, tp: int = 1, pp: int = 1, kv_dtype_bytes: float = 2) -> int:
    """2 (K and V) x layers on the largest stage x KV heads per rank x head_dim x bytes."""
    layers = cdiv(info.num_layers, max(1, pp))
    return int(2 * layers * kv_heads_per_rank(info.num_kv_heads, tp) * info.head_dim * kv_dtype_bytes)


def _params_from_config(info: ModelInfo) -> int:
    """Dense-model parameter count from shapes, for dirs without safetensors."""
    h, i, v = info.hidden_size, info.intermediate_size or 4 * info.hidden_size, info.vocab_size or 0
    q = h * info.num_attention_heads * info.head_dim
    kv = 2 * h * info.num_kv_heads * info.head_dim
    per_layer = q + kv + q + 3 * h * i + 2 * h
    return v * h * (1 if info.tie_word_embeddings else 2) + info.num_layers * per_layer + h


def weight_bytes_per_rank(info: ModelInfo, dtype: str, tp: int = 1, pp: int = 1) -> tuple[int, list[str]]:
    notes: list[str] = []
    if info.parameter_count:
        total = info.weight_bytes(dtype)
    else:
        total = int(_params_from_config(info) * dtype_bytes(dtype))
        notes.append("no safetensors headers: weight size computed from config shapes (dense model assumed)")
    # The rotary cos/sin cache (max_position x head_dim, model dtype) is a
    # buffer vLLM allocates beside the weights; it is the 0.03 GiB gap between
    # the fixture's 0.672 GiB of tensors and its "Model loading took 0.7 GiB".
    rope = int((info.max_position_embeddings or 0) * info.head_dim * dtype_bytes(dtype))
    return total // max(1, tp * pp) + rope, notes


def activation_bytes(info: ModelInfo, batched_tokens: int, dtype: str, tp: int = 1) -> int:
    """Peak activation of vLLM's profile run: the largest live tensors of one
    layer for `batched_tokens` tokens (gate_up 2I + act I, ~4 hidden-sized
    buffers, q/k/v), scaled to the H200 fixture's measured peak."""
    tp = max(1, tp)
    inter = (info.intermediate_size or 4 * info.hidden_size) / tp
    qkv = (info.num_attention_heads / tp + 2 * kv_heads_per_rank(info.num_kv_heads, tp)) * info.head_dim
    per_token = 3 * inter + 4 * info.hidden_size + qkv
    return int(ACTIVATION_CALIBRATION * batched_tokens * per_token * dtype_bytes(dtype))


@dataclass
class Estimate:
    platform: str
    block_size: int
    max_model_len: int
    weights_bytes: int  # per rank
    kv_bytes_per_token: int  # per rank
    kv_cache_bytes: int  # per rank; negative: vLLM would find no room at all
    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len_fit: int  # the longest max_model_len one request can have (vLLM's estimate)
    source: str  # where the KV size comes from, in words
    requested_bytes: int | None = None  # util x total (the share vLLM claims), when relevant
    activation_bytes: int = 0
    non_torch_bytes: int = 0
    kv_heads_per_rank: int = 0
    kv_heads_replicated: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def weights_gib(self) -> float:
        return self.weights_bytes / GiB

    @property
    def kv_cache_gib(self) -> float:
        return self.kv_cache_bytes / GiB

    def to_dict(self) -> dict[str, Any]:
        """The `estimate` object of `ernie-tui check --json`."""
        return {
            "weights_gib": round(self.weights_gib, 3),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_gib": round(self.kv_cache_gib, 3),
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": round(self.max_concurrency, 2),
        }

    def to_full_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.update(self.to_dict())
        return d


def _env(preset: Preset, env: Mapping[str, str] | None) -> dict[str, str]:
    merged = dict(os.environ if env is None else env)
    merged.update(preset.env)
    return merged


def estimate_capacity(preset: Preset, info: ModelInfo, machine: Machine,
                      env: Mapping[str, str] | None = None) -> Estimate:
    """What vLLM will allocate for this preset on this machine."""
    platform = machine.platform
    tp = preset.tensor_parallel_size
    pp = int(preset.get("pipeline_parallel_size", 1))
    block = int(preset.block_size or default_block_size(platform))
    max_len = int(preset.max_model_len or info.derived_max_model_len)
    dtype = serving_dtype(preset, info)
    per_token = kv_bytes_per_token(info, tp, pp, kv_cache_dtype_bytes(preset, info))
    weights, notes = weight_bytes_per_rank(info, dtype, tp, pp)
    heads_rank = kv_heads_per_rank(info.num_kv_heads, tp)
    replicated = tp > info.num_kv_heads
    if replicated:
        notes.append(f"{info.num_kv_heads} KV heads at TP {tp}: each is replicated on "
                     f"{tp // info.num_kv_heads} ranks, so KV per token per rank does not shrink further")
    e = _env(preset, env)
    if platform == "cpu":
        budget = _cpu_kv_budget(preset, machine, e, weights, notes)
    else:
        budget = _gpu_kv_budget(preset, info, machine, dtype, weights, notes)
    kv = budget.kv
    bytes_per_block = per_token * block
    num_blocks = max(0, kv // bytes_per_block) if bytes_per_block else 0
    tokens = num_blocks * block
    per_request = cdiv(max_len, block)
    return Estimate(
        platform=platform,
        block_size=block,
        max_model_len=max_len,
        weights_bytes=weights,
        kv_bytes_per_token=per_token,
        kv_cache_bytes=int(kv),
        num_blocks=int(num_blocks),
        kv_cache_tokens=int(tokens),
        max_concurrency=num_blocks / per_request if per_request else 0.0,
        max_model_len_fit=max_len_that_fits(int(kv), per_token, block),
        source=budget.source,
        requested_bytes=budget.requested,
        activation_bytes=budget.act,
        non_torch_bytes=budget.non_torch,
        kv_heads_per_rank=heads_rank,
        kv_heads_replicated=replicated,
        notes=notes,
    )


@dataclass
class _KvBudget:
    """The bytes left to the KV cache, and where the figure came from."""

    kv: int
    source: str
    requested: int | None = None  # the memory vLLM asks for (utilization x total), where it asks
    act: int = 0  # activation peak (GPU)
    non_torch: int = 0  # memory outside torch's allocator (GPU)


def _cpu_kv_budget(preset: Preset, machine: Machine, e: Mapping[str, str], weights: int,
                   notes: list[str]) -> _KvBudget:
    explicit = preset.kv_cache_memory_bytes
    space = e.get("VLLM_CPU_KVCACHE_SPACE", "")
    if explicit is None and space.strip().isdigit():
        # vllm/platforms/cpu.py: the legacy env var sets kv_cache_memory_bytes.
        explicit = int(space) * GiB
        source_expl = f"VLLM_CPU_KVCACHE_SPACE={space} GiB"
    else:
        source_expl = "kv_cache_memory_bytes"
    if explicit is not None:
        return _KvBudget(explicit, source_expl)
    util = float(preset.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    total = machine.cpu_total_bytes or 0
    requested = math.ceil(total * util)
    notes.append("CPU without kv_cache_memory_bytes: the worker's own memory is a rough figure; "
                 "set kv_cache_memory_bytes for an exact size")
    return _KvBudget(requested - weights - CPU_WORKER_OVERHEAD_BYTES,
                     f"CPU default: gpu_memory_utilization {util} x node memory {total / GiB:.2f} GiB, "
                     "less the worker's own memory", requested=requested)


def _gpu_kv_budget(preset: Preset, info: ModelInfo, machine: Machine, dtype: str, weights: int,
                   notes: list[str]) -> _KvBudget:
    explicit = preset.kv_cache_memory_bytes
    if explicit is not None:
        return _KvBudget(explicit, "kv_cache_memory_bytes (vLLM skips memory profiling)")
    util = float(preset.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
    gpu_total = machine.gpu_total_bytes
    if gpu_total is None:
        notes.append("GPU total memory unknown; KV cache not estimated")
        return _KvBudget(0, "unknown: GPU memory not known (pass --gpu-memory-gib)")
    tp = preset.tensor_parallel_size
    pp = int(preset.get("pipeline_parallel_size", 1))
    requested = int(gpu_total * util)
    tokens = int(preset.get("max_num_batched_tokens") or default_batched_tokens("cuda", gpu_total))
    act = activation_bytes(info, tokens, dtype, tp)
    non_torch = NON_TORCH_BYTES
    if tp > 1 or pp > 1:
        notes.append("activation and non-torch memory are calibrated on one GPU; "
                     "NCCL buffers at TP/PP > 1 are not counted")
    return _KvBudget(requested - weights - act - non_torch,
                     f"gpu_memory_utilization {util} x {gpu_total / GiB:.1f} GiB",
                     requested=requested, act=act, non_torch=non_torch)


def max_len_that_fits(kv_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """The longest max_model_len one request can use, as vLLM's
    estimate_max_model_len finds it: whole blocks, less the null block."""
    if kv_bytes <= 0 or bytes_per_token <= 0:
        return 0
    blocks = kv_bytes // (bytes_per_token * block_size)
    return max(0, (blocks - 1) * block_size)


# -- estimate vs what the log said ------------------------------------------------

@dataclass
class ComparisonRow:
    name: str
    estimated: float | None
    reported: float | None

    @property
    def error_pct(self) -> float | None:
        if self.estimated is None or self.reported in (None, 0):
            return None
        return (self.estimated - self.reported) / abs(self.reported) * 100.0

    def to_dict(self) -> dict[str, Any]:
        err = self.error_pct
        return {"name": self.name, "estimated": self.estimated, "reported": self.reported,
                "error_pct": None if err is None else round(err, 2)}


def compare_with_report(estimate: Estimate, report: Any) -> list[ComparisonRow]:
    """Estimate beside an EngineReport (what vLLM's log said), one row per
    figure both know. error_pct = (estimated - reported) / reported."""
    rows = [
        ComparisonRow("weights_gib", estimate.weights_gib, getattr(report, "weights_gib", None)),
        ComparisonRow("kv_cache_gib", estimate.kv_cache_gib, getattr(report, "kv_cache_gib", None)),
        ComparisonRow("kv_cache_tokens", estimate.kv_cache_tokens, getattr(report, "kv_cache_tokens", None)),
        ComparisonRow("max_concurrency", estimate.max_concurrency, getattr(report, "max_concurrency", None)),
    ]
    return [r for r in rows if r.reported is not None]
