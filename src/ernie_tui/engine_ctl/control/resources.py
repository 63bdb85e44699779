"""GPU memory (NVML) or, without NVML, the engine's RSS (psutil).

The dashboard's memory chart and the burst's peak memory both come from a
ResourceSampler. It says which source it shows, because on the CPU backend
(or a box without an NVIDIA driver) "memory" means the engine process tree's
resident set, not GPU memory, and an operator must not confuse the two.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil

try:  # nvidia-ml-py; present as a dependency, but the driver may be absent
    import pynvml
except ImportError:  # pragma: no cover - only without the package
    pynvml = None

# What NVML calls raise (a missing library, no driver, a lost GPU, no permission).
NVMLError: type[Exception] = pynvml.NVMLError if pynvml is not None else OSError


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    used_bytes: int
    total_bytes: int
    util_pct: float | None


@dataclass(frozen=True)
class MemorySample:
    t: float  # time.time()
    source: str  # "nvml" or "rss"
    gpus: tuple[GpuSample, ...] = ()
    engine_bytes: int | None = None  # memory of the engine's own processes
    per_pid: dict[int, int] = field(default_factory=dict)

    @property
    def shown_bytes(self) -> int | None:
        """The one number a summary shows: total GPU memory used, or RSS."""
        if self.source == "nvml":
            return sum(g.used_bytes for g in self.gpus)
        return self.engine_bytes


def _visible_indices(count: int) -> list[int]:
    """Honour CUDA_VISIBLE_DEVICES when it lists plain indices."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None or value.strip() == "":
        return list(range(count)) if value is None else []
    out = []
    for part in value.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < count:
            out.append(int(part))
        elif part and not part.isdigit():
            return list(range(count))  # UUIDs/MIG names: show every device
    return out


def _memory_info(handle: Any) -> Any:
    """Memory as nvidia-smi reports it. NVML's v1 'used' also counts the
    driver's reserved memory (0.6 GiB on an H200, measured against
    nvidia-smi), so prefer v2, whose 'used' leaves that out."""
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except NVMLError:  # an older driver without the v2 call
            pass
    return pynvml.nvmlDeviceGetMemoryInfo(handle)


class ResourceSampler:
    """Sample memory now; `pids` returns the engine's process ids (may be empty)."""

    def __init__(self, pids: Callable[[], list[int]] | None = None, use_nvml: bool = True):
        self._pids = pids or (lambda: [])
        self.nvml = False
        self.reason: str | None = None
        self._handles: list[tuple[int, object]] = []
        if not use_nvml:
            self.reason = "NVML disabled"
        elif pynvml is None:
            self.reason = "nvidia-ml-py not installed"
        else:
            try:
                pynvml.nvmlInit()
                count = pynvml.nvmlDeviceGetCount()
                self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in _visible_indices(count)]
                if self._handles:
                    self.nvml = True
                else:
                    self.reason = "NVML found no visible GPU"
                    pynvml.nvmlShutdown()
            except NVMLError as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                self.reason = f"NVML unavailable: {exc}"

    @property
    def label(self) -> str:
        if self.nvml:
            return "GPU memory used (NVML)"
        return f"engine RSS (psutil; {self.reason})"

    def sample(self) -> MemorySample:
        now = time.time()
        pids = self._pids()
        if self.nvml:
            try:
                return self._sample_nvml(now, pids)
            except NVMLError as exc:  # the driver went away mid-session
                self.nvml = False
                self.reason = f"NVML failed: {exc}"
        per_pid: dict[int, int] = {}
        for pid in pids:
            try:
                per_pid[pid] = psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
        return MemorySample(t=now, source="rss", engine_bytes=sum(per_pid.values()) if per_pid else None,
                            per_pid=per_pid)

    def _sample_nvml(self, now: float, pids: list[int]) -> MemorySample:
        gpus = []
        per_pid: dict[int, int] = {}
        wanted = set(pids)
        for index, handle in self._handles:
            mem = _memory_info(handle)
            try:
                util = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except NVMLError:
                util = None
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode()
            gpus.append(GpuSample(index, name, int(mem.used), int(mem.total), util))
            try:
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = getattr(p, "usedGpuMemory", None)
                    if p.pid in wanted and used:
                        per_pid[p.pid] = per_pid.get(p.pid, 0) + int(used)
            except NVMLError:
                pass  # per-process figures need privileges some boxes lack
        return MemorySample(t=now, source="nvml", gpus=tuple(gpus),
                            engine_bytes=sum(per_pid.values()) if per_pid else None, per_pid=per_pid)

    def close(self) -> None:
        if self.nvml and pynvml is not None:
            try:
                pynvml.nvmlShutdown()
            except NVMLError:
                pass
            self.nvml = False


def used_on(sample: MemorySample, gpus: set[int] | None) -> int | None:
    """A sample's memory figure, with NVML limited to the GPUs `gpus` (None: all)."""
    if sample.source != "nvml" or gpus is None:
        return sample.shown_bytes
    return sum(g.used_bytes for g in sample.gpus if g.index in gpus)


class EngineMemory:
    """A burst's `memory_sampler`: the engine's memory now, in bytes (GPU
    memory with NVML, else the engine's RSS), with `source` "nvml" or "rss"
    for the record. Give it the engine's `pids` (it then owns a sampler and
    close() ends it) or an existing `sampler` (its owner closes that). With
    `gpus` (NVML indices) GPU memory counts those GPUs only: a parallel sweep's
    trial, whose neighbour fills the other GPUs."""

    def __init__(self, pids: Callable[[], list[int]] | None = None, *,
                 sampler: ResourceSampler | None = None, use_nvml: bool = True,
                 gpus: set[int] | None = None) -> None:
        self._owned = sampler is None
        self.gpus = gpus
        self.sampler = sampler if sampler is not None else ResourceSampler(pids, use_nvml=use_nvml)
        self.source = "nvml" if self.sampler.nvml else "rss"

    def __call__(self) -> float | None:
        return used_on(self.sampler.sample(), self.gpus)

    def close(self) -> None:
        if self._owned:
            self.sampler.close()
