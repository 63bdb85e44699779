"""What ernie-tui writes is readable by its owner only: server logs echo
prompts and a preset's env, run records keep the preset. Dirs 0700, files
0600, whatever the umask; `presets show` masks secret-looking env values."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from ernie_tui import paths
from ernie_tui.cli import main
from ernie_tui.engine_ctl.control.server import EngineServer, ServerState
from ernie_tui.engine_ctl.load.runstore import save_run
from ernie_tui.presets.model import Preset
from vllm_support import free_port

FAKE_VLLM = Path(__file__).with_name("tui_fake_vllm.py")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():
    """The umask most desktops have: without care, files come out 0644."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_server_log_rotation_and_detach_record_are_private(fixtures_dir, open_umask):
    state = paths.state_dir()
    # An older version left the state dir and the log world-readable.
    state.mkdir(parents=True, mode=0o755)
    os.chmod(state, 0o755)
    (state / "llm.log").write_text("an older run's log\n")
    os.chmod(state / "llm.log", 0o644)
    preset = Preset(name="fake", launcher=[sys.executable, str(FAKE_VLLM)], model=str(state), port=free_port(),
                    engine_args={"block_size": 32},
                    env={"ERNIE_FAKE_FIXTURES": str(fixtures_dir / "cpu-vllm0.32.0"), "ERNIE_FAKE_DELAY": "0.05"})
    server = EngineServer(preset.launch_spec(), preset_name="fake")
    try:
        server.start()
        deadline = time.time() + 60
        while server.report.lines == 0 and time.time() < deadline:
            time.sleep(0.02)
        assert server.status.state in (ServerState.STARTING, ServerState.READY)
        record = server.detach()
        assert record == state / "server.json" and json.loads(record.read_text())["pid"] == server.status.pid
        assert mode(state) == 0o700
        assert mode(state / "llm.log") == 0o600
        assert mode(state / "llm.log.1") == 0o600
        assert mode(record) == 0o600
    finally:
        server.stop()
        server.close()


def test_run_records_and_their_dirs_are_private(open_umask):
    rec = save_run("burst", {"requests": 1}, notes="a prompt someone typed")
    assert rec.path.parent == paths.runs_dir()
    assert mode(rec.path) == 0o600
    assert mode(paths.runs_dir()) == 0o700 and mode(paths.data_dir()) == 0o700


def test_private_helpers(tmp_path, open_umask):
    own = paths.private_dir(paths.state_dir() / "sweep-logs" / "run-1")
    assert all(mode(d) == 0o700 for d in (paths.state_dir(), own.parent, own))
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o755)
    paths.private_dir(elsewhere)
    assert mode(elsewhere) == 0o755  # a folder the user named keeps its mode
    made = paths.private_dir(tmp_path / "new" / "deeper")
    assert mode(made) == 0o700 and mode(made.parent) == 0o700
    f = paths.write_private_text(made / "x.json", "{}")
    assert mode(f) == 0o600 and f.read_text() == "{}" and sorted(p.name for p in made.iterdir()) == ["x.json"]
    old = made / "old.log"
    old.write_text("x")
    os.chmod(old, 0o644)
    with open(old, "ab", opener=paths.private_opener) as out:
        out.write(b"y")
    assert mode(old) == 0o600 and old.read_text() == "xy"


def test_demo_model_files_and_folders_are_private(tmp_path, open_umask, capsys):
    # `ernie-tui demo-model DIR` wrote 0644 files in 0755 folders (issue #44, 11).
    target = tmp_path / "models" / "tiny"
    assert main(["demo-model", str(target)]) == 0
    assert "wrote tiny model" in capsys.readouterr().out
    files = sorted(p for p in target.iterdir())
    assert {p.name for p in files} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    assert mode(target) == 0o700 and mode(target.parent) == 0o700  # both made by it
    # The dashboard's own copy (`ernie-tui demo`), under the data dir.
    from ernie_tui.cli.cmd_demo import ensure_demo_model

    own = Path(ensure_demo_model())
    capsys.readouterr()
    assert all(mode(p) == 0o600 for p in own.iterdir()) and mode(own) == 0o700


def test_presets_show_masks_secret_looking_env(tmp_path, capsys):
    toml = tmp_path / "p.toml"
    toml.write_text('''
[presets.withenv]
model = "/m"

[presets.withenv.env]
HF_TOKEN = "hf_abc"
OPENAI_API_KEY = "sk-1"
DB_PASSWORD = "pw"
AWS_SECRET_ACCESS_KEY = "s3"
TOKENIZERS_PARALLELISM = "false"
VLLM_LOGGING_LEVEL = "DEBUG"
''')
    for extra in ([], ["--json"]):
        assert main(["--presets", str(toml), "presets", "show", "withenv", "--command", *extra]) == 0
        out = capsys.readouterr().out
        for secret in ("hf_abc", "sk-1", "pw", "s3"):
            assert f"={secret}" not in out and f'"{secret}"' not in out
        assert "TOKENIZERS_PARALLELISM" in out and "false" in out and "DEBUG" in out
        assert out.count("***") == 4
    assert main(["--presets", str(toml), "presets", "show", "withenv", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["env"]
    assert shown["HF_TOKEN"] == "***" and shown["TOKENIZERS_PARALLELISM"] == "false"
