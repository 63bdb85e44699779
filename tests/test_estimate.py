"""Capacity estimate, model info and machine facts, checked against the real
H200 and CPU fixture logs (tests/fixtures/vllm-logs)."""

from __future__ import annotations

import json
import re
import struct

import pytest

from ernie_tui.demo_model import SHAPES, write_demo_model
from ernie_tui.engine_ctl.launch import machine as machine_mod
from ernie_tui.engine_ctl.launch.estimate import (
    compare_with_report,
    estimate_capacity,
    kv_bytes_per_token,
    kv_heads_per_rank,
    max_len_that_fits,
)
from ernie_tui.engine_ctl.launch.machine import GpuInfo, Machine, detect_machine, visible_gpus
from ernie_tui.engine_ctl.launch.modelinfo import ModelInfoError, read_model_info
from ernie_tui.engine_ctl.logs.report import EngineReport
from ernie_tui.engine_ctl.units import GiB
from ernie_tui.presets import Preset, load_presets
from model_support import write_header_only_model

H200 = Machine(platform="cuda", gpus=(GpuInfo(0, "NVIDIA H200", int(139.8 * GiB), int(139.29 * GiB)),))


@pytest.fixture(scope="module")
def ernie03(tmp_path_factory):
    """ERNIE-4.5-0.3B shapes, header only (no tensor data)."""
    return read_model_info(write_header_only_model(tmp_path_factory.mktemp("e03")))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_demo_model(d, "tiny")
    return read_model_info(d)


def report_from_log(path) -> EngineReport:
    """What the log said. Uses the project's parser once it exists; until then
    the few figures the estimate is compared with, read straight from the log."""
    try:
        from ernie_tui.engine_ctl.logs.logparse import parse_file
    except ImportError:
        parse_file = None
    if parse_file is not None:
        return parse_file(path)
    text = path.read_text()
    r = EngineReport()
    if m := re.search(r"Model loading took ([\d.]+) GiB", text):
        r.weights_gib = float(m.group(1))
    if m := re.search(r"Available KV cache memory: (-?[\d.]+) GiB", text):
        r.kv_cache_gib = float(m.group(1))
    if m := re.search(r"KV cache size: ([\d,]+) tokens", text):
        r.kv_cache_tokens = int(m.group(1).replace(",", ""))
    if m := re.search(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", text):
        r.max_concurrency = float(m.group(1))
    return r


# -- model info --------------------------------------------------------------------------

def test_model_info_reads_shapes_and_header_only(ernie03):
    s = SHAPES["ernie-4.5-0.3b"]
    assert ernie03.architectures == ("Ernie4_5ForCausalLM",)
    assert (ernie03.num_layers, ernie03.num_attention_heads, ernie03.num_kv_heads, ernie03.head_dim) == (18, 16, 2, 128)
    assert ernie03.hidden_size == 1024 and ernie03.max_position_embeddings == 131072
    assert ernie03.derived_max_model_len == 131072
    assert ernie03.tie_word_embeddings and ernie03.config_dtype == "bfloat16"
    # The stand-in has no tensor data at all: only the header was read.
    assert ernie03.parameter_count == s.parameter_count() == 360_748_032
    assert ernie03.checkpoint_bytes == 2 * 360_748_032


def test_model_info_float32_checkpoint_serves_in_bf16(tmp_path):
    d = write_header_only_model(tmp_path / "m", "tiny")
    cfg = json.loads((d / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    (d / "config.json").write_text(json.dumps(cfg))
    info = read_model_info(d)
    assert info.serving_dtype == "bfloat16"  # vLLM: "Downcasting torch.float32 to torch.bfloat16"


def test_derived_len_takes_tokenizer_limit_and_rope_factor(tmp_path):
    d = write_header_only_model(tmp_path / "m", "tiny")
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    assert read_model_info(d).derived_max_model_len == 1024
    (d / "tokenizer_config.json").unlink()
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    cfg.pop("rope_parameters")
    (d / "config.json").write_text(json.dumps(cfg))
    assert read_model_info(d).derived_max_model_len == 8192
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}  # already scaled: not applied again
    (d / "config.json").write_text(json.dumps(cfg))
    assert read_model_info(d).derived_max_model_len == 4096


def test_model_info_errors_are_plain(tmp_path):
    with pytest.raises(ModelInfoError, match="no such model directory"):
        read_model_info(tmp_path / "missing")
    (tmp_path / "x").mkdir()
    with pytest.raises(ModelInfoError, match="no config.json"):
        read_model_info(tmp_path / "x")
    d = write_header_only_model(tmp_path / "bad", "tiny")
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 10**12))
    with pytest.raises(ModelInfoError, match="implausible"):
        read_model_info(d)


