"""Facts about the machine a preset will run on.

Platform (cuda when NVML finds GPUs, else cpu), the GPUs vLLM will see
(honouring CUDA_VISIBLE_DEVICES, including a preset's own env), each GPU's
total and free memory from NVML, and the CPU memory vLLM's CPU backend
sizes itself against. Everything can be overridden (`--platform`, `--gpus`,
`--gpu-memory-gib`) to judge a machine you are not on.

CPU memory follows vLLM's CPU worker (vllm/utils/cpu_resource_utils.py,
get_memory_node_info): NUMA node 0's meminfo when the kernel exposes it
(free + file cache + reclaimable slab), clamped by a cgroup limit, else
psutil. On this kind of box node 0 and psutil disagree by a wide margin,
and it is node 0 that vLLM compares `--gpu-memory-utilization` against.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from ernie_tui.engine_ctl.units import GiB

# Device memory a fresh CUDA context takes before vLLM measures "free":
# 139.80 GiB free in NVML vs "Free memory on device (139.29/139.8 GiB)" on the H200.
# Preflight and the diagnosis both subtract it from NVML's free memory.
CUDA_CONTEXT_BYTES = int(0.51 * GiB)


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML index (CUDA ordinal before CUDA_VISIBLE_DEVICES remaps it)
    name: str
    total_bytes: int | None
    free_bytes: int | None
    uuid: str | None = None


@dataclass(frozen=True)
class Machine:
    platform: str  # "cuda" | "cpu"
    gpus: tuple[GpuInfo, ...] = ()
    cpu_total_bytes: int | None = None
    cpu_available_bytes: int | None = None
    source: str = "detected"  # how the GPU facts were obtained, for messages
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_total_bytes(self) -> int | None:
        """The smallest visible GPU's total: vLLM sizes every rank alike."""
        vals = [g.total_bytes for g in self.gpus if g.total_bytes is not None]
        return min(vals) if vals else None

    @property
    def gpu_free_bytes(self) -> int | None:
        vals = [g.free_bytes for g in self.gpus if g.free_bytes is not None]
        return min(vals) if vals else None

    def to_dict(self) -> dict:
        return {
            "platform": self.platform,
            "gpus": [g.__dict__ for g in self.gpus],
            "cpu_total_bytes": self.cpu_total_bytes,
            "cpu_available_bytes": self.cpu_available_bytes,
            "source": self.source,
            "notes": list(self.notes),
        }


# -- NVML ----------------------------------------------------------------------

def nvml_gpus() -> tuple[list[GpuInfo] | None, str]:
    """All GPUs NVML sees, or (None, why not). Never raises. (The front
    door's name for _nvml_gpus, looked up when called: tests replace it.)"""
    return _nvml_gpus()


