"""Where ernie-tui keeps its files (platformdirs), overridable for tests.

ERNIE_TUI_HOME, when set, puts config, data and state under one folder: the
tests and the tmux test use it so they never touch the user's real dirs.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "ernie-tui"


def _home() -> Path | None:
    value = os.environ.get("ERNIE_TUI_HOME")
    return Path(value) if value else None


def config_dir() -> Path:
    home = _home()
    return home / "config" if home else Path(platformdirs.user_config_dir(APP))


def data_dir() -> Path:
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir(APP))


def state_dir() -> Path:
    """Logs of servers we start, pid files of detached servers."""
    home = _home()
    return home / "state" if home else Path(platformdirs.user_state_dir(APP))


def user_presets_file() -> Path:
    return config_dir() / "presets.toml"


def demo_model_dir() -> Path:
    return data_dir() / "models" / "tiny-ernie"


def runs_dir() -> Path:
    """Run records (bursts, sweeps) as JSON files."""
    return data_dir() / "runs"
