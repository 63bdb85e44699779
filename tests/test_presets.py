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
        "--disable-access-log-for-endpoints", "/metrics,/health",
        "--block-size", "32", "--no-enable-prefix-caching", "--kv-cache-memory-bytes", str(1 << 30),
    ]
    assert "sekret" not in " ".join(spec.argv)
    assert spec.env == {"OMP_NUM_THREADS": "2", "VLLM_API_KEY": "sekret"}
    assert spec.display_env()["VLLM_API_KEY"] == "***"


def test_own_polling_left_out_of_the_access_log(tmp_path):
    """Our 1 s /metrics poll and /health checks never flood llm.log (#18, 1): by
    default a server we start leaves those two paths out of uvicorn's access log
    (a real client's requests are still logged); a preset can decide otherwise."""
    f = write(tmp_path, """
        [presets.plain]
        model = "/m/x"
        [presets.all-access]
        model = "/m/x"
        disable_access_log_for_endpoints = ""
        [presets.no-access]
        model = "/m/x"
        disable_uvicorn_access_log = true
    """)
    book = load_presets([f], include_user=False)
    argv = book.get("plain").launch_spec().argv
    i = argv.index("--disable-access-log-for-endpoints")
    assert argv[i + 1].split(",") == ["/metrics", "/health"]
    all_access = book.get("all-access").launch_spec().argv
    assert all_access[all_access.index("--disable-access-log-for-endpoints") + 1] == ""
    assert all_access.count("--disable-access-log-for-endpoints") == 1
    no_access = book.get("no-access").launch_spec().argv
    assert "--disable-uvicorn-access-log" in no_access and "--disable-access-log-for-endpoints" not in no_access


def test_user_file_overrides_builtin(monkeypatch):
    paths.user_presets_file().parent.mkdir(parents=True, exist_ok=True)
    paths.user_presets_file().write_text('[presets.seed-A]\nblock_size = 32\nmax_model_len = 1024\n')
    book = load_presets()
    assert book.get("seed-A").block_size == 32
    assert book.get("seed-A").source == str(paths.user_presets_file())


@pytest.mark.parametrize("text, needle", [
    ("[presets.a]\nblock_size = \n", "p.toml:2: preset 'a': TOML syntax error"),
    ("[presets.a]\nblock_size = \"big\"\n", "p.toml:2: preset 'a', key 'block_size': should be a valid integer"),
    ("[presets.a]\nport = 99999\n", "p.toml:2: preset 'a', key 'port': should be less than or equal to 65535"),
    ("[presets.a]\ngpu_memory_utilization = 1.5\n", "key 'gpu_memory_utilization': should be less than or equal to 1"),
    ("[presets.a]\nextends = \"b\"\n[presets.b]\nextends = \"a\"\n", "`extends` cycle"),
    ("[presets.a]\nextends = \"nope\"\n", "p.toml:2: preset 'a', key 'extends': no preset named 'nope'"),
    ("[presets.a]\nenable_prefix_caching = 1\n", "key 'enable_prefix_caching': should be a valid boolean, got 1"),
])
def test_bad_input_is_a_clear_error(tmp_path, text, needle):
    f = write(tmp_path, text)
    with pytest.raises(PresetError) as e:
        load_presets([f])
    assert needle in str(e.value)


# Issue #10 defect 7: every preset error names file, preset, key and line.
@pytest.mark.parametrize("text, line, preset, key, reason", [
    ('# mine\n[presets.big]\nblock_size = 32\nkv_cache_memory_bytes = "lots"  # how much\n',
     4, "big", "kv_cache_memory_bytes", "expected a size like 64M or 1G, got 'lots'"),
    ('[presets.a]\nport = 8000\n\n[presets."b.c"]\nmodel = "/m"\nport = 0\n',
     6, "b.c", "port", "should be greater than or equal to 1, got 0"),
    ('presets.a.block_size = 16\npresets.a.max_model_len = "4k"\n',
     2, "a", "max_model_len", "should be a valid integer, got '4k'"),
    ('[presets.a]\nblock_size = 16\n[presets.a.env]\nX = "1"\nY = true\n',
     5, "a", "env.Y", "environment values are strings or numbers, got True"),
    ('[presets.a]\nlauncher = []\n', 2, "a", "launcher", "should have at least 1 item"),
    ('[presets.a]\nblock-size = 16\n', 2, "a", "block-size", "snake_case (block_size for --block-size)"),
    ('[presets.a]\nstarted = 2024-01-01\n', 2, "a", "started", "a date cannot become a vLLM flag"),
    ('[presets.a]\nport = 1\n[presets.b]\nextends = "a"\n[presets.c]\nextends = "zz"\n',
     6, "c", "extends", "no preset named 'zz' to extend"),
    ('[presets.ok]\nblock_size = 16\n[presets.broken]\nblock_size = [16\n', 4, "broken", None,
     "TOML syntax error"),
    # Found by bench/reliability.py presets: tomllib reads integers of any size, TOML allows 64 bits.
    ('[presets.a]\nport = 8000\nmax_model_len = 99999999999999999999999\n', 3, "a", "max_model_len",
     "integer out of TOML's 64-bit range"),
    ('[presets.a]\n[presets.a.env]\nX = -9223372036854775809\n', 3, "a", "env.X", "64-bit range"),
])
def test_errors_name_file_preset_key_and_line(tmp_path, text, line, preset, key, reason):
    f = write(tmp_path, text)
    with pytest.raises(PresetError) as e:
        load_presets([f])
    err = e.value
    assert (err.file, err.line, err.preset, err.key) == (str(f), line, preset, key)
    assert reason in err.reason
    about = f"preset {preset!r}" + (f", key {key!r}" if key else "")
    assert str(err).startswith(f"{f}:{line}: {about}: ")


