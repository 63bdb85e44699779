"""Saving NAME-fixed into the user presets file: atomic, comment-keeping, and
never over a file that does not parse."""

from __future__ import annotations

import os
import threading
import tomllib
from dataclasses import replace

import pytest

from ernie_tui import paths
from ernie_tui.engine_ctl.diagnose import apply_fix, diagnose
from ernie_tui.engine_ctl.report import EngineError, ErrorKind
from ernie_tui.presets import PresetError, load_presets
from ernie_tui.presets.store import delete_preset, preset_table, save_preset

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
    with pytest.raises(PresetError, match="refusing to overwrite"):
        save_preset(seed_b_fixed)
    assert path.read_text() == broken  # untouched


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
