"""What every preflight check shares: the problem it reports, the context it
reads (CheckContext) and the launcher's Python. preflight.py and
preflight_parallel.py both import it, so neither imports the other back.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ernie_tui.engine_ctl.launch.estimate import Estimate
from ernie_tui.engine_ctl.launch.machine import Machine
from ernie_tui.engine_ctl.launch.modelinfo import ModelInfo
from ernie_tui.engine_ctl.logs import ErrorKind, Severity
from ernie_tui.presets.model import Preset


@dataclass
class Problem:
    kind: ErrorKind
    severity: Severity  # a plain "error" / "warning" is converted
    message: str
    fix: dict[str, Any] | None = None  # preset changes; a value of None removes the key
    check: str = ""  # which check found it

    def __post_init__(self) -> None:
        self.kind = ErrorKind(self.kind)
        self.severity = Severity(self.severity)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "severity": self.severity.value, "message": self.message, "fix": self.fix}


@dataclass
class VllmArgs:
    version: str
    options: frozenset[str]
    choices: dict[str, list[str]]
    source: str  # "cache", "dump", "shipped", "shipped (vLLM not importable)"

    def has(self, flag: str) -> bool:
        return flag in self.options


def launcher_python(preset: Preset) -> str:
    """The Python that will run vLLM for this preset (as Preset.launch_spec picks it)."""
    if preset.launcher:
        first = os.path.expanduser(str(preset.launcher[0]))
        if "python" in Path(first).name:
            return first
        # `vllm serve` style launchers: the script's shebang names the Python.
        try:
            with open(first, "rb") as f:
                line = f.readline().decode(errors="replace")
            if line.startswith("#!") and "python" in line:
                return line[2:].strip().split()[0]
        except OSError:
            pass
    return os.environ.get("ERNIE_TUI_VLLM_PYTHON") or sys.executable


@dataclass
class CheckContext:
    preset: Preset
    info: ModelInfo | None
    machine: Machine
    env: dict[str, str]
    est: Estimate | None
    args: VllmArgs | None
    problems: list[Problem]

    def add(self, kind: ErrorKind, severity: Severity | str, message: str, fix: dict | None = None,
            check: str = "") -> None:
        self.problems.append(Problem(kind, Severity(severity), message, fix, check))
