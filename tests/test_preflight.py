"""Preflight: one case per error kind, the warnings, speed, the arg list cache,
and `ernie-tui check`."""

from __future__ import annotations

import json
import socket

import pytest

from ernie_tui.cli import main
from ernie_tui.demo_model import write_demo_model
from ernie_tui.engine_ctl.launch import preflight as pf
from ernie_tui.engine_ctl.launch.machine import GpuInfo, Machine
from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.engine_ctl.launch.preflight import preflight
from ernie_tui.engine_ctl.logs.errors import ErrorKind
from ernie_tui.engine_ctl.units import GiB
from ernie_tui.presets import Preset, load_presets
from model_support import write_header_only_model


def h200(n: int = 1, free_gib: float = 139.29) -> Machine:
    return Machine(platform="cuda", gpus=tuple(GpuInfo(i, "NVIDIA H200", int(139.8 * GiB), int(free_gib * GiB))
                                               for i in range(n)))


CPU = Machine(platform="cpu", cpu_total_bytes=int(10.59 * GiB), cpu_available_bytes=int(9.28 * GiB))


@pytest.fixture(scope="module")
def e03(tmp_path_factory):
    return str(write_header_only_model(tmp_path_factory.mktemp("e03")))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_demo_model(d, "tiny")
    return str(d)


@pytest.fixture(scope="module")
def book():
    return load_presets(include_user=False)




def run(preset, model, machine, **kw):
    # A free port, so the port check does not depend on what else runs here.
    from dataclasses import replace

    if "port" not in kw.pop("keep", ()):
        preset = replace(preset, port=free_port())
    return preflight(preset, model, machine, **kw)


def kinds(result, severity="error"):
    return [p.kind for p in result.problems if p.severity == severity]


def only(result, kind):
    found = [p for p in result.problems if p.kind == kind]
    assert found, f"no {kind} in {[p.to_dict() for p in result.problems]}"
    return found[0]


# -- the good presets pass ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["seed-A", "seed-C", "long-doc"])
def test_good_cuda_presets_pass(book, e03, name):
    r = run(book.get(name), e03, h200())
    assert r.ok, [p.to_dict() for p in r.problems]
    assert r.estimate.kv_cache_tokens > 7_000_000


@pytest.mark.parametrize("name", ["cpu-demo", "cpu-demo-b64"])
def test_good_cpu_presets_pass(book, tiny, name):
    r = run(book.get(name), tiny, CPU)
    assert r.ok and not r.problems, [p.to_dict() for p in r.problems]


# -- one case per kind -----------------------------------------------------------------------

