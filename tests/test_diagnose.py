"""Diagnosis and fix for every error kind: from the real fixture logs where
one exists, from vLLM's own message text otherwise, and from preflight."""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import replace

import pytest

from ernie_tui.demo_model import write_demo_model
from ernie_tui.engine_ctl.launch.diagnose import Diagnosis, apply_fix, diagnose
from ernie_tui.engine_ctl.launch.machine import GpuInfo, Machine
from ernie_tui.engine_ctl.launch.modelinfo import read_model_info
from ernie_tui.engine_ctl.launch.preflight import preflight
from ernie_tui.engine_ctl.logs.errors import ErrorKind
from ernie_tui.engine_ctl.logs.logparse import parse_file
from ernie_tui.engine_ctl.logs.report import EngineError
from ernie_tui.engine_ctl.units import GiB
from ernie_tui.presets import Preset, load_presets
from model_support import write_header_only_model

H200 = Machine(platform="cuda", gpus=(GpuInfo(0, "NVIDIA H200", int(139.8 * GiB), int(139.29 * GiB)),))

def error_from_log(path) -> EngineError | None:
    """The root cause of a failed start, read from a real vLLM log by the project's parser."""
    return parse_file(path).error


@pytest.fixture(scope="module")
def book():
    return load_presets(include_user=False)


@pytest.fixture(scope="module")
def e03(tmp_path_factory):
    return read_model_info(write_header_only_model(tmp_path_factory.mktemp("e03")))


# -- from the real fixture logs --------------------------------------------------------------

def test_block8_on_h200(fixtures_dir, book):
    err = error_from_log(fixtures_dir / "gpu-h200-vllm0.26.0" / "fail_block8_len2048.log")
    assert err.kind == ErrorKind.BLOCK_SIZE_UNSUPPORTED
    d = diagnose(err, book.get("seed-B"), "cuda")
    assert d.fix_changes == {"block_size": 16}
    assert "block_size=8" in d.explanation  # vLLM's own words are kept
    fixed = apply_fix(book.get("seed-B"), d)
    assert fixed.name == "seed-B-fixed" and fixed.block_size == 16
    assert fixed.max_model_len == 2048 and fixed.get("gpu_memory_utilization") == 0.85  # rest kept


def test_block16_on_cpu(fixtures_dir, book):
    err = error_from_log(fixtures_dir / "cpu-vllm0.32.0" / "fail_block16.log")
    assert err.kind == ErrorKind.BLOCK_SIZE_UNSUPPORTED
    d = diagnose(err, book.get("seed-A"), "cpu")
    assert d.fix_changes == {"block_size": 32}


def test_worker_sigill_on_cpu_reads_as_illegal_instruction_and_fixes_the_dtype(fixtures_dir, book):
    """A worker killed by SIGILL at the first request (vLLM CPU's AMX bf16
    attention in a VM that flags AMX and refuses it, seen on 2026-12-07): the
    root cause is the worker's death with exit code -4, not the EngineDeadError
    or the "cancelled" echoes after it, and the fix is a 16-bit dtype whose
    kernels are plain vector code."""
    r = parse_file(fixtures_dir / "cpu-vllm0.32.0" / "worker_sigill_amx_bf16.log")
    assert r.ready and r.state == "failed", r.state
    err = r.error
    assert err is not None and err.kind == ErrorKind.ILLEGAL_INSTRUCTION, err
    assert "exit code: -4" in err.message
    d = diagnose(err, book.get("cpu-demo"), "cpu")
    assert d.fix_changes == {"dtype": "float16"} and "SIGILL" in d.title
    assert apply_fix(book.get("cpu-demo"), d).get("dtype") == "float16"
    # Already float16: float32 next; already float32: no preset fixes it; on a GPU neither.
    assert diagnose(err, book.get("cpu-demo").with_changes(dtype="float16"), "cpu").fix_changes == {"dtype": "float32"}
    assert not diagnose(err, book.get("cpu-demo").with_changes(dtype="float32"), "cpu").fixable
    assert not diagnose(err, book.get("seed-A"), "cuda").fixable


def test_len_over_derived(fixtures_dir, book):
    err = error_from_log(fixtures_dir / "gpu-h200-vllm0.26.0" / "fail_len_over_derived.log")
    assert err.kind == ErrorKind.MAX_MODEL_LEN_TOO_LARGE
    preset = book.get("seed-A").with_changes(max_model_len=262144)
    d = diagnose(err, preset, "cuda")
    assert d.fix_changes == {"max_model_len": 131072}  # read from vLLM's message


