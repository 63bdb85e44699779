import textwrap

import pytest

from ernie_tui import paths
from ernie_tui.cli import main
from ernie_tui.presets import PresetError, load_presets, parse_size


def write(tmp_path, text, name="p.toml"):
    f = tmp_path / name
    f.write_text(textwrap.dedent(text))
    return f


def test_builtins_present_and_honest():
    book = load_presets()
    for name in ["seed-A", "seed-B", "seed-C", "long-doc", "tp2", "tp4", "cpu-demo"]:
        assert name in book
    assert book.get("seed-B").block_size == 8
    assert book.get("seed-B").get("gpu_memory_utilization") == 0.85
    assert "refuses" in book.get("seed-B").description
    assert book.get("tp2").tensor_parallel_size == 2
    assert book.get("tp2").max_model_len == 4096  # inherited from seed-A
    assert book.get("long-doc").get("enable_prefix_caching") is True
    demo = book.get("cpu-demo")
    assert demo.block_size % 32 == 0 and demo.kv_cache_memory_bytes == 64 * 2**20


def test_parse_size():
    assert parse_size("64M") == 67108864
    assert parse_size("1G") == 1 << 30
    assert parse_size("512KiB") == 512 * 1024
    assert parse_size(1234) == 1234
    with pytest.raises(PresetError):
        parse_size("lots")


def test_argv_is_exact_and_has_no_secret(tmp_path, monkeypatch):
    f = write(tmp_path, """
        [presets.mine]
        model = "/m/x"
        block_size = 32
        enable_prefix_caching = false
        kv_cache_memory_bytes = "1G"
        api_key_env = "MY_KEY"
        env = { OMP_NUM_THREADS = 2 }
        launcher = ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    """)
    monkeypatch.setenv("MY_KEY", "sekret")
    spec = load_presets([f]).get("mine").launch_spec()
    assert spec.argv == [
        "/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/m/x", "--served-model-name", "x", "--host", "127.0.0.1", "--port", "8000",
        "--block-size", "32", "--no-enable-prefix-caching", "--kv-cache-memory-bytes", str(1 << 30),
    ]
    assert "sekret" not in " ".join(spec.argv)
    assert spec.env == {"OMP_NUM_THREADS": "2", "VLLM_API_KEY": "sekret"}
    assert spec.display_env()["VLLM_API_KEY"] == "***"


def test_user_file_overrides_builtin(monkeypatch):
    paths.user_presets_file().parent.mkdir(parents=True, exist_ok=True)
    paths.user_presets_file().write_text('[presets.seed-A]\nblock_size = 32\nmax_model_len = 1024\n')
    book = load_presets()
    assert book.get("seed-A").block_size == 32
    assert book.get("seed-A").source == str(paths.user_presets_file())


@pytest.mark.parametrize("text, needle", [
    ("[presets.a]\nblock_size = \n", "p.toml:2: TOML syntax error"),
    ("[presets.a]\nblock_size = \"big\"\n", "block_size must be int"),
    ("[presets.a]\nport = 99999\n", "port must be"),
    ("[presets.a]\ngpu_memory_utilization = 1.5\n", "gpu_memory_utilization must be in"),
    ("[presets.a]\nextends = \"b\"\n[presets.b]\nextends = \"a\"\n", "`extends` cycle"),
    ("[presets.a]\nextends = \"nope\"\n", "extends unknown preset 'nope'"),
    ("[presets.a]\nenable_prefix_caching = 1\n", "enable_prefix_caching must be bool"),
])
def test_bad_input_is_a_clear_error(tmp_path, text, needle):
    f = write(tmp_path, text)
    with pytest.raises(PresetError) as e:
        load_presets([f])
    assert needle in str(e.value)


def test_unknown_preset_lists_known():
    with pytest.raises(PresetError, match="unknown preset 'zzz'.*seed-A"):
        load_presets().get("zzz")


def test_cli_errors_exit_1_without_traceback(tmp_path, capsys):
    f = write(tmp_path, "[presets.a\n")
    assert main(["presets", "list", "--presets", str(f)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ernie-tui: error:") and "Traceback" not in err and "p.toml:1" in err
    assert main(["presets", "show", "nope"]) == 1


def test_cli_show_command(capsys):
    assert main(["presets", "show", "seed-C", "--command", "--model", "/models/ernie"]) == 0
    out = capsys.readouterr().out
    assert "--model /models/ernie" in out and "--block-size 32 --max-model-len 4096" in out


def test_no_model_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("ERNIE_TUI_MODEL", raising=False)
    with pytest.raises(PresetError, match="names no model"):
        load_presets().get("seed-A").launch_spec()