def test_top_level_mistakes_name_the_line(tmp_path):
    f = write(tmp_path, '[presets.a]\nport = 1\n\n[preset.b]\nport = 2\n')
    with pytest.raises(PresetError, match=r"p.toml:4: key 'preset': unexpected top-level key"):
        load_presets([f])


def test_schema_types_every_tool_key():
    from ernie_tui.presets.model import TOOL_KEYS
    from ernie_tui.presets.schema import PresetTable

    assert TOOL_KEYS <= set(PresetTable.model_fields)


def test_unknown_engine_args_stay_open(tmp_path):
    """Engine arguments we have no type for pass through, in file order, as
    written; preflight judges them against the installed vLLM."""
    f = write(tmp_path, """
        [presets.a]
        model = "/m/x"
        compilation_config = { level = 0 }
        max_num_seqs = 4
        some_future_flag = "on"
        gpu_memory_utilization = 1
    """)
    p = load_presets([f]).get("a")
    assert list(p.engine_args.items()) == [("compilation_config", {"level": 0}), ("max_num_seqs", 4),
                                           ("some_future_flag", "on"), ("gpu_memory_utilization", 1)]
    assert p.launch_spec().argv[-8:] == ["--compilation-config", '{"level":0}', "--max-num-seqs", "4",
                                         "--some-future-flag", "on", "--gpu-memory-utilization", "1"]


def test_unknown_preset_lists_known():
    with pytest.raises(PresetError, match="unknown preset 'zzz'.*seed-A"):
        load_presets().get("zzz")


def test_cli_errors_exit_1_without_traceback(tmp_path, capsys):
    f = write(tmp_path, "[presets.a\n")
    assert main(["presets", "list", "--presets", str(f)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ernie-tui: error:") and "Traceback" not in err and "p.toml:1" in err
    assert main(["presets", "show", "nope"]) == 1


@pytest.mark.parametrize("text, where", [
    ('[presets.mine]\nblock_size = 32\nkv_cache_memory_bytes = "lots"\n',
     ":3: preset 'mine', key 'kv_cache_memory_bytes': expected a size like 64M or 1G, got 'lots'"),
    ('[presets.mine]\nblock_size = 32\nmax_model_len = \n', ":3: preset 'mine': TOML syntax error"),
    (b"[presets.mine]\ndescription = \"caf\xe9\"\n", ":2: not UTF-8 text (invalid continuation byte at column 19)"),
])
@pytest.mark.parametrize("argv", [["presets", "list"], ["--preset", "seed-A"]], ids=["list", "dashboard"])
def test_broken_user_file_is_one_line_and_exit_1(capsys, text, where, argv):
    """A malformed user presets.toml stops `presets list` and the dashboard's
    start with one line that says where, and exit 1: no traceback."""
    user = paths.user_presets_file()
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert err == f"ernie-tui: error: {user}{where}\n" or (err.startswith(f"ernie-tui: error: {user}{where}")
                                                           and err.count("\n") == 1), err
    assert "Traceback" not in out + err


def test_cli_show_command(capsys):
    assert main(["presets", "show", "seed-C", "--command", "--model", "/models/ernie"]) == 0
    out = capsys.readouterr().out
    assert "--model /models/ernie" in out and "--block-size 32 --max-model-len 4096" in out


def test_no_model_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("ERNIE_TUI_MODEL", raising=False)
    with pytest.raises(PresetError, match="names no model"):
        load_presets().get("seed-A").launch_spec()


@pytest.mark.parametrize("host, url", [
    ("0.0.0.0", "http://127.0.0.1:8000"), ("0", "http://127.0.0.1:8000"), ("", "http://127.0.0.1:8000"),
    ("::", "http://[::1]:8000"), ("::0", "http://[::1]:8000"), ("0:0:0:0:0:0:0:0", "http://[::1]:8000"),
    ("127.0.0.1", "http://127.0.0.1:8000"), ("localhost", "http://localhost:8000"),
    ("::1", "http://[::1]:8000"),
])
def test_launch_url_reaches_every_interface_binds_on_loopback(host, url):
    # "0" and "::0" bind every interface like "0.0.0.0": the client must not dial http://0:8000
    from ernie_tui.presets.model import connect_host
    h = connect_host(host)
    assert (f"http://[{h}]:8000" if ":" in h else f"http://{h}:8000") == url


def test_key_order_keeps_every_built_in_key_whatever_the_user_file_gains(tmp_path):
    """The dashboard's 1-9 follow key_order: --presets files (in the order
    given), then the built-ins, then the user's file, whose new tables (tune's
    BASE-tuned) go last; a user table overriding a built-in keeps its place."""
    builtins = load_presets(include_user=False).names()
    user = paths.user_presets_file()
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text('[presets.zz-tuned]\nextends = "cpu-demo"\n\n[presets.aa-mine]\nextends = "seed-A"\n\n'
                    '[presets.cpu-demo]\nextends = "seed-A"\ndescription = "mine now"\n')
    second = write(tmp_path, '[presets.two]\nextends = "seed-A"\n', "second.toml")
    first = write(tmp_path, '[presets.one]\nextends = "seed-A"\n\n[presets.zz-tuned]\nextends = "seed-A"\n',
                  "first.toml")
    book = load_presets([first, second])
    assert book.key_order() == ["one", "zz-tuned", "two", *builtins, "aa-mine"]
    assert book.get("cpu-demo").description == "mine now"  # overridden, in the built-in's place (key 5)
    assert load_presets().key_order() == [*builtins, "zz-tuned", "aa-mine"]  # the user file in its own order