def _nvml_gpus() -> tuple[list[GpuInfo] | None, str]:
    """All GPUs NVML sees, or (None, why not). Never raises."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as exc:  # not installed, or a broken install
        return None, f"nvidia-ml-py not importable ({exc.__class__.__name__})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded...
        return None, f"NVML unavailable: {exc}"
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            try:
                uuid = pynvml.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            except pynvml.NVMLError:
                uuid = None
            total = free = None
            try:
                # v2 reports the driver's reserved memory apart; total minus
                # reserved is what CUDA (and so vLLM) calls the total: on an
                # H200 143,771 MiB in NVML but "139.8 GiB" in vLLM's log.
                mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
                total, free = int(mem.total) - int(mem.reserved), int(mem.free)
            except (pynvml.NVMLError, AttributeError):  # no v2 call (AttributeError: an older nvidia-ml-py)
                try:
                    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                    total, free = int(mem.total), int(mem.free)
                except pynvml.NVMLError:
                    pass
            out.append(GpuInfo(index=i, name=name, total_bytes=total, free_bytes=free, uuid=uuid))
        return out, "nvml"
    except pynvml.NVMLError as exc:
        return None, f"NVML query failed: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def visible_gpus(all_gpus: list[GpuInfo], cuda_visible_devices: str | None) -> list[GpuInfo]:
    """Apply CUDA_VISIBLE_DEVICES as the CUDA runtime does: indices or UUID
    prefixes, in the listed order; an entry that matches nothing hides it and
    everything after it; '' or '-1' hides all GPUs."""
    if cuda_visible_devices is None:
        return list(all_gpus)
    out: list[GpuInfo] = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        match = None
        if entry.lstrip("-").isdigit():
            i = int(entry)
            match = next((g for g in all_gpus if g.index == i), None) if i >= 0 else None
        elif entry:
            # "GPU-8d3c..." or a unique prefix of it; MIG ids are not resolved here.
            cands = [g for g in all_gpus if g.uuid and g.uuid.startswith(entry if entry.startswith("GPU-")
                                                                        else "GPU-" + entry)]
            match = cands[0] if len(cands) == 1 else None
        if match is None or match in out:
            break
        out.append(match)
    return out


# -- CPU memory -------------------------------------------------------------------

def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cpu_memory(node: int = 0) -> tuple[int | None, int | None, str]:
    """(total, available, source) the way vLLM's CPU worker measures them."""
    total = avail = None
    source = "psutil"
    meminfo = Path(f"/sys/devices/system/node/node{node}/meminfo")
    try:
        fields: dict[str, int] = {}
        for line in meminfo.read_text().splitlines():
            parts = line.split()  # "Node 0 MemTotal:  8742684 kB"
            if len(parts) >= 4:
                fields[parts[2].rstrip(":")] = int(parts[3]) * 1024
        total = fields["MemTotal"]
        avail = fields["MemFree"] + fields["Active(file)"] + fields["Inactive(file)"] + fields["SReclaimable"]
        source = f"NUMA node {node} meminfo"
    except (OSError, KeyError, ValueError):
        try:
            import psutil

            vm = psutil.virtual_memory()
            total, avail = int(vm.total), int(vm.available)
        except (ImportError, OSError):
            return None, None, "unknown"
    limit = _read_int("/sys/fs/cgroup/memory.max")
    usage = _read_int("/sys/fs/cgroup/memory.current") if limit is not None else None
    if limit is None:
        v1 = _read_int("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        if v1 is not None and v1 < (1 << 62):
            limit, usage = v1, _read_int("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    if limit is not None and total is not None and limit < total:
        total = limit
        avail = max(0, min(avail or 0, limit - (usage or 0)))
        source += " clamped by cgroup limit"
    return total, avail, source


# -- the whole picture -------------------------------------------------------------

def detect_machine(
    platform: str | None = None,
    gpus: int | None = None,
    gpu_memory_gib: float | None = None,
    env: Mapping[str, str] | None = None,
) -> Machine:
    """The target machine. `env` is the launch environment (os.environ plus
    the preset's env) so a preset's CUDA_VISIBLE_DEVICES counts; the three
    overrides replace what detection found."""
    if platform not in (None, "cuda", "cpu"):
        raise ValueError(f"platform must be 'cuda' or 'cpu', got {platform!r}")
    env = dict(os.environ if env is None else env)
    notes: list[str] = []
    cpu_total, cpu_avail, cpu_source = cpu_memory()
    if cpu_source not in ("psutil", "unknown"):
        notes.append(f"CPU memory from {cpu_source}")

    detected: list[GpuInfo] = []
    source = "nvml"
    if platform != "cpu":
        found, why = _nvml_gpus()
        if found is None:
            source = why
            if platform is None:
                notes.append(f"{why}: judging for the CPU backend")
        else:
            detected = visible_gpus(found, env.get("CUDA_VISIBLE_DEVICES"))
            if "CUDA_VISIBLE_DEVICES" in env:
                notes.append(f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}: "
                             f"{len(detected)} of {len(found)} GPUs visible")
    plat = platform or ("cuda" if detected else "cpu")

    if plat == "cpu":
        return Machine(platform="cpu", gpus=(), cpu_total_bytes=cpu_total, cpu_available_bytes=cpu_avail,
                       source="override" if platform else ("cpu" if source == "nvml" else source),
                       notes=tuple(notes))

    # CUDA: apply the overrides.
    result = list(detected)
    if gpus is not None:
        if gpus < 0:
            raise ValueError("--gpus must be >= 0")
        template = result[0] if result else GpuInfo(index=0, name="assumed GPU", total_bytes=None, free_bytes=None)
        result = result[:gpus] + [replace(template, index=i, uuid=None)
                                  for i in range(len(result[:gpus]), gpus)]
        source = "override" if not detected else source + " + --gpus"
    elif not detected and platform == "cuda":
        # Judging a CUDA box from a machine without one: one GPU unless told.
        result = [GpuInfo(index=0, name="assumed GPU", total_bytes=None, free_bytes=None)]
        notes.append("no GPU detected here: assuming one (pass --gpus N)")
    if gpu_memory_gib is not None:
        if gpu_memory_gib <= 0:
            raise ValueError("--gpu-memory-gib must be positive")
        total = int(gpu_memory_gib * GiB)
        # A machine described by flags is assumed idle: all of it free.
        result = [replace(g, total_bytes=total, free_bytes=total if g.free_bytes is None or not detected
                          else min(g.free_bytes, total)) for g in result]
        source = source + " + --gpu-memory-gib" if detected else "override"
    return Machine(platform="cuda", gpus=tuple(result), cpu_total_bytes=cpu_total,
                   cpu_available_bytes=cpu_avail, source=source, notes=tuple(notes))