def test_no_cache_memory(fixtures_dir, book, e03):
    err = error_from_log(fixtures_dir / "gpu-h200-vllm0.26.0" / "fail_no_cache_memory_util0.005.log")
    assert err.kind == ErrorKind.NO_CACHE_MEMORY
    preset = Preset("u", {"gpu_memory_utilization": 0.005})
    d = diagnose(err, preset, "cuda")
    assert d.fix_changes == {"gpu_memory_utilization": 0.92}
    # knowing the machine, the fix stays within what is free (139.29/139.8)
    d = diagnose(err, preset, machine=H200, model_info=e03)
    assert d.fix_changes == {"gpu_memory_utilization": 0.92}
    busy = Machine(platform="cuda", gpus=(GpuInfo(0, "H200", int(139.8 * GiB), int(50 * GiB)),))
    assert diagnose(err, preset, machine=busy).fix_changes == {"gpu_memory_utilization": 0.34}


def test_unknown_argument_paged_attn(fixtures_dir, book):
    err = error_from_log(fixtures_dir / "gpu-h200-vllm0.26.0" / "fail_unknown_arg_enable_paged_attn.log")
    assert err.kind == ErrorKind.UNKNOWN_ARGUMENT
    preset = book.get("seed-A").with_changes(enable_paged_attn=True)
    d = diagnose(err, preset, "cuda")
    assert d.fix_changes == {"enable_paged_attn": None}
    assert "PagedAttention is always on" in d.fix_summary
    fixed = apply_fix(preset, d)
    assert "enable_paged_attn" not in fixed.engine_args
    assert "--enable-paged-attn" not in fixed.launch_spec("/m").argv


def test_kv_too_small_uses_vllms_estimate(fixtures_dir, book):
    err = error_from_log(fixtures_dir / "cpu-vllm0.32.0" / "fail_kv_too_small.log")
    assert err.kind == ErrorKind.KV_CACHE_TOO_SMALL and err.estimated_max_model_len == 992
    preset = book.get("cpu-demo").with_changes(kv_cache_memory_bytes="1M", max_model_len=4096)
    d = diagnose(err, preset, "cpu")
    assert d.fix_changes == {"max_model_len": 992}
    assert "992" in d.fix_summary


def test_insufficient_free_memory_cpu(fixtures_dir, book, tmp_path):
    err = error_from_log(fixtures_dir / "cpu-vllm0.32.0" / "fail_insufficient_free_memory.log")
    assert err.kind == ErrorKind.INSUFFICIENT_FREE_MEMORY
    preset = book.get("seed-A")  # block 16, no KV size: the fixture's arguments
    d = diagnose(err, preset, "cpu")
    assert d.fix_changes == {"kv_cache_memory_bytes": "1G"}  # fits the 9.28 GiB the log says is free
    write_demo_model(tmp_path / "tiny", "tiny")
    cpu = Machine(platform="cpu", cpu_total_bytes=int(10.59 * GiB), cpu_available_bytes=int(9.28 * GiB))
    d = diagnose(err, preset, machine=cpu, model_info=read_model_info(tmp_path / "tiny"))
    assert d.fix_changes == {"kv_cache_memory_bytes": "64M"}


# -- kinds with no fixture log: vLLM's message text ---------------------------------------------

def test_tp_exceeds_gpus_message(book):
    err = EngineError(ErrorKind.TP_EXCEEDS_GPUS,
                      "ValueError: World size (4) is larger than the number of available GPUs (2) in this node.")
    d = diagnose(err, book.get("tp4"), "cuda")
    assert d.fix_changes == {"tensor_parallel_size": 2}
    assert diagnose(err, book.get("tp4"), machine=H200).fix_changes == {"tensor_parallel_size": 1}


def test_heads_not_divisible_message(book, e03):
    err = EngineError(ErrorKind.HEADS_NOT_DIVISIBLE,
                      "ValueError: Total number of attention heads (16) must be divisible by tensor parallel "
                      "size (3).")
    preset = book.get("seed-A").with_changes(tensor_parallel_size=3)
    assert diagnose(err, preset, "cuda").fix_changes == {"tensor_parallel_size": 2}
    assert diagnose(err, preset, "cuda", model_info=e03).fix_changes == {"tensor_parallel_size": 2}


def test_port_in_use_message(book):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        preset = replace(book.get("cpu-demo"), port=port)
        err = EngineError(ErrorKind.PORT_IN_USE, "OSError: [Errno 98] Address already in use")
        d = diagnose(err, preset, "cpu")
        assert d.fix_changes["port"] > port
        fixed = apply_fix(preset, d)
        assert fixed.port == d.fix_changes["port"] and "port" not in fixed.engine_args


