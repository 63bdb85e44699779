"""How a preset spreads vLLM over GPUs and nodes: tensor, pipeline and data
parallelism, headless workers, the executor backend.

One reading of a preset's parallel keys, shared by preflight (does it fit
the GPUs this node has?) and the parallel sweep (how many GPUs does one
trial take?). The rules follow vLLM 0.32's EngineArgs.create_engine_config
and ParallelConfig (vllm/engine/arg_utils.py, vllm/config/parallel.py):

- one engine's world is tp x pp x pcp (prefill context parallel) ranks;
- data_parallel_size engines in all, data_parallel_size_local of them on
  this node (unset: all of them, on one node);
- with nnodes > 1 (multi-node TP/PP under the mp backend) each node holds
  world / nnodes ranks;
- `headless` nodes run engines only (no API server) and reach the head at
  data_parallel_address:data_parallel_rpc_port; the head uses that port only
  when some engines live elsewhere (dp_local < dp), else local IPC.
"""

from __future__ import annotations

from dataclasses import dataclass

from ernie_tui.presets.model import Preset

# ParallelConfig.data_parallel_rpc_port's default in vLLM 0.26 and 0.32.
DEFAULT_DP_RPC_PORT = 29550


def _int(preset: Preset, key: str, default: int) -> int:
    value = preset.get(key, default)
    if isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class ParallelLayout:
    tp: int = 1
    pp: int = 1
    pcp: int = 1
    dp: int = 1
    dp_local: int = 1
    dp_local_set: bool = False  # the preset names data_parallel_size_local
    dp_start_rank: int | None = None
    nnodes: int = 1
    headless: bool = False
    address: str | None = None  # data_parallel_address
    rpc_port: int = DEFAULT_DP_RPC_PORT
    backend: str | None = None  # distributed_executor_backend as written
    dp_backend: str | None = None  # data_parallel_backend as written

    @property
    def world_per_engine(self) -> int:
        return self.tp * self.pp * self.pcp

    @property
    def gpus_here(self) -> int:
        """GPUs this node's share of the server takes."""
        if self.nnodes > 1:
            return max(1, self.world_per_engine * self.dp // self.nnodes)
        return self.world_per_engine * self.dp_local

    @property
    def uses_ray(self) -> bool:
        return self.backend == "ray" or self.dp_backend == "ray"

    @property
    def remote_engines(self) -> bool:
        """Some DP engines run on other nodes (so the RPC port is used)."""
        return self.dp > 1 and (self.headless or self.dp_local < self.dp)

    def describe(self) -> str:
        """'tp 2 x pp 1 x dp-local 2' style, only the factors that are set."""
        parts = [f"tensor_parallel_size {self.tp}"]
        if self.pp > 1:
            parts.append(f"pipeline_parallel_size {self.pp}")
        if self.pcp > 1:
            parts.append(f"prefill_context_parallel_size {self.pcp}")
        if self.nnodes > 1:
            parts.append(f"data_parallel_size {self.dp} / nnodes {self.nnodes}")
        elif self.dp > 1 or self.dp_local_set:
            parts.append(f"data_parallel_size_local {self.dp_local}" if self.dp_local_set
                         else f"data_parallel_size {self.dp}")
        return " x ".join(parts)


def layout_of(preset: Preset) -> ParallelLayout:
    dp = max(1, _int(preset, "data_parallel_size", 1))
    dp_local_set = "data_parallel_size_local" in preset.engine_args
    dp_local = _int(preset, "data_parallel_size_local", dp) if dp_local_set else dp
    start = preset.get("data_parallel_start_rank")
    backend = preset.get("distributed_executor_backend")
    dp_backend = preset.get("data_parallel_backend")
    address = preset.get("data_parallel_address")
    return ParallelLayout(
        tp=max(1, _int(preset, "tensor_parallel_size", 1)),
        pp=max(1, _int(preset, "pipeline_parallel_size", 1)),
        pcp=max(1, _int(preset, "prefill_context_parallel_size", 1)),
        dp=dp, dp_local=max(0, dp_local), dp_local_set=dp_local_set,
        dp_start_rank=start if isinstance(start, int) and not isinstance(start, bool) else None,
        nnodes=max(1, _int(preset, "nnodes", 1)),
        headless=preset.get("headless") is True,
        address=str(address) if address not in (None, "") else None,
        rpc_port=_int(preset, "data_parallel_rpc_port", DEFAULT_DP_RPC_PORT),
        backend=str(backend) if isinstance(backend, str) else None,
        dp_backend=str(dp_backend) if isinstance(dp_backend, str) else None,
    )


def gpus_needed(preset: Preset) -> int:
    """GPUs one launch of `preset` takes on this node (at least 1)."""
    return max(1, layout_of(preset).gpus_here)