# -- KV bytes per token ---------------------------------------------------------------------

def test_kv_bytes_per_token(ernie03, tiny):
    assert kv_bytes_per_token(ernie03) == 18_432  # 2 x 18 x 2 x 128 x 2
    assert kv_bytes_per_token(ernie03, tp=2) == 9_216
    # 2 KV heads at TP 4: replicated, one head per rank, not half a head.
    assert kv_heads_per_rank(2, 4) == 1
    assert kv_bytes_per_token(ernie03, tp=4) == 9_216
    assert kv_bytes_per_token(ernie03, kv_dtype_bytes=1) == 9_216  # fp8 KV
    assert kv_bytes_per_token(tiny) == 512  # 2 x 2 x 2 x 32 x 2


# -- the H200 fixture figures ------------------------------------------------------------------

@pytest.mark.parametrize("log,util", [("ok_block16_len4096.log", None), ("ok_util0.16_block16_len4096.log", 0.16)])
def test_estimate_reproduces_h200_fixture(fixtures_dir, ernie03, log, util):
    report = report_from_log(fixtures_dir / "gpu-h200-vllm0.26.0" / log)
    preset = load_presets(include_user=False).get("seed-A")
    if util is not None:
        preset = preset.with_changes(gpu_memory_utilization=util)
    est = estimate_capacity(preset, ernie03, H200)
    assert report.kv_cache_tokens in (7_421_344, 1_234_512)
    err = abs(est.kv_cache_tokens - report.kv_cache_tokens) / report.kv_cache_tokens
    assert err < 0.10, (est.kv_cache_tokens, report.kv_cache_tokens)
    # In fact the model is much closer than the 10 % goal.
    assert err < 0.01
    assert est.kv_cache_tokens % 16 == 0  # whole blocks
    assert abs(est.weights_gib - report.weights_gib) < 0.02
    assert abs(est.kv_cache_gib - report.kv_cache_gib) / report.kv_cache_gib < 0.01
    assert abs(est.max_concurrency - report.max_concurrency) / report.max_concurrency < 0.01
    rows = {r.name: r for r in compare_with_report(est, report)}
    assert set(rows) >= {"kv_cache_tokens", "kv_cache_gib", "weights_gib", "max_concurrency"}
    assert abs(rows["kv_cache_tokens"].error_pct) < 1.0
    assert rows["kv_cache_tokens"].to_dict()["reported"] == report.kv_cache_tokens


def test_estimate_util_0005_has_no_room(fixtures_dir, ernie03):
    text = (fixtures_dir / "gpu-h200-vllm0.26.0" / "fail_no_cache_memory_util0.005.log").read_text()
    logged = float(re.search(r"Available KV cache memory: (-?[\d.]+) GiB", text).group(1))
    est = estimate_capacity(load_presets(include_user=False).get("seed-A")
                            .with_changes(gpu_memory_utilization=0.005), ernie03, H200)
    assert est.kv_cache_bytes < 0 and est.kv_cache_tokens == 0
    assert abs(est.kv_cache_gib - logged) < 0.1  # -0.52 GiB in the log


def test_max_model_len_does_not_change_pool(ernie03):
    a = estimate_capacity(Preset("a", {"block_size": 16, "max_model_len": 4096}), ernie03, H200)
    b = estimate_capacity(Preset("b", {"block_size": 16, "max_model_len": 8192}), ernie03, H200)
    assert a.kv_cache_tokens == b.kv_cache_tokens
    assert a.max_concurrency == pytest.approx(2 * b.max_concurrency)  # 1811.85x vs 905.93x in the logs


# -- CPU -------------------------------------------------------------------------------------

def test_cpu_explicit_kv_size(tiny):
    cpu = Machine(platform="cpu", cpu_total_bytes=10 * GiB, cpu_available_bytes=8 * GiB)
    est = estimate_capacity(load_presets(include_user=False).get("cpu-demo"), tiny, cpu)
    assert est.kv_cache_bytes == 64 << 20
    assert est.kv_cache_tokens == (64 << 20) // 512
    assert est.max_concurrency == est.kv_cache_tokens / 2048


