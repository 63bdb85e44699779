"""The one write path for presets files (presets/store.py): NAME-fixed, the
`e` copy of a built-in, `presets delete`. Atomic, comment-keeping, private,
and never over a file that does not parse."""

from __future__ import annotations

import os
import threading
import tomllib
from dataclasses import replace

import pytest

from ernie_tui import paths
from ernie_tui.cli import main
from ernie_tui.engine_ctl.launch.diagnose import apply_fix, diagnose
from ernie_tui.engine_ctl.logs.errors import ErrorKind
from ernie_tui.engine_ctl.logs.report import EngineError
from ernie_tui.presets import PresetError, load_presets
from ernie_tui.presets.store import delete_preset, ensure_preset, preset_table, save_preset

USER_FILE = """\
# my presets: hand-written, with comments
[presets.mine]
description = "mine"   # keep this comment
block_size = 32
max_model_len = 2048

[presets.mine.env]
OMP_NUM_THREADS = "2"

[presets.other]
extends = "seed-A"
port = 8100
"""


@pytest.fixture
def seed_b_fixed():
    book = load_presets(include_user=False)
    err = EngineError(ErrorKind.BLOCK_SIZE_UNSUPPORTED, "ValueError: No valid attention backend ... block_size=8")
    return apply_fix(book.get("seed-B"), diagnose(err, book.get("seed-B"), "cuda"))


def test_save_into_missing_file_and_load_back(seed_b_fixed):
    path = save_preset(seed_b_fixed)
    assert path == paths.user_presets_file() and path.is_file()
    loaded = load_presets().get("seed-B-fixed")
    assert loaded.engine_args == seed_b_fixed.engine_args == {"block_size": 16, "max_model_len": 2048,
                                                              "gpu_memory_utilization": 0.85}
    assert loaded.description == seed_b_fixed.description
    assert loaded.source == str(path)


def test_save_keeps_comments_and_other_tables(seed_b_fixed):
    path = paths.user_presets_file()
    path.parent.mkdir(parents=True)
    path.write_text(USER_FILE)
    save_preset(seed_b_fixed)
    text = path.read_text()
    assert text.startswith(USER_FILE)  # byte-for-byte, comments included
    book = load_presets()
    assert book.get("mine").env == {"OMP_NUM_THREADS": "2"} and book.get("other").port == 8100
    assert book.get("seed-B-fixed").block_size == 16


def test_replace_existing_fixed_table_with_subtable(seed_b_fixed):
    path = paths.user_presets_file()
    path.parent.mkdir(parents=True)
    path.write_text(USER_FILE)
    first = replace(seed_b_fixed, env={"A": "1"}, port=9001)
    save_preset(first)
    second = seed_b_fixed.with_changes(max_model_len=1024)
    save_preset(second)
    doc = tomllib.loads(path.read_text())
    fixed = doc["presets"]["seed-B-fixed"]
    assert fixed["max_model_len"] == 1024 and "env" not in fixed and fixed["port"] == 8000
    assert path.read_text().startswith(USER_FILE)
    assert path.read_text().count("[presets.seed-B-fixed]") == 1


def test_refuses_to_overwrite_unparsable_file(seed_b_fixed):
    path = paths.user_presets_file()
    path.parent.mkdir(parents=True)
    broken = USER_FILE + "\n[presets.bad\nblock_size = \n"
    path.write_text(broken)
    with pytest.raises(PresetError, match="refusing to overwrite") as e:
        save_preset(seed_b_fixed)
    assert path.read_text() == broken  # untouched
    assert (e.value.file, e.value.line, e.value.preset) == (str(path), 14, None)  # `[presets.bad` names none yet


