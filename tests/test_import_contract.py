"""engine_ctl and presets must never import Textual or Rich.

Checked in a fresh interpreter (within pytest other tests may already have
imported textual), importing every module of both packages.
"""

import importlib
import pkgutil
import subprocess
import sys

import pytest


def _modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return [package, *(f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__))]


@pytest.mark.parametrize("package", ["ernie_tui.engine_ctl", "ernie_tui.presets"])
def test_no_textual_or_rich(package):
    modules = _modules(package)
    assert len(modules) > 2
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{package} pulled in: {out.stdout.strip()}"
