#!/usr/bin/env bash
# The whole test suite: sets up ./.venv if needed, then runs pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not vllm and not tmux"`
# for the fast tests alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
exec .venv/bin/python -m pytest "$@"
