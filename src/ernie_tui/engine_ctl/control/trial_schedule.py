"""Which sweep trials run at the same time, on which GPUs.

Pure bookkeeping, no threads and no processes (engine_ctl/control/sweep.py runs the
trials): a pool of GPU ids, the trials waiting in plan order, and the ones
running. A trial takes a set of GPUs no other running trial holds, so two
trials never share a GPU; it gives them back when it ends. The scheduler
starts, in plan order, every waiting trial whose set fits in what is free
(first fit: a small trial may pass a big one that has to wait for more GPUs).

Each trial's set is `gpus_per_trial` GPUs, or with "auto" exactly what its
preset needs (parallel_layout.gpus_needed: tp x pp x dp-local). A preset
that needs more than its set, or more than the pool, can never run; those
are listed by `unfit()` with the reason and never started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping

from ernie_tui.engine_ctl.launch import gpus_needed, layout_of, nvml_gpus
from ernie_tui.presets.model import Preset


class GpuIdsError(ValueError):
    """The GPUs to schedule on are unknown or malformed (message for humans)."""


def parse_gpu_ids(text: str) -> list[str]:
    """'0,1' or 'GPU-8d3c...,GPU-1a2b...' -> the ids, as CUDA_VISIBLE_DEVICES takes them."""
    ids = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not i for i in ids):
        raise GpuIdsError(f"--gpus takes GPU ids separated by commas, like 0,1; got {text!r}")
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise GpuIdsError(f"--gpus names GPU {dup[0]} twice; each GPU goes to one trial at a time")
    return ids


def detect_gpu_ids(explicit: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """The GPU ids trials are spread over: `--gpus LIST`, else this process's
    CUDA_VISIBLE_DEVICES, else every GPU NVML sees. Raises GpuIdsError when
    none of them says (no NVML: a CPU box, or no driver)."""
    if explicit is not None:
        return parse_gpu_ids(explicit)
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        if visible.strip() in ("", "-1"):
            raise GpuIdsError(f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU: there is nothing to spread "
                              "trials over; pass --gpus 0,1 (or unset it)")
        return parse_gpu_ids(visible)

    found, why = nvml_gpus()
    if not found:
        why = why if found is None else "NVML found no GPU"
        raise GpuIdsError(f"--gpus-per-trial needs to know the GPUs, and this machine does not say ({why}); "
                          "pass them with --gpus 0,1")
    return [str(g.index) for g in found]


@dataclass(frozen=True)
class Trial:
    index: int  # position in the plan's order
    repeat: int
    preset: Preset

    @property
    def gpus_needed(self) -> int:
        return gpus_needed(self.preset)


@dataclass(frozen=True)
class Assignment:
    trial: Trial
    gpus: tuple[str, ...]

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.gpus)


@dataclass
class TrialScheduler:
    trials: list[Trial]
    gpu_ids: list[str]
    gpus_per_trial: int | None = None  # None: "auto", each trial gets what its preset needs
    pending: list[Trial] = field(init=False)
    running: list[Assignment] = field(init=False, default_factory=list)
    _free: list[str] = field(init=False)
    _unfit: list[tuple[Trial, str]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not self.gpu_ids:
            raise GpuIdsError("no GPUs to schedule trials on")
        if self.gpus_per_trial is not None and self.gpus_per_trial < 1:
            raise GpuIdsError("--gpus-per-trial must be at least 1 (or auto)")
        self._free = list(self.gpu_ids)
        self.pending = []
        for t in self.trials:
            why = self._why_unfit(t)
            if why:
                self._unfit.append((t, why))
            else:
                self.pending.append(t)

    def size_for(self, trial: Trial) -> int:
        return self.gpus_per_trial or trial.gpus_needed

    def _why_unfit(self, trial: Trial) -> str | None:
        need = trial.gpus_needed
        what = layout_of(trial.preset).describe()
        if self.gpus_per_trial is not None and need > self.gpus_per_trial:
            return (f"needs {need} GPUs ({what}) but --gpus-per-trial {self.gpus_per_trial} gives each trial "
                    f"{self.gpus_per_trial}; raise --gpus-per-trial or use --gpus-per-trial auto")
        size = self.size_for(trial)
        if size > len(self.gpu_ids):
            return (f"needs {size} GPUs ({what}) but the sweep has {len(self.gpu_ids)} "
                    f"({','.join(self.gpu_ids)})")
        return None

    def unfit(self) -> list[tuple[Trial, str]]:
        """Trials that can never run here, with why (never started)."""
        return list(self._unfit)

    @property
    def free(self) -> list[str]:
        return list(self._free)

    @property
    def done(self) -> bool:
        return not self.pending and not self.running

    @property
    def max_parallel(self) -> int:
        """How many trials can run at once at most (the smallest sets packed)."""
        sizes = [self.size_for(t) for t in self.pending] or [1]
        return max(1, len(self.gpu_ids) // min(sizes))

    def start(self) -> list[Assignment]:
        """Hand GPUs to every waiting trial that fits now, in plan order."""
        started = []
        for trial in list(self.pending):
            size = self.size_for(trial)
            if size > len(self._free):
                continue
            take, self._free = self._free[:size], self._free[size:]
            a = Assignment(trial, tuple(take))
            self.pending.remove(trial)
            self.running.append(a)
            started.append(a)
        return started

    def finish(self, assignment: Assignment) -> None:
        """The trial ended: its GPUs are free again (in the pool's own order)."""
        self.running.remove(assignment)
        back = set(self._free) | set(assignment.gpus)
        self._free = [g for g in self.gpu_ids if g in back]

    def drop_pending(self) -> list[Trial]:
        """Cancel: forget the trials not started yet; returns them."""
        out, self.pending = self.pending, []
        return out