def test_cuda_oom(book):
    err = EngineError(ErrorKind.CUDA_OOM, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    d = diagnose(err, book.get("seed-A").with_changes(max_num_seqs=256), "cuda")
    assert d.fix_changes == {"gpu_memory_utilization": 0.87, "max_num_seqs": 128}


def test_missing_module_from_a_real_python(tmp_path, book):
    """A launcher Python without vLLM: a real failure, made in a second."""
    candidates = [p for p in ("/usr/bin/python3", shutil.which("python3")) if p]
    python = next((p for p in candidates if subprocess.run([p, "-c", "import vllm"], capture_output=True)
                   .returncode != 0), None)
    if python is None:
        pytest.skip("every python here has vLLM")
    log = tmp_path / "llm.log"
    with open(log, "wb") as f:
        subprocess.run([python, "-m", "vllm.entrypoints.openai.api_server", "--model", "/nonexistent"],
                       stdout=f, stderr=subprocess.STDOUT, timeout=60)
    # A one-line failure with no vLLM prefix at all: "<python>: Error while finding module
    # specification for 'vllm.entrypoints.openai.api_server' (ModuleNotFoundError: No module named 'vllm')"
    err = error_from_log(log)
    assert err is not None and err.kind == ErrorKind.MISSING_MODULE and err.detail["module"] == "vllm"
    assert err.line_no == 1 and err.message.startswith(python)
    d = diagnose(err, replace(book.get("cpu-demo"), launcher=[python, "-m", "vllm.entrypoints.openai.api_server"]),
                 "cpu")
    assert d.fix_changes is None and "vllm" in d.fix_summary
    assert "`launcher`" in d.fix_summary and "ERNIE_TUI_VLLM_PYTHON" in d.fix_summary
    with pytest.raises(ValueError, match="no automatic fix"):
        apply_fix(book.get("cpu-demo"), d)


@pytest.mark.parametrize("kind", [ErrorKind.ENGINE_DEAD, ErrorKind.OTHER])
def test_no_fix_kinds(book, kind):
    d = diagnose(EngineError(kind, "RuntimeError: Engine core initialization failed."), book.get("seed-A"), "cuda")
    assert d.fix_changes is None and d.title and d.explanation


def test_every_kind_has_words(book):
    for kind in ErrorKind:
        d = diagnose(EngineError(kind, "x"), book.get("seed-A"), "cuda")
        assert isinstance(d, Diagnosis) and d.title and d.explanation and d.fix_summary


# -- from preflight ----------------------------------------------------------------------------

def test_preflight_problem_diagnosis_and_fixed_preset_passes(book, e03):
    preset = replace(book.get("seed-B"), port=0)
    r = preflight(replace(preset, port=18765), e03.path, H200)
    problem = r.first_error()
    assert problem.kind == ErrorKind.BLOCK_SIZE_UNSUPPORTED
    d = diagnose(problem, preset, machine=H200)
    assert d.fix_changes == problem.fix == {"block_size": 16}
    fixed = apply_fix(replace(preset, port=18765), d)
    assert fixed.name == "seed-B-fixed" and "block_size_unsupported" in fixed.description
    assert preflight(fixed, e03.path, H200).ok
    # fixing a fixed preset keeps its name
    again = apply_fix(fixed, diagnose(EngineError(ErrorKind.CUDA_OOM, "CUDA out of memory"), fixed, "cuda"))
    assert again.name == "seed-B-fixed"


def test_without_a_preset_replayed_log(fixtures_dir):
    """Replay mode may know no preset: the diagnosis still reads the log."""
    cases = [("fail_block8_len2048.log", ErrorKind.BLOCK_SIZE_UNSUPPORTED, {"block_size": 16}),
             ("fail_len_over_derived.log", ErrorKind.MAX_MODEL_LEN_TOO_LARGE, {"max_model_len": 131072})]
    for name, kind, fix in cases:
        err = error_from_log(fixtures_dir / "gpu-h200-vllm0.26.0" / name)
        d = diagnose(err, None, None)
        assert d.kind == kind and d.fix_changes == fix


def test_platform_guess_from_message(fixtures_dir):
    gpu = error_from_log(fixtures_dir / "gpu-h200-vllm0.26.0" / "fail_no_cache_memory_util0.005.log")
    low = Preset("low", {"gpu_memory_utilization": 0.005})
    assert diagnose(gpu, low).fix_changes == {"gpu_memory_utilization": 0.92}  # a GPU fix, not a CPU KV size
    cpu = error_from_log(fixtures_dir / "cpu-vllm0.32.0" / "fail_block16.log")
    assert diagnose(cpu, None).fix_changes == {"block_size": 32}
