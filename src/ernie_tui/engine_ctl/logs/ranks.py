"""The engine's processes rank by rank, as the log names them.

vLLM prefixes every line with the process that wrote it: `(EngineCore_DP1
pid=7)` for data-parallel engine 1 (vllm/v1/engine/core.py), `(Worker_TP1
pid=9)` / `(Worker_DP1_TP0 pid=9)` / `(Worker_PP1_TP0 pid=9)` for a worker of
a parallel group (vllm/v1/executor/multiproc_executor.py), plain
`(EngineCore pid=7)` and `(Worker pid=9)` without parallelism, older
`(VllmWorker-1 pid=9)`, and under Ray `(RayWorkerWrapper pid=9, ip=10.0.0.2)`.
The API server and the DP coordinator are processes but no ranks.

A rank's KV and memory figures are the lines it printed itself: the worker
(or an engine with its worker in-process) logs the weights' memory and the
KV cache memory, the engine core the KV cache size in tokens and the
concurrency. vLLM logs most of them once per node (`info_once`, local rank
0), so other ranks often show only their pid.

The list is copy-on-write (a new list of frozen entries on every change), so
a shallow copy of a report taken for the screen never changes under it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ernie_tui.engine_ctl.logs.report import RankInfo

_NOT_RANKS = ("APIServer", "ApiServer", "DPCoordinator", "CoreEngineActorManager")
_GENERIC = ("Worker", "VllmWorker", "EngineCore")


# A rank of a parallel group: DP/TP/PP/... index in the name, or a Ray worker.
_PARALLEL = re.compile(r"_(?:DP|TP|PP|PCP|DCP|EP)\d|^Ray|^DPEngineCoreActor")


def is_rank(role: str) -> bool:
    return not role.startswith(_NOT_RANKS)


def _better_name(old: str, new: str) -> str:
    """One process under two names ("Worker" before its groups exist, then
    "Worker_TP0"): keep the one that says more."""
    if old in _GENERIC and new != old and new.startswith(old):
        return new
    if old.startswith("Ray") and not new.startswith("Ray") and _PARALLEL.search(new):
        return new  # Ray's hop ("RayWorkerProc") before the worker's own "Worker_TP1"
    return old


def note_rank(ranks: list[RankInfo], name: str, pid: int, **figures: float | int | None) -> list[RankInfo]:
    """`ranks` with this process recorded and its figures (those not None)
    set; the same list when nothing changed, else a new one."""
    known: dict[str, Any] = {k: v for k, v in figures.items() if v is not None}  # RankInfo's own field types
    for i, r in enumerate(ranks):
        if r.pid == pid:
            better = _better_name(r.name, name)
            if better == r.name and all(getattr(r, k) == v for k, v in known.items()):
                return ranks  # the common case: a known rank's next line
            out = list(ranks)
            out[i] = replace(r, name=better, **known)
            return out
    return [*ranks, RankInfo(name=name, pid=pid, **known)]


def describe_rank(rank: RankInfo) -> str:
    """'EngineCore_DP1 pid 7: KV 12.5 GiB = 1,234,512 tokens, 301.39x' (only what is known)."""
    parts = []
    if rank.weights_gib is not None:
        parts.append(f"weights {rank.weights_gib:g} GiB")
    if rank.kv_cache_gib is not None or rank.kv_cache_tokens is not None:
        kv = "KV"
        if rank.kv_cache_gib is not None:
            kv += f" {rank.kv_cache_gib:g} GiB"
        if rank.kv_cache_tokens is not None:
            kv += (" =" if rank.kv_cache_gib is not None else "") + f" {rank.kv_cache_tokens:,} tokens"
        parts.append(kv)
    if rank.max_concurrency is not None:
        parts.append(f"{rank.max_concurrency:.2f}x concurrency")
    return f"{rank.name} pid {rank.pid}" + (": " + ", ".join(parts) if parts else "")


def parallel_ranks(ranks: list[RankInfo]) -> list[RankInfo]:
    """All ranks when the server runs in parallel (a DP/TP/PP/Ray rank among
    them), else none: a one-GPU server's EngineCore needs no list."""
    return list(ranks) if any(_PARALLEL.search(r.name) for r in ranks) else []
