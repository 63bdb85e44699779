#!/usr/bin/env bash
# The whole test suite: sets up ./.venv if needed, runs the static checks
# (ruff, mypy on src/, import-linter's contracts; each one failing fails the
# script), then pytest. Extra arguments go to pytest, e.g.
# `scripts/test.sh -m "not vllm and not tmux"` for the fast tests alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
B=.venv/bin
"$B/ruff" check
"$B/mypy"
PYTHONPATH=src "$B/lint-imports"  # the contracts judge this tree's src/
exec "$B/python" -m pytest "$@"