def test_cpu_fixture_figures_follow_the_formula(fixtures_dir):
    """The CPU fixture's model stored 1024 B per token (64 MiB -> 65,536
    tokens); with it, 1 MiB gives vLLM's 'estimated maximum model length is
    992': 32 blocks of 32, one held back."""
    ok = (fixtures_dir / "cpu-vllm0.32.0" / "ok_block32_len2048.log").read_text()
    tokens = int(re.search(r"CPU KV cache size: ([\d,]+) tokens", ok).group(1).replace(",", ""))
    per_token = (64 << 20) // tokens
    assert per_token == 1024
    bad = (fixtures_dir / "cpu-vllm0.32.0" / "fail_kv_too_small.log").read_text()
    logged = int(re.search(r"estimated maximum model length is (\d+)", bad).group(1))
    assert max_len_that_fits(1 << 20, per_token, 32) == logged == 992


def test_cpu_kvcache_space_env(tiny):
    cpu = Machine(platform="cpu", cpu_total_bytes=10 * GiB, cpu_available_bytes=8 * GiB)
    p = Preset("p", {"block_size": 32, "max_model_len": 2048}, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    est = estimate_capacity(p, tiny, cpu)
    assert est.kv_cache_bytes == GiB and "VLLM_CPU_KVCACHE_SPACE" in est.source


def test_estimate_to_dict_keys(ernie03):
    d = estimate_capacity(Preset("a", {"max_model_len": 4096}), ernie03, H200).to_dict()
    assert set(d) == {"weights_gib", "kv_bytes_per_token", "kv_cache_gib", "kv_cache_tokens", "max_concurrency"}


# -- machine --------------------------------------------------------------------------------

GPUS = [GpuInfo(i, "H200", 100 * GiB, 90 * GiB, uuid=f"GPU-{i}abc{i}") for i in range(4)]


def test_cuda_visible_devices():
    assert [g.index for g in visible_gpus(GPUS, None)] == [0, 1, 2, 3]
    assert [g.index for g in visible_gpus(GPUS, "2,0")] == [2, 0]
    assert visible_gpus(GPUS, "") == [] and visible_gpus(GPUS, "-1") == []
    assert [g.index for g in visible_gpus(GPUS, "1,7,2")] == [1]  # CUDA stops at an invalid entry
    assert [g.index for g in visible_gpus(GPUS, "GPU-3abc")] == [3]


def test_detect_machine_with_fake_nvml(monkeypatch):
    monkeypatch.setattr(machine_mod, "_nvml_gpus", lambda: (list(GPUS), "nvml"))
    m = detect_machine(env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert m.platform == "cuda" and m.gpu_count == 2 and m.gpu_free_bytes == 90 * GiB
    m = detect_machine(env={"CUDA_VISIBLE_DEVICES": ""})
    assert m.platform == "cpu"  # no visible GPU: vLLM would not use CUDA
    m = detect_machine(gpus=8, gpu_memory_gib=80, env={})
    assert m.gpu_count == 8 and m.gpu_total_bytes == 80 * GiB


def test_detect_machine_without_nvml(monkeypatch):
    monkeypatch.setattr(machine_mod, "_nvml_gpus", lambda: (None, "NVML unavailable: no driver"))
    m = detect_machine(env={})
    assert m.platform == "cpu" and any("no driver" in n for n in m.notes)
    assert m.cpu_total_bytes and m.cpu_available_bytes
    m = detect_machine(platform="cuda", gpus=2, gpu_memory_gib=139.8, env={})
    assert m.platform == "cuda" and m.gpu_count == 2 and m.gpu_free_bytes == int(139.8 * GiB)
    with pytest.raises(ValueError):
        detect_machine(platform="tpu")


def test_real_detection_here():
    m = detect_machine()
    assert m.platform in ("cuda", "cpu")


def test_nvml_total_is_what_cuda_calls_total(monkeypatch):
    """Figures seen on a real H200 here: NVML total 150,754,820,096 B with
    644,939,776 reserved; torch.cuda.mem_get_info's total was exactly
    total - reserved = 150,109,880,320 B, vLLM's '139.8 GiB'."""
    import sys
    import types

    class Mem:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    fake = types.SimpleNamespace(
        nvmlMemory_v2=2,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetUUID=lambda h: "GPU-88798937",
        nvmlDeviceGetMemoryInfo=lambda h, version=None: (
            Mem(total=150_754_820_096, reserved=644_939_776, free=150_109_880_320, used=0) if version == 2
            else Mem(total=150_754_820_096, free=150_109_880_320, used=644_939_776)),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus, source = machine_mod._nvml_gpus()
    assert source == "nvml" and gpus[0].name == "NVIDIA H200"
    assert gpus[0].total_bytes == 150_109_880_320
    assert round(gpus[0].total_bytes / GiB, 1) == 139.8
