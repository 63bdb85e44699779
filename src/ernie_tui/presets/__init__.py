"""Presets: named sets of vLLM engine arguments plus how to launch them.

No Textual or Rich here either (see tests/test_import_contract.py).
"""

from ernie_tui.presets.loader import PresetBook, load_presets
from ernie_tui.presets.model import LaunchSpec, Preset, PresetError, parse_size

__all__ = ["LaunchSpec", "Preset", "PresetBook", "PresetError", "load_presets", "parse_size"]
