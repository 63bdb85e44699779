"""The operator's CLI gaps of issue #18 (items 5 and 8): a typo'd preset key
is named with its nearest vLLM argument by `presets list` and `show`, and the
fix renames it; `presets list` has a header and the descriptions; `parse-log`
of an empty file says so and fails."""

from __future__ import annotations

import json
import textwrap

import pytest

from ernie_tui.cli import main
from ernie_tui.engine_ctl.launch import diagnose_failure, run_preflight
from ernie_tui.engine_ctl.launch.machine import Machine
from ernie_tui.presets import load_presets

TYPO = textwrap.dedent("""
    [presets.typo]
    description = "CPU demo with a typo'd block size."
    model = "/models/tiny"
    blok_size = 32
    max_model_len = 2048
    kv_cache_memory_bytes = "64M"
""")


@pytest.fixture
def typo_file(tmp_path):
    path = tmp_path / "typo.toml"
    path.write_text(TYPO)
    return path


def test_presets_list_warns_of_a_typo_with_the_nearest_argument(typo_file, capsys):
    assert main(["presets", "list", "--presets", str(typo_file)]) == 0
    out, err = capsys.readouterr()
    assert "typo: blok_size is not an argument of vLLM" in err
    assert "did you mean block_size?" in err
    assert out.splitlines()[0].split() == ["NAME", "KEY", "ARGUMENTS", "SOURCE"]
    assert "CPU demo with a typo'd block size." in out  # the descriptions are listed


def test_presets_show_command_warns_of_a_typo(typo_file, capsys):
    assert main(["presets", "show", "typo", "--command", "--presets", str(typo_file)]) == 0
    out, err = capsys.readouterr()
    assert "--blok-size 32" in out  # the command is what the preset says; the warning says it is wrong
    assert "did you mean block_size?" in err


def test_a_clean_preset_draws_no_warning(tmp_path, capsys):
    path = tmp_path / "ok.toml"
    path.write_text(TYPO.replace("blok_size", "block_size"))
    assert main(["presets", "show", "typo", "--presets", str(path)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_fix_for_a_typo_renames_the_key(typo_file, capsys):
    from ernie_tui.engine_ctl.launch import describe_changes

    preset = load_presets([typo_file], include_user=False).get("typo")
    machine = Machine(platform="cpu", source="test", cpu_total_bytes=16 << 30, cpu_available_bytes=8 << 30)
    result = run_preflight(preset, None, machine)
    problem = next(p for p in result.problems if p.kind.value == "unknown_argument")
    assert problem.fix == {"blok_size": None, "block_size": 32}
    assert describe_changes(problem.fix) == "rename blok_size to block_size (= 32)"
    diagnosis = diagnose_failure(problem, preset, platform="cpu")
    assert diagnosis.fix_summary.startswith("rename blok_size to block_size")
    main(["check", "typo", "--presets", str(typo_file), "--platform", "cpu"])
    assert "fix: rename blok_size to block_size (= 32)" in capsys.readouterr().out


def test_a_typo_refused_by_vllm_in_the_log_is_renamed_too(typo_file):
    from ernie_tui.engine_ctl.logs.errors import ErrorKind
    from ernie_tui.engine_ctl.logs.report import EngineError

    preset = load_presets([typo_file], include_user=False).get("typo")
    error = EngineError(kind=ErrorKind.UNKNOWN_ARGUMENT,
                        message="api_server.py: error: unrecognized arguments: --blok-size 32", line_no=3,
                        detail={"arguments": ["--blok-size", "32"]})
    diagnosis = diagnose_failure(error, preset, platform="cpu")
    assert diagnosis.fix_changes == {"blok_size": None, "block_size": 32}


def test_parse_log_of_an_empty_file_says_so_and_fails(tmp_path, capsys):
    empty = tmp_path / "llm.log"
    empty.write_bytes(b"")
    assert main(["parse-log", str(empty)]) != 0
    err = capsys.readouterr().err
    assert "empty" in err and "llm.log" in err


def test_parse_log_names_cpu_attention_and_compile_seconds(fixtures_dir, capsys):
    # The CPU log: ~26 s of warm-up/compile between its stamps, no backend line.
    assert main(["parse-log", str(fixtures_dir / "cpu-vllm0.32.0" / "fail_block16.log")]) == 0
    out = capsys.readouterr().out
    assert "attention       CPU_ATTN (implied" in out
    assert "torch.compile   26 s" in out


def _refused_url() -> str:
    import socket

    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("mode", [["--burst", "4"], ["--capacity", "--slo", "ttft_p99=1s"]])
def test_a_refused_url_prints_just_the_reason(mode, capsys):
    assert main(["probe", "--url", _refused_url(), *mode, "--no-save"]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # no table of dashes, no empty table header
    assert err.startswith("ernie-tui: error: ") and "did not start: connection refused" in err
    assert len(err.strip().splitlines()) == 1


def test_a_refused_probe_says_its_error_as_every_command_does(capsys):
    # It said `error (connection_refused): ...` on stdout (issue #44, 12b):
    # now `ernie-tui: error: connection_refused: ...` on stderr, the kind kept.
    assert main(["probe", "--url", _refused_url()]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("ernie-tui: error: connection_refused: connection refused by "), err
    assert len(err.strip().splitlines()) == 1
    assert main(["probe", "--url", _refused_url(), "--json"]) == 1  # JSON keeps the kind as a field
    assert json.loads(capsys.readouterr().out)["error"]["kind"] == "connection_refused"


def test_presets_show_command_falls_back_to_the_demo_model_as_check_does(monkeypatch, capsys):
    # `presets show seed-C --command` failed with "names no model" where
    # `check` and the demo's dashboard use the demo model (issue #44, 12c).
    # One rule (cli/model_choice.py): --model, else the preset's own or
    # $ERNIE_TUI_MODEL, else the demo model once it is written.
    from ernie_tui import paths
    from ernie_tui.demo_model import write_demo_model

    monkeypatch.delenv("ERNIE_TUI_MODEL", raising=False)
    assert main(["presets", "show", "seed-C", "--command"]) == 1  # nothing to fall back to yet
    assert "names no model" in capsys.readouterr().err
    demo = paths.demo_model_dir()
    write_demo_model(demo, "tiny")
    assert main(["presets", "show", "seed-C", "--command"]) == 0
    out, err = capsys.readouterr()
    assert f"--model {demo} " in out and f"using the demo model {demo}" in err
    main(["check", "seed-C", "--platform", "cpu", "--no-port"])
    out, err = capsys.readouterr()
    assert f"model {demo}" in out and "model checks skipped" not in out and f"using the demo model {demo}" in err
    # --model, a preset's own model and $ERNIE_TUI_MODEL come first, and need no note.
    assert main(["presets", "show", "seed-C", "--command", "--model", "/models/mine"]) == 0
    out, err = capsys.readouterr()
    assert "--model /models/mine " in out and "demo model" not in err
    monkeypatch.setenv("ERNIE_TUI_MODEL", "/models/env")
    assert main(["presets", "show", "seed-C", "--command"]) == 0
    out, err = capsys.readouterr()
    assert "--model /models/env " in out and "demo model" not in err
