"""Preflight for data parallelism, headless nodes and the Ray executor: one
case per rule, each with its fix (and the fix passing), the built-in
multi-GPU presets, and their flags in both shipped vLLM argument lists."""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import replace

import pytest

from ernie_tui.engine_ctl.launch import preflight as pf
from ernie_tui.engine_ctl.launch.machine import GpuInfo, Machine
from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.engine_ctl.launch.preflight import preflight
from ernie_tui.engine_ctl.launch.preflight_parallel import module_available
from ernie_tui.engine_ctl.logs.report import ErrorKind
from ernie_tui.engine_ctl.units import GiB
from ernie_tui.presets import Preset, load_presets
from model_support import write_header_only_model


def h200(n: int) -> Machine:
    return Machine(platform="cuda", gpus=tuple(GpuInfo(i, "NVIDIA H200", int(139.8 * GiB), int(139.29 * GiB))
                                               for i in range(n)))


@pytest.fixture(scope="module")
def e03(tmp_path_factory):
    return str(write_header_only_model(tmp_path_factory.mktemp("e03")))


@pytest.fixture(scope="module")
def book():
    return load_presets(include_user=False)


def run(preset: Preset, model: str, machine: Machine, **changes) -> pf.PreflightResult:
    preset = replace(preset.with_changes(**changes), port=free_port())
    return preflight(preset, model, machine)


def problems(result, severity="error"):
    return [p for p in result.problems if p.severity == severity]


def find(result, words: str, severity="error"):
    hits = [p for p in result.problems if words in p.message and p.severity == severity]
    assert hits, f"no {severity} with {words!r} in {[p.to_dict() for p in result.problems]}"
    return hits[0]


def fixed(preset: Preset, problem) -> Preset:
    return preset.with_changes(**problem.fix)


# -- sizes against the GPUs -------------------------------------------------------------

def test_dp2_fits_two_gpus_and_not_one(book, e03):
    dp2 = book.get("dp2")
    assert not problems(run(dp2, e03, h200(2)))
    r = run(dp2, e03, h200(1))
    p = find(r, "needs 2 GPUs but 1 is visible")
    assert p.kind == ErrorKind.TP_EXCEEDS_GPUS and p.fix == {"data_parallel_size": 1}
    assert "tensor_parallel_size 1 x data_parallel_size 2" in p.message
    assert not problems(run(fixed(dp2, p), e03, h200(1)))


def test_tp_times_dp_local_against_gpus(book, e03):
    base = book.get("seed-A").with_changes(tensor_parallel_size=2, data_parallel_size=4, data_parallel_size_local=2,
                                           data_parallel_address="127.0.0.1", data_parallel_rpc_port=free_port())
    assert not problems(run(base, e03, h200(4)))
    r = run(base, e03, h200(2))
    p = find(r, "needs 4 GPUs on this node but 2 are visible")
    assert "tensor_parallel_size 2 x data_parallel_size_local 2" in p.message
    assert p.fix == {"data_parallel_size_local": 1}
    # One engine too big already: the TP check says it once, not twice.
    r = run(base.with_changes(tensor_parallel_size=4), e03, h200(2))
    assert [p.kind for p in problems(r)] == [ErrorKind.TP_EXCEEDS_GPUS]


def test_dp_local_above_dp(book, e03):
    preset = book.get("seed-A").with_changes(data_parallel_size=2, data_parallel_size_local=4)
    r = run(preset, e03, h200(8))
    p = find(r, "data_parallel_size_local 4 is more than data_parallel_size 2")
    assert "must be <= data_parallel_size (2)" in p.message and p.fix == {"data_parallel_size_local": 2}
    assert not problems(run(fixed(preset, p), e03, h200(8)))


# -- headless nodes ---------------------------------------------------------------------

def worker(book, **changes) -> Preset:
    return book.get("dp-worker").with_changes(**changes)


def test_headless_needs_the_head_address(book, e03):
    r = run(worker(book, data_parallel_address=None), e03, h200(2))
    p = find(r, "no data_parallel_address says where the head is")
    assert p.fix is None


def test_headless_needs_vllm_serve(book, e03):
    module_launched = replace(worker(book, data_parallel_address="127.0.0.1"), launcher=None)
    p = find(run(module_launched, e03, h200(2)), "only `vllm serve` runs headless")
    assert "vllm.entrypoints.openai.api_server" in p.message
    assert not [p for p in problems(run(worker(book, data_parallel_address="127.0.0.1"), e03, h200(2)))
                if "vllm serve" in p.message]


def test_more_api_servers_need_vllm_serve(book, e03):
    seed = book.get("seed-A")
    p = find(run(seed, e03, h200(1), api_server_count=4), "only `vllm serve` runs 4", severity="warning")
    assert "vllm.entrypoints.openai.api_server" in p.message and "launcher = [" in p.message
    served = replace(seed, launcher=["vllm", "serve"])
    for ok in (run(served, e03, h200(1), api_server_count=4), run(seed, e03, h200(1), api_server_count=1),
               run(seed, e03, h200(1))):
        assert not [x for x in ok.problems if "api_server_count" in x.message]


def test_headless_needs_a_start_rank_past_the_heads(book, e03):
    preset = worker(book, data_parallel_address="127.0.0.1", data_parallel_start_rank=None)
    p = find(run(preset, e03, h200(2)), "no data_parallel_start_rank")
    assert p.fix == {"data_parallel_start_rank": 2}
    assert not [x for x in problems(run(fixed(preset, p), e03, h200(2))) if "start_rank" in x.message]


