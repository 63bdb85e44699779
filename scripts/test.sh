#!/usr/bin/env bash
# The whole test suite: sets up ./.venv if needed, runs the static checks
# (ruff, mypy on src/, import-linter's contracts; each one failing fails the
# script), then pytest. Extra arguments go to pytest, e.g.
# `scripts/test.sh -m "not vllm and not tmux"` for the fast tests alone.
# pytest lists its 25 slowest tests at the end (where a CI run's time went).
# pytest runs on TEST_WORKERS pytest-xdist workers (default 4; 0 runs it in
# one process, as before): the real-vLLM and tmux tests all on one of them
# (tests/conftest.py groups them, so one vLLM server runs at a time), the
# stand-in tests, which mostly wait on their pacing, on the others, slowest
# first. Four on a 2-core box: with three, the stand-in tests ended last while
# the cores sat half idle (docs/lab/benchmarks/suite-durations.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >/dev/null
B=.venv/bin
"$B/ruff" check
"$B/mypy"
PYTHONPATH=src "$B/lint-imports"  # the contracts judge this tree's src/
WORKERS=${TEST_WORKERS:-4}
if [ "$WORKERS" != 0 ] && "$B/python" -c "import xdist" >/dev/null 2>&1; then
  exec "$B/python" -m pytest -n "$WORKERS" --dist loadgroup --durations=25 "$@"
fi
exec "$B/python" -m pytest --durations=25 "$@"
