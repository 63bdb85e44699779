"""engine_ctl and presets must never import Textual or Rich.

Checked in a fresh interpreter, because within pytest other tests may already
have imported textual into sys.modules.
"""

import subprocess
import sys

import pytest

import ernie_tui.engine_ctl as engine_ctl_pkg
import pkgutil


def _engine_modules() -> list[str]:
    return [f"ernie_tui.engine_ctl.{m.name}" for m in pkgutil.iter_modules(engine_ctl_pkg.__path__)]


@pytest.mark.parametrize("package", ["ernie_tui.engine_ctl", "ernie_tui.presets"])
def test_no_textual_or_rich(package):
    modules = [package, *(_engine_modules() if package.endswith("engine_ctl") else
                          ["ernie_tui.presets.loader", "ernie_tui.presets.model"])]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'rich'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{package} pulled in: {out.stdout.strip()}"