def test_headless_address_must_resolve(book, e03):
    p = find(run(worker(book, data_parallel_address="no-such-head.invalid"), e03, h200(2)), "does not resolve")
    assert "head node's IP" in p.message


def test_headless_warns_when_the_head_does_not_answer_and_is_quiet_when_it_does(book, e03):
    port = free_port()
    r = run(worker(book, data_parallel_address="127.0.0.1", data_parallel_rpc_port=port), e03, h200(2))
    w = find(r, f"nothing answers at the head's 127.0.0.1:{port}", severity="warning")
    assert "Start the head first" in w.message
    assert not problems(r)
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        port = head.getsockname()[1]
        r = run(worker(book, data_parallel_address="127.0.0.1", data_parallel_rpc_port=port), e03, h200(2))
    assert not [x for x in r.problems if "nothing answers" in x.message]


# -- the head of a multi-node DP server ------------------------------------------------------

def test_head_address_must_be_this_machines(book, e03):
    r = run(book.get("dp-head").with_changes(data_parallel_address="192.0.2.1"), e03, h200(2))  # TEST-NET-1
    p = find(r, "192.0.2.1 is not an address of this machine")
    assert "binds its RPC port (13345)" in p.message


def test_head_with_remote_engines_needs_an_address(book, e03):
    r = run(book.get("dp-head").with_changes(data_parallel_address=None), e03, h200(2))
    p = find(r, "reach this head at data_parallel_address, which is unset")
    assert "data_parallel_size_local 2 of 4" in p.message


def test_head_on_loopback_warns(book, e03):
    r = run(book.get("dp-head").with_changes(data_parallel_address="127.0.0.1", data_parallel_rpc_port=free_port()),
            e03, h200(2))
    assert not problems(r)
    find(r, "is loopback: engines on other nodes cannot reach", severity="warning")


def test_head_rpc_port_in_use(book, e03):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        head = book.get("dp-head").with_changes(data_parallel_address="127.0.0.1", data_parallel_rpc_port=port)
        r = run(head, e03, h200(2))
        p = find(r, f"data_parallel_rpc_port {port} on 127.0.0.1 is in use")
        assert p.kind == ErrorKind.PORT_IN_USE and p.fix["data_parallel_rpc_port"] > port
        assert not problems(run(fixed(head, p), e03, h200(2)))


def test_single_node_dp_never_touches_the_rpc_port(book, e03):
    # All engines here: vLLM talks to them over local IPC, the RPC port is unused.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        preset = book.get("dp2").with_changes(data_parallel_address="127.0.0.1",
                                              data_parallel_rpc_port=taken.getsockname()[1])
        assert not problems(run(preset, e03, h200(2)))


# -- Ray -----------------------------------------------------------------------------

def test_ray_backend_needs_ray_in_the_launchers_python(book, e03, tmp_path, monkeypatch):
    # A launcher Python with no Ray: a bare venv (the test venv has Ray, for `tune --ray`).
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    bare_python = str(bare / "bin" / "python")
    assert module_available(bare_python, "ray") is False
    monkeypatch.setenv("ERNIE_TUI_VLLM_PYTHON", bare_python)
    r = run(book.get("tp2-ray"), e03, h200(2))
    p = find(r, "needs Ray in the launcher's Python")
    assert p.kind == ErrorKind.MISSING_MODULE and p.fix == {"distributed_executor_backend": None}
    assert bare_python in p.message and "pip install ray" in p.message
    monkeypatch.delenv("ERNIE_TUI_VLLM_PYTHON")
    # Found without importing: an empty package named ray on the launch PYTHONPATH is enough.
    ray_before = "ray" in sys.modules  # another test on this xdist worker may have imported the real one
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise SystemExit('imported: the check must not import ray')\n")
    with_ray = replace(book.get("tp2-ray"), env={"PYTHONPATH": str(tmp_path)})
    assert not problems(run(with_ray, e03, h200(2)))
    assert ("ray" in sys.modules) == ray_before


def test_ray_world_beyond_this_node_is_a_warning(book, e03, tmp_path):
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("")
    tp4_ray = replace(book.get("tp2-ray").with_changes(tensor_parallel_size=4), env={"PYTHONPATH": str(tmp_path)})
    r = run(tp4_ray, e03, h200(2))
    assert not problems(r), [p.to_dict() for p in r.problems]
    find(r, "the Ray cluster's GPUs count", severity="warning")
    assert module_available("/no/such/python", "ray") is None


# -- the built-ins ------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["0.26.0", "0.32.0"])
@pytest.mark.parametrize("name", ["dp2", "tp2-ray", "dp-head", "dp-worker"])
def test_builtin_flags_exist_in_each_shipped_vllm(book, e03, name, version):
    data = pf._shipped_args(version)
    args = pf.VllmArgs(version=version, options=frozenset(data["options"]), choices=data["choices"], source="test")
    r = preflight(replace(book.get(name), port=free_port()), e03, h200(2), args=args)
    assert not [p for p in r.problems if p.kind == ErrorKind.UNKNOWN_ARGUMENT], [p.to_dict() for p in r.problems]
    assert book.get(name).description


def test_builtin_multi_gpu_presets_say_what_they_are(book):
    assert book.get("dp2").get("data_parallel_size") == 2
    assert book.get("tp2-ray").get("distributed_executor_backend") == "ray"
    assert book.get("tp2-ray").tensor_parallel_size == 2
    head, w = book.get("dp-head"), book.get("dp-worker")
    assert w.get("headless") is True and w.get("data_parallel_start_rank") == 2
    assert w.get("data_parallel_address") == head.get("data_parallel_address")
    assert w.launcher[-1] == "serve"
    assert "dp 2" in book.get("dp2").key_args()
