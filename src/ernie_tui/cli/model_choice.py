"""Which model a preset that names none is launched, checked or shown with.

One rule for every command (`check`, `presets show --command`, `sweep`,
`demo`): --model DIR when given; else the preset's own model or
$ERNIE_TUI_MODEL (the preset resolves those itself); else the tiny demo
model, once `ernie-tui demo` or `demo-model` has written it to ernie-tui's
data dir. Where the demo model stands in, the user is told so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ernie_tui import paths


@dataclass(frozen=True)
class ModelChoice:
    model: str | None  # the override to pass to launch_spec / preflight; None: the preset's own rule
    note: str | None = None  # said to the user when the demo model stands in


def demo_model_written() -> bool:
    return (paths.demo_model_dir() / "model.safetensors").is_file()


def model_for(preset, model_arg: str | None) -> ModelChoice:
    """The model to give `preset` (see the module's rule)."""
    if model_arg:
        return ModelChoice(model_arg)
    if preset.model or os.environ.get("ERNIE_TUI_MODEL") or not demo_model_written():
        return ModelChoice(None)
    demo = str(paths.demo_model_dir())
    return ModelChoice(demo, f"preset {preset.name!r} names no model: using the demo model {demo} "
                             "(pass --model DIR for another)")
