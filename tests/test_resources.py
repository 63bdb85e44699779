"""Memory sampling: NVML when a driver is there, the engine's RSS otherwise."""

import os
import subprocess
import sys

from ernie_tui.engine_ctl.control.resources import ResourceSampler


def test_without_nvml_falls_back_to_rss_and_says_so():
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(50_000_000); print('held', flush=True)"
                              "; time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"  # its 50 MB are allocated (not: after a 0.5 s sleep)
        sampler = ResourceSampler(lambda: [child.pid], use_nvml=False)
        assert not sampler.nvml
        assert sampler.label.startswith("engine RSS (psutil;")
        s = sampler.sample()
        assert s.source == "rss"
        assert s.per_pid[child.pid] > 40_000_000
        assert s.shown_bytes == s.engine_bytes
    finally:
        child.kill()
        child.wait()


def test_nvml_absent_on_this_box_gives_a_reason():
    # CI has no NVIDIA driver: the sampler must not raise and must say why.
    sampler = ResourceSampler(lambda: [os.getpid()])
    if sampler.nvml:  # on a GPU box this is the real path
        s = sampler.sample()
        assert s.source == "nvml" and s.gpus and s.gpus[0].total_bytes > 0
    else:
        assert sampler.reason
        assert sampler.sample().source == "rss"
    sampler.close()


def test_visible_devices(monkeypatch):
    from ernie_tui.engine_ctl.control.resources import _visible_indices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert _visible_indices(4) == [1, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _visible_indices(4) == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _visible_indices(2) == [0, 1]


def test_engine_memory_is_the_bursts_memory_sampler():
    # One adapter for the probe pane and the sweep: it owns a sampler made
    # from pids, and leaves one it was handed to its owner.
    from ernie_tui.engine_ctl.control.resources import EngineMemory

    own = EngineMemory(lambda: [os.getpid()], use_nvml=False)
    assert own.source == "rss" and own() > 10_000_000
    own.close()
    shared = ResourceSampler(lambda: [os.getpid()], use_nvml=False)
    lent = EngineMemory(sampler=shared)
    assert lent.source == "rss" and lent.sampler is shared and lent() > 10_000_000
    lent.close()
    assert shared.sample().shown_bytes > 10_000_000  # still the owner's to close
