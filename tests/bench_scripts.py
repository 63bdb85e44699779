"""bench/ scripts as modules, for the tests that run their pure parts or
their main() on a stand-in (bench/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/NAME.py, registered in sys.modules under NAME: dataclasses look
    their module up there."""
    if str(BENCH) not in sys.path:  # as when run as a script: its siblings (vb_source, ...) import by name
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
