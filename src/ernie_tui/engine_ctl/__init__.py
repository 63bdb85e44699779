"""Everything that talks to vLLM: process control, log tailing and parsing,
/metrics, GPU sampling, probes, preflight and diagnosis.

This package must never import Textual or Rich (tests/test_import_contract.py
checks it in a fresh interpreter), so that it can run headless in scripts,
benchmarks and CI.
"""

import importlib.abc
import sys


class _SkipHttpxCli(importlib.abc.MetaPathFinder):
    """httpx's package __init__ tries to import its optional command-line
    module (`httpx._main`), which imports rich, click and pygments whenever
    they are installed, as they are beside Textual. We never use that CLI;
    refusing that one module makes httpx fall back to its own stub `main`
    (it catches the ImportError), and keeps a headless engine_ctl free of
    terminal-UI libraries."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "httpx._main":
            raise ImportError("httpx's CLI is not used by ernie_tui.engine_ctl")
        return None


if "httpx" not in sys.modules:
    _finder = _SkipHttpxCli()
    sys.meta_path.insert(0, _finder)
    try:
        import httpx  # noqa: F401
    finally:
        sys.meta_path.remove(_finder)