def test_max_model_len_too_large(book, e03):
    r = run(book.get("seed-A").with_changes(max_model_len=262144), e03, h200())
    p = only(r, ErrorKind.MAX_MODEL_LEN_TOO_LARGE)
    assert p.severity == "error" and p.fix == {"max_model_len": 131072}
    assert "131072" in p.message and "max_position_embeddings" in p.message
    # vLLM's escape hatch turns it into a warning
    r = run(book.get("seed-A").with_changes(max_model_len=262144), e03, h200(),
            env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert only(r, ErrorKind.MAX_MODEL_LEN_TOO_LARGE).severity == "warning"


def test_heads_not_divisible(book, e03):
    r = run(book.get("seed-A").with_changes(tensor_parallel_size=3), e03, h200(4))
    p = only(r, ErrorKind.HEADS_NOT_DIVISIBLE)
    assert p.severity == "error" and p.fix == {"tensor_parallel_size": 2}
    assert "16 attention heads" in p.message


def test_kv_head_replication_is_noted(book, e03):
    r = run(book.get("tp4"), e03, h200(4))
    assert r.ok
    p = only(r, ErrorKind.HEADS_NOT_DIVISIBLE)
    assert p.severity == "warning" and "replicated on 2 ranks" in p.message
    assert r.estimate.kv_bytes_per_token == 9_216 and r.estimate.kv_heads_replicated


def test_tp_exceeds_gpus(book, e03):
    r = run(book.get("tp2"), e03, h200(1))
    p = only(r, ErrorKind.TP_EXCEEDS_GPUS)
    assert p.fix == {"tensor_parallel_size": 1} and "World size (2)" in p.message
    r = run(book.get("tp4"), e03, h200(2))
    assert only(r, ErrorKind.TP_EXCEEDS_GPUS).fix == {"tensor_parallel_size": 2}


def test_tp_exceeds_visible_gpus_via_preset_env(book, e03, monkeypatch):
    from ernie_tui.engine_ctl.launch import machine as machine_mod

    monkeypatch.setattr(machine_mod, "_nvml_gpus",
                        lambda: ([GpuInfo(i, "H200", 140 * GiB, 139 * GiB) for i in range(2)], "nvml"))
    preset = book.get("tp2")
    from dataclasses import replace

    hidden = replace(preset, env={"CUDA_VISIBLE_DEVICES": "1"}, port=free_port())
    r = preflight(hidden, e03, None, env={})  # machine detected with the preset's env
    assert r.machine.gpu_count == 1
    assert only(r, ErrorKind.TP_EXCEEDS_GPUS).fix == {"tensor_parallel_size": 1}
    r = preflight(replace(preset, port=free_port()), e03, None, env={})
    assert ErrorKind.TP_EXCEEDS_GPUS not in kinds(r)


def test_block_size_unsupported(book, e03, tiny):
    r = run(book.get("seed-B"), e03, h200())  # block 8 on an H200
    p = only(r, ErrorKind.BLOCK_SIZE_UNSUPPORTED)
    assert p.fix == {"block_size": 16} and "multiple of 16" in p.message
    r = run(book.get("cpu-demo").with_changes(block_size=16), tiny, CPU)
    p = only(r, ErrorKind.BLOCK_SIZE_UNSUPPORTED)
    assert p.fix == {"block_size": 32} and "MultipleOf(32)" in p.message
    assert run(book.get("seed-A"), e03, h200()).ok  # 16 is fine on CUDA


def test_unknown_argument_paged_attention_myth(book, e03):
    r = run(book.get("seed-A").with_changes(enable_paged_attn=True), e03, h200())
    p = only(r, ErrorKind.UNKNOWN_ARGUMENT)
    assert p.fix == {"enable_paged_attn": None}
    assert "PagedAttention is always on" in p.message


def test_unknown_argument_from_vllm_arg_list(book, e03):
    r = run(book.get("seed-A").with_changes(swap_space=4), e03, h200())  # gone in vLLM 0.32
    assert only(r, ErrorKind.UNKNOWN_ARGUMENT).fix == {"swap_space": None}
    r = run(book.get("seed-A").with_changes(max_num_seqz=8), e03, h200())
    assert "did you mean --max-num-seqs" in only(r, ErrorKind.UNKNOWN_ARGUMENT).message
    r = run(book.get("seed-A").with_changes(disable_log_stats=False), e03, h200())
    assert "no --no-disable-log-stats" in only(r, ErrorKind.UNKNOWN_ARGUMENT).message
    r = run(book.get("seed-A").with_changes(dtype="bf16"), e03, h200())
    assert "choices" in only(r, ErrorKind.UNKNOWN_ARGUMENT).message
    # real arguments, both boolean forms
    r = run(book.get("seed-A").with_changes(enable_prefix_caching=False, enforce_eager=True, max_num_seqs=64),
            e03, h200())
    assert r.ok, [p.to_dict() for p in r.problems]


def test_no_cache_memory(book, e03):
    r = run(book.get("seed-A").with_changes(gpu_memory_utilization=0.005), e03, h200())
    p = only(r, ErrorKind.NO_CACHE_MEMORY)
    assert p.severity == "error" and p.fix["gpu_memory_utilization"] > 0.005
    assert r.estimate.kv_cache_gib == pytest.approx(-0.52, abs=0.1)  # the fixture log's figure
    fixed = book.get("seed-A").with_changes(**p.fix)
    assert run(fixed, e03, h200()).ok


def test_kv_cache_too_small_cpu(book, tiny):
    # The tiny model (512 B/token): 1 MiB = 2048 tokens = 64 blocks of 32; one
    # request of 4096 needs 128 (+1). vLLM's estimate: (64 - 1) x 32 = 2016.
    r = run(book.get("cpu-demo").with_changes(kv_cache_memory_bytes="1M", max_model_len=4096), tiny, CPU)
    p = only(r, ErrorKind.KV_CACHE_TOO_SMALL)
    assert p.fix == {"max_model_len": 2016} and "2016" in p.message
    assert "kv_cache_memory_bytes to 3M" in p.message
    assert run(book.get("cpu-demo").with_changes(kv_cache_memory_bytes="1M", max_model_len=2016), tiny, CPU).ok
    assert not run(book.get("cpu-demo").with_changes(kv_cache_memory_bytes="1M", max_model_len=2017),
                   tiny, CPU).ok


def test_kv_cache_too_small_cuda_default_len(e03):
    # No max_model_len: vLLM uses 131072, and util 0.01 leaves ~0.2 GiB of KV.
    r = run(Preset("p", {"gpu_memory_utilization": 0.01}), e03, h200())
    p = only(r, ErrorKind.KV_CACHE_TOO_SMALL)
    assert "131072" in p.message and "not 2048" in p.message
    fit = p.fix["max_model_len"]
    assert 0 < fit < 131072 and fit % 16 == 0


def test_insufficient_free_memory_cpu(book, tiny):
    # The fixture case: block 16, no KV size, node 9.28/10.59 GiB free < 0.92.
    r = run(book.get("cpu-demo").with_changes(kv_cache_memory_bytes=None), tiny, CPU)
    p = only(r, ErrorKind.INSUFFICIENT_FREE_MEMORY)
    assert "9.28 GiB" in p.message and "0.92" in p.message
    assert p.fix == {"kv_cache_memory_bytes": "64M"}
    r = run(book.get("cpu-demo").with_changes(kv_cache_memory_bytes="20G"), tiny, CPU)
    assert only(r, ErrorKind.INSUFFICIENT_FREE_MEMORY).fix["kv_cache_memory_bytes"] == "64M"


def test_insufficient_free_memory_cuda(book, e03):
    r = run(book.get("seed-A"), e03, h200(free_gib=60.0))  # someone holds 80 GiB
    p = only(r, ErrorKind.INSUFFICIENT_FREE_MEMORY)
    assert p.fix == {"gpu_memory_utilization": 0.41}
    assert run(book.get("seed-A").with_changes(**p.fix), e03, h200(free_gib=60.0)).ok


def test_port_in_use(book, e03):
    from dataclasses import replace

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = preflight(replace(book.get("seed-A"), port=port), e03, h200())
        p = only(r, ErrorKind.PORT_IN_USE)
        assert p.fix["port"] > port and str(port) in p.message
        assert pf.port_is_free("127.0.0.1", p.fix["port"])[0]


# -- warnings -------------------------------------------------------------------------------

def test_public_host_without_key_warns(book, e03, monkeypatch):
    from dataclasses import replace

    r = run(replace(book.get("seed-A"), host="0.0.0.0"), e03, h200())
    assert r.ok
    p = only(r, ErrorKind.OTHER)
    assert p.severity == "warning" and "no API key" in p.message and p.fix == {"host": "127.0.0.1"}
    monkeypatch.setenv("MY_KEY", "secret")
    r = run(replace(book.get("seed-A"), host="0.0.0.0", api_key_env="MY_KEY"), e03, h200())
    assert not r.problems


def _lan_address() -> tuple[str, str] | None:
    """A non-loopback address of this machine and its interface, if it has one."""
    import ipaddress

    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                ip = ipaddress.ip_address(a.address.split("%")[0])
                if not ip.is_loopback and not ip.is_link_local:
                    return a.address, name
    return None


@pytest.mark.parametrize("host", ["0", "::0", "0:0:0:0:0:0:0:0", "0.0.0.0", "::", "[::]", "", "0.0", "::ffff:0.0.0.0"])
def test_every_interface_however_it_is_spelled_warns(book, e03, host):
    """Exposure is what the address binds, not how it is spelled."""
    from dataclasses import replace

    assert pf.bind_exposure(host).scope == "all"
    p = only(run(replace(book.get("seed-A"), host=host), e03, h200()), ErrorKind.OTHER)
    assert "every interface" in p.message and "no API key" in p.message and p.fix == {"host": "127.0.0.1"}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2", "127.1", "::ffff:127.0.0.1"])
def test_loopback_however_it_is_spelled_is_quiet(book, e03, host):
    from dataclasses import replace

    assert pf.bind_exposure(host).scope == "loopback"
    assert not run(replace(book.get("seed-A"), host=host), e03, h200()).problems


def test_this_machines_own_network_address_warns(book, e03):
    from dataclasses import replace

    lan = _lan_address()
    if lan is None:
        pytest.skip("this machine has no non-loopback address")
    address, interface = lan
    exposure = pf.bind_exposure(address)
    assert exposure.scope == "interface" and exposure.interfaces == (interface,)
    p = only(run(replace(book.get("seed-A"), host=address), e03, h200()), ErrorKind.OTHER)
    assert interface in p.message and "no API key" in p.message
    assert pf.bind_exposure("192.0.2.254" if address != "192.0.2.254" else "198.51.100.7").scope == "none"


def test_article_myths_warn(book, e03):
    r = run(book.get("seed-B").with_changes(block_size=16, trust_remote_code=True), e03, h200())
    assert r.ok
    text = " | ".join(p.message for p in r.warnings)
    assert "does not 'prevent OOM'" in text  # utilization 0.85
    assert "trust_remote_code is not needed" in text
    assert "frees no memory" in text  # max_model_len 2048


# -- timings and the vLLM argument list -------------------------------------------------------

def test_each_check_records_how_long_it_took(book, e03):
    # How fast preflight is, is measured by bench/preflight_vs_vllm.py (a few
    # ms a check here): a busy box stretches any wall time a test could assert.
    pf.vllm_args()  # warm the per-version list once, as the TUI does
    for name in ("seed-A", "seed-B", "tp4"):
        r = run(book.get(name), e03, None)
        print(name, {k: f"{v * 1000:.1f} ms" for k, v in r.timings.items()})
        assert {"machine", "model"} <= set(r.timings), r.timings
        assert all(v >= 0 for v in r.timings.values()), r.timings


def test_vllm_args_shipped_for_same_version():
    args = pf.vllm_args()
    assert args.version == "0.32.0" and args.source in ("shipped", "cache")
    assert args.has("--block-size") and args.has("--no-enable-prefix-caching")
    assert not args.has("--enable-paged-attn")


def test_vllm_args_shipped_per_version(monkeypatch):
    """vLLM 0.26.0 (the H200's) has its own shipped list, so the dashboard's
    preflight (which never dumps) judges 0.26 flags by 0.26's parser; an
    unknown version falls back to the newest list and says so."""
    assert pf.shipped_args_versions()[:2] == ["0.26.0", "0.32.0"]
    monkeypatch.setattr(pf, "installed_vllm_version", lambda python: "0.26.0")
    pf._MEMO.clear()
    a = pf.vllm_args("/gpu/python", allow_dump=False)
    assert a.version == "0.26.0" and a.source == "shipped"
    assert a.has("--max-num-partial-prefills") and not a.has("--device-memory-utilization")
    assert a.has("--block-size") and not a.has("--enable-paged-attn")
    monkeypatch.setattr(pf, "installed_vllm_version", lambda python: "0.99.1")
    pf._MEMO.clear()
    b = pf.vllm_args("/other/python", allow_dump=False)
    assert b.version == "0.32.0" and b.source.startswith("shipped (for vLLM 0.32.0; installed 0.99.1")
    pf._MEMO.clear()


def test_vllm_args_cache_per_version(monkeypatch, tmp_path):
    monkeypatch.setattr(pf, "installed_vllm_version", lambda python: "9.9.9")
    pf._MEMO.clear()
    calls = []

    def fake_dump(python, timeout=180):
        calls.append(python)
        return {"vllm_version": "9.9.9", "options": ["--block-size", "--new-flag"], "choices": {}}

    monkeypatch.setattr(pf, "dump_vllm_args", fake_dump)
    a = pf.vllm_args("/fake/python")
    assert a.source == "dump" and a.has("--new-flag") and calls == ["/fake/python"]
    assert pf.args_cache_file("9.9.9", "/fake/python").is_file()
    pf._MEMO.clear()
    b = pf.vllm_args("/fake/python")
    assert b.source == "cache" and calls == ["/fake/python"]  # not dumped again
    pf._MEMO.clear()


def test_vllm_args_fallback_when_not_importable(monkeypatch, book, e03):
    monkeypatch.setattr(pf, "installed_vllm_version", lambda python: None)
    pf._MEMO.clear()
    a = pf.vllm_args("/no/vllm/python")
    assert a.source.startswith("shipped (") and a.has("--max-model-len")
    # Launching here would die with "No module named 'vllm'": an error...
    r = run(book.get("seed-A"), e03, h200())
    p = only(r, ErrorKind.MISSING_MODULE)
    assert p.severity == "error" and "not importable" in p.message and "shipped" in p.message
    # ...but only a note when judging a machine described by flags.
    from dataclasses import replace as dc_replace

    from ernie_tui.engine_ctl.launch.diagnose import diagnose

    d = diagnose(p, book.get("seed-A"), "cuda")
    assert d.fix_changes is None and "pip install vllm" in d.fix_summary
    r = run(book.get("seed-A"), e03, dc_replace(h200(), source="override"))
    assert r.ok and only(r, ErrorKind.MISSING_MODULE).severity == "warning"
    pf._MEMO.clear()


def test_launcher_python(book, tmp_path):
    from dataclasses import replace

    script = tmp_path / "vllm"
    script.write_text("#!/opt/venv/bin/python3.12\nprint()\n")
    preset = replace(book.get("seed-A"), launcher=[str(script), "serve"])
    assert pf.launcher_python(preset) == "/opt/venv/bin/python3.12"
    assert pf.launcher_python(replace(book.get("seed-A"), launcher=["/x/bin/python", "-m", "vllm"])) == "/x/bin/python"


def test_valid_tp_sizes(e03):
    from ernie_tui.engine_ctl.launch.modelinfo import read_model_info

    info = read_model_info(e03)
    assert pf.valid_tp_sizes(info) == [1, 2, 4, 8, 16]


# -- ernie-tui check ------------------------------------------------------------------------

def test_check_cli_json(e03, capsys):
    rc = main(["check", "seed-B", "--model", e03, "--json", "--platform", "cuda", "--gpus", "1",
               "--gpu-memory-gib", "139.8", "--no-port"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["ok"] is False
    assert {"kind", "severity", "message", "fix"} <= set(out["problems"][0])
    errors = [p for p in out["problems"] if p["severity"] == "error"]
    assert [p["kind"] for p in errors] == ["block_size_unsupported"]
    assert errors[0]["fix"] == {"block_size": 16}
    assert set(out["estimate"]) == {"weights_gib", "kv_bytes_per_token", "kv_cache_gib", "kv_cache_tokens",
                                    "max_concurrency"}
    assert out["estimate"]["kv_bytes_per_token"] == 18432


def test_check_cli_ok_and_text(e03, capsys):
    rc = main(["check", "seed-A", "--model", e03, "--platform", "cuda", "--gpu-memory-gib", "139.8", "--no-port"])
    out = capsys.readouterr().out
    assert rc == 0 and "7,423,120 tokens" in out and out.strip().endswith("ok")


def test_check_cli_unknown_preset(capsys):
    assert main(["check", "nope"]) == 1
    assert "unknown preset" in capsys.readouterr().err


def test_utilization_near_one_counts_the_cuda_context(book, e03):
    # 0.999 x 139.8 = 139.66 GiB < 139.80 NVML-free, but vLLM sees 139.29 after its context.
    r = run(book.get("seed-A").with_changes(gpu_memory_utilization=0.999), e03, h200(free_gib=139.80))
    assert only(r, ErrorKind.INSUFFICIENT_FREE_MEMORY).fix == {"gpu_memory_utilization": 0.98}
    assert run(book.get("seed-A").with_changes(gpu_memory_utilization=0.98), e03, h200(free_gib=139.80)).ok
