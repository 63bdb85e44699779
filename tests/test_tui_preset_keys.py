"""The keys after `tune` (issue #59, item 7): a dashboard already open shows
the BASE-tuned preset another process writes into the presets file, and no
preset's number key moves for it, in that dashboard or in a new one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ernie_tui.presets import load_presets
from ernie_tui.tui.app import make_app
from test_tui_pilot import wait_for

SRC = Path(__file__).resolve().parent.parent / "src"

# What `ernie-tui tune cpu-demo` ends with (cli/cmd_tune.py, _write_preset):
# the best setting saved into the user's presets file by the store, from a
# process of its own.
WRITE_TUNED = textwrap.dedent("""
    from dataclasses import replace
    from ernie_tui.presets import load_presets
    from ernie_tui.presets.store import save_preset
    base = load_presets().get("cpu-demo")
    save_preset(replace(base, name="cpu-demo-tuned", description="tuned", source="user",
                        engine_args={**base.engine_args, "max_num_seqs": 8}), note="written by ernie-tui tune")
""")


def write_tuned_preset_elsewhere() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}  # ERNIE_TUI_HOME: the test's own (conftest)
    subprocess.run([sys.executable, "-c", WRITE_TUNED], env=env, check=True, timeout=60)


def builtin_names() -> list[str]:
    return load_presets(include_user=False).names()


async def test_an_open_dashboard_shows_a_preset_tune_writes_meanwhile():
    app = make_app(preset="cpu-demo", live=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        before = app.main.preset_names
        assert "cpu-demo-tuned" not in before and before == builtin_names()
        write_tuned_preset_elsewhere()
        await wait_for(pilot, lambda: "cpu-demo-tuned" in app.main.preset_names, 15,
                       "the tuned preset in the open dashboard's panel")
        after = app.main.preset_names
        assert after == [*before, "cpu-demo-tuned"]  # added last: every key as it was
        assert app.book.get("cpu-demo-tuned").engine_args["max_num_seqs"] == 8
        assert app.active_preset == "cpu-demo"
        # The note names it, and how to reach it past the ninth key.
        assert any("new: cpu-demo-tuned (presets panel: arrows, Enter)" in n.message for n in app._notifications)


async def test_built_in_keys_do_not_move_after_a_tuned_preset_is_written(tmp_path):
    builtins = builtin_names()
    assert builtins.index("cpu-demo") == 4  # key 5, as the operator learned it

    async def keys(**kw) -> list[str]:
        app = make_app(live=False, **kw)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            return app.main.preset_names

    assert await keys() == builtins
    write_tuned_preset_elsewhere()
    assert await keys() == [*builtins, "cpu-demo-tuned"]
    # With --presets, the file's presets keep the keys they had before the tune, and so do the built-ins.
    mine = tmp_path / "mine.toml"
    mine.write_text('[presets.mine]\nextends = "cpu-demo"\nmax_num_seqs = 4\n')
    assert await keys(preset_files=[str(mine)]) == ["mine", *builtins, "cpu-demo-tuned"]


def test_the_watch_sees_a_file_created_replaced_or_removed_once_each(tmp_path):
    from ernie_tui.tui.presets_watch import PresetFilesWatch

    path = tmp_path / "presets.toml"
    watch = PresetFilesWatch([path])
    assert not watch.changed()  # no file yet, none still
    path.write_text('[presets.a]\nextends = "cpu-demo"\n')
    assert watch.changed() and not watch.changed()
    # The store's way: a new file of the same size renamed over it, within the mtime's granularity.
    other = tmp_path / "new.toml"
    other.write_text('[presets.b]\nextends = "cpu-demo"\n')
    os.utime(other, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    os.replace(other, path)
    assert watch.changed()
    path.write_text('[presets.c]\nextends = "seed-A"\n')
    watch.sync()  # the dashboard reloads on its own (`e`): the timer does not reload it again
    assert not watch.changed()
    path.unlink()
    assert watch.changed()