def test_failed_write_leaves_old_file_and_no_temp(seed_b_fixed, monkeypatch):
    path = paths.user_presets_file()
    path.parent.mkdir(parents=True)
    path.write_text(USER_FILE)

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        save_preset(seed_b_fixed)
    assert path.read_text() == USER_FILE
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_concurrent_saves_all_land():
    book = load_presets(include_user=False)
    presets = [book.get("seed-A").with_changes(name=f"p{i}-fixed", max_model_len=1024 + i) for i in range(8)]
    threads = [threading.Thread(target=save_preset, args=(p,)) for p in presets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loaded = load_presets()
    for i in range(8):
        assert loaded.get(f"p{i}-fixed").max_model_len == 1024 + i


def test_table_is_self_contained_and_round_trips(monkeypatch):
    monkeypatch.setenv("K", "v")
    book = load_presets(include_user=False)
    tp2 = book.get("tp2")  # extends seed-A
    t = preset_table(tp2)
    assert "extends" not in t and t["tensor_parallel_size"] == 2 and t["block_size"] == 16
    p = replace(tp2, name="weird.name-fixed", host="0.0.0.0", api_key_env="K",
                launcher=["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"],
                engine_args={**tp2.engine_args, "kv_cache_memory_bytes": "64M", "enable_prefix_caching": False,
                             "compilation_config": {"level": 0}})
    save_preset(p)
    back = load_presets().get("weird.name-fixed")
    assert back.engine_args == p.engine_args
    assert (back.host, back.api_key_env, back.launcher) == (p.host, p.api_key_env, p.launcher)
    assert delete_preset("weird.name-fixed") and "weird.name-fixed" not in load_presets()
    assert not delete_preset("weird.name-fixed")


def test_store_imports_no_textual():
    import subprocess
    import sys

    code = ("import sys, ernie_tui.presets.store\n"
            "print(','.join(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# Issue #11: comments kept even in the table that is replaced.
def test_replacing_a_table_keeps_comments_on_keys_that_stay(seed_b_fixed):
    path = paths.user_presets_file()
    path.parent.mkdir(parents=True)
    path.write_text(USER_FILE + "\n# my own tweak of the fix\n[presets.seed-B-fixed]\nport = 8000\n"
                    "max_model_len = 2048  # half the posts' 4096\nblock_size = 8\n")
    save_preset(seed_b_fixed)
    text = path.read_text()
    assert text.startswith(USER_FILE + "\n# my own tweak of the fix\n[presets.seed-B-fixed]\n")
    assert "max_model_len = 2048  # half the posts' 4096\n" in text
    assert load_presets().get("seed-B-fixed").engine_args == seed_b_fixed.engine_args


# Issue #10 defect 10: the user's presets file is private.
def test_user_file_is_0600_in_a_0700_dir(seed_b_fixed):
    path = paths.user_presets_file()
    path.parent.mkdir(parents=True, mode=0o755)
    os.chmod(path.parent, 0o755)
    path.write_text(USER_FILE)
    os.chmod(path, 0o644)
    save_preset(seed_b_fixed)
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)


def test_new_user_file_is_private_from_the_start(seed_b_fixed):
    path = save_preset(seed_b_fixed)
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)


def test_a_preset_that_would_not_load_is_not_written(seed_b_fixed):
    bad = seed_b_fixed.with_changes(kv_cache_memory_bytes="lots")
    with pytest.raises(PresetError) as e:
        save_preset(bad)
    assert (e.value.preset, e.value.key) == ("seed-B-fixed", "kv_cache_memory_bytes")
    assert not paths.user_presets_file().exists()


def test_ensure_preset_copies_once_and_never_overwrites():
    """The dashboard's `e` on a built-in: a copy goes into the user file (with
    a note), once; a table the user has already is left alone."""
    path = paths.user_presets_file()
    path.parent.mkdir(parents=True)
    path.write_text(USER_FILE)
    book = load_presets()
    assert ensure_preset(book.get("seed-C"), note="copied from the built-in preset 'seed-C'")
    text = path.read_text()
    assert text.startswith(USER_FILE) and "[presets.seed-C]\n# copied from the built-in preset 'seed-C'\n" in text
    assert not ensure_preset(book.get("seed-C"))
    assert not ensure_preset(book.get("mine").with_changes(block_size=64))
    assert path.read_text() == text
    assert load_presets().get("seed-C").engine_args == book.get("seed-C").engine_args


def test_cli_delete_removes_only_that_table(seed_b_fixed, capsys):
    path = paths.user_presets_file()
    path.parent.mkdir(parents=True)
    path.write_text(USER_FILE)
    save_preset(seed_b_fixed)
    assert main(["presets", "delete", "seed-B-fixed"]) == 0
    assert path.read_text().rstrip() == USER_FILE.rstrip()
    assert main(["presets", "delete", "seed-B-fixed"]) == 1
    assert "has no preset 'seed-B-fixed'" in capsys.readouterr().err
