"""Switching presets while serving judges the new one first (issue #10, 9).

In `ernie-tui demo`, key 1 (seed-A) used to ask "Switch to seed-A? This
stops cpu-demo-b64" and only after "y" say the preset names no model. Now
the model is resolved and preflight runs before anything is asked: an
unlaunchable preset says why at once and the running server keeps serving;
and the dashboard's --model (the demo's tiny model) serves every preset that
names none.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ernie_tui.tui.app import make_app
from ernie_tui.tui.screens.dialogs import ConfirmScreen, PreflightScreen
from test_tui_pilot import FAKE, Recorder, free_port, screen_text_of, wait_for


@pytest.fixture
def presets_file(tmp_path, fixtures_dir, tiny_model) -> Path:
    """fake-a names the tiny model; the others name none (as the built-ins)."""
    port = free_port()
    common = f"""launcher = ["{sys.executable}", "{FAKE}"]
max_model_len = 2048
kv_cache_memory_bytes = "64M"
port = {port}
env = {{ ERNIE_FAKE_FIXTURES = "{fixtures_dir / 'cpu-vllm0.32.0'}", ERNIE_FAKE_DELAY = "0.2" }}
"""
    text = f"""
[presets.fake-a]
model = "{tiny_model}"
block_size = 32
{common}
[presets.nomodel-32]
description = "names no model; block 32 serves on CPU"
block_size = 64
{common}
[presets.nomodel-16]
description = "names no model; block 16, which vLLM CPU refuses"
block_size = 16
{common}
"""
    path = tmp_path / "presets.toml"
    path.write_text(text)
    return path


def key_of(app, name: str) -> str:
    number = app.main.preset_names.index(name) + 1
    assert number <= 9
    return str(number)


async def serving(pilot, app, name: str) -> None:
    await wait_for(pilot, lambda: app.status is not None and app.status.state.value == "ready"
                   and app.status.preset_name == name, what=f"{name} ready")


async def test_switch_to_a_preset_without_a_model_refuses_at_once(presets_file, tmp_path, monkeypatch):
    monkeypatch.delenv("ERNIE_TUI_MODEL", raising=False)
    rec = Recorder(tmp_path)
    app = make_app(preset="fake-a", preset_files=[str(presets_file)], start=True, server_factory=rec, live=False,
                   include_user_presets=False)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await serving(pilot, app, "fake-a")
            pid = rec.servers[0].status.pid
            await pilot.press(key_of(app, "nomodel-32"))
            await pilot.pause(0.5)
            assert not isinstance(app.screen, ConfirmScreen), "asked to stop the server for a preset that cannot launch"
            notes = [n.message for n in app._notifications]
            assert any("names no model" in m for m in notes), notes
            assert rec.servers[0].status.pid == pid and app.status.state.value == "ready"
            assert app.status.preset_name == "fake-a"
    finally:
        rec.cleanup()


async def test_switch_preflights_before_asking_and_the_model_serves_presets_naming_none(
        presets_file, tmp_path, tiny_model, monkeypatch):
    monkeypatch.delenv("ERNIE_TUI_MODEL", raising=False)
    rec = Recorder(tmp_path)
    # As `ernie-tui demo` runs it: the tiny model given as the dashboard's model.
    app = make_app(preset="fake-a", preset_files=[str(presets_file)], start=True, server_factory=rec, live=False,
                   include_user_presets=False, model=str(tiny_model))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await serving(pilot, app, "fake-a")
            server = rec.servers[0]
            pid = server.status.pid

            # Block 16 on CPU: preflight says why first; no "This stops fake-a" question.
            await pilot.press(key_of(app, "nomodel-16"))
            await wait_for(pilot, lambda: isinstance(app.screen, (PreflightScreen, ConfirmScreen)),
                           what="a dialog")
            assert isinstance(app.screen, PreflightScreen), "asked to switch before preflight judged the preset"
            text = screen_text_of(app.screen)
            assert "block_size_unsupported" in text
            assert "stops fake-a" in text, "the dialog says what launching anyway would stop"
            await pilot.press("n")
            await wait_for(pilot, lambda: not isinstance(app.screen, PreflightScreen), 5, "the dialog to close")
            await pilot.pause(0.3)
            assert server.status.pid == pid and server.status.preset_name == "fake-a", "fake-a kept serving"
            assert server.status.state.value == "ready"

            # A preset that names no model but can launch: asked, then served with the dashboard's model.
            await pilot.press(key_of(app, "nomodel-32"))
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the switch question")
            assert "This stops fake-a" in screen_text_of(app.screen)
            await pilot.press("y")
            await serving(pilot, app, "nomodel-32")
            argv = server.spec.argv
            assert argv[argv.index("--model") + 1] == str(tiny_model)
            assert argv[argv.index("--block-size") + 1] == "64"
    finally:
        rec.cleanup()


def test_demo_gives_its_model_to_presets_naming_none(tiny_model):
    """`ernie-tui demo` passes the tiny model (or the global --model) to the dashboard."""
    from ernie_tui import paths
    from ernie_tui.cli import build_parser
    from ernie_tui.cli.cmd_demo import demo_args

    target = paths.demo_model_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(tiny_model, target_is_directory=True)  # no need to write it again
    args = demo_args(build_parser().parse_args(["demo"]))
    assert args.model == str(target) and args.preset == "cpu-demo" and args.start
    args = demo_args(build_parser().parse_args(["--model", "/models/mine", "demo", "--preset", "cpu-demo-b64"]))
    assert args.model == "/models/mine" and args.preset == "cpu-demo-b64"


async def test_the_dashboard_model_is_for_presets_naming_none(presets_file, tiny_model):
    """--model serves presets that name no model (its help says so); a preset
    naming its own keeps it."""
    from ernie_tui.tui.screens.dialogs import CommandLineScreen

    app = make_app(preset="fake-a", preset_files=[str(presets_file)], live=False, include_user_presets=False,
                   model="/elsewhere/model")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandLineScreen), 5, "the command line")
        assert f"--model {tiny_model} " in app.screen.command
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, CommandLineScreen), 5, "the dialog to close")
        app.show_command_line("nomodel-32")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandLineScreen), 5, "the command line")
        assert "--model /elsewhere/model " in app.screen.command


async def test_the_command_palette_names_the_keys_the_presets_panel_uses(presets_file, tmp_path, monkeypatch):
    """The panel numbers --presets files first, then the built-ins, then the
    user's file (PresetBook.key_order); the palette's "Switch preset"
    commands must name the same key, not the book's order, where a preset
    of the --presets file comes after the built-ins."""
    monkeypatch.setenv("ERNIE_TUI_HOME", str(tmp_path / "home"))
    from ernie_tui import paths

    user = paths.user_presets_file()
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text('[presets.mine-tuned]\nextends = "fake-a"\nmax_num_seqs = 8\n')
    app = make_app(preset="fake-a", preset_files=[str(presets_file)], live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        names = app.main.preset_names
        assert names.index("fake-a") < 9 < names.index("mine-tuned") == len(names) - 1
        said = {c.title.removeprefix("Switch preset: "): c.help for c in app.get_system_commands(app.screen)
                if c.title.startswith("Switch preset: ")}
        for i, name in enumerate(names[:9]):
            assert said[name].endswith(f"({i + 1})"), (name, said[name])
        assert not said["mine-tuned"].endswith(")"), said["mine-tuned"]  # past the ninth: no key
