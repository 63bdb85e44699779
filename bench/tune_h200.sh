#!/usr/bin/env bash
# `ernie-tui tune` on a lent GPU, in at most three 10-minute device calls after vLLM 0.26.0 was
# staged (../shared/gpu/README.md): seed-A (bench/presets-h200.toml's model, the 0.3B-shape
# stand-in) over max_num_seqs x max_num_batched_tokens (bench/tune-space-h200.toml, the 5 x 5 grid
# of vLLM's auto_tune.sh), under the SLO of the ranking runs, the best then confirmed against
# seed-A paired (both servers at once on the one GPU, their levels taking turns).
#   bash bench/tune_h200.sh start   copies src/ and bench/ to /root/tune/code, writes the model once,
#                                   starts the tune in a session of its own (it outlives the call)
#                                   and waits for it up to TUNE_WAIT_S (default 540) s
#   bash bench/tune_h200.sh wait    waits again (back to back: a machine goes back after 30 s idle)
# Both pack the tune's log, the servers' logs and ERNIE_TUI_HOME (the study's journal, the run
# record, the tuned preset) into $OUT/tune-h200.tgz.
# TUNE_SLO: the objectives; TUNE_ARGS: the budget and the search's options (default: 4 measured
# trials within 17 min, 2 paired confirmation rounds, the ranking's round-0 search: levels of 30 s
# from 64 streams, no confirmation waves, a 25 % bracket).
# Draw it here (the GPU image has no matplotlib): ernie-tui report RUN --out tune.html, with
# ERNIE_TUI_HOME pointing at the unpacked home.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/gpu_job.sh
. "$HERE/bench/gpu_job.sh"
W=/root/tune; mkdir -p "$W"
OUT=${OUT:-/tmp/tune-out}; mkdir -p "$OUT"
export PYTHONPATH=/root/stage/site:$W/code/src VLLM_USE_FLASHINFER_SAMPLER=0 ERNIE_TUI_HOME=$W/home
M=/root/rank/m03
running() { pgrep -f 'ernie_tui --presets .* tune ' > /dev/null; }
pack() {
  tar czf "$OUT/tune-h200.tgz" -C "$W" tune.log logs home 2>/dev/null
}
wait_for_it() { job_wait "${TUNE_WAIT_S:-540}" tune "$W/tune.log" 5000; }
case "${1:-}" in
start)
  if running; then echo "a tune is already running"; wait_for_it; exit 0; fi
  job_prepare "$HERE" "$W" "$M"
  date -u +"tune started %FT%TZ"
  # shellcheck disable=SC2086  # the option strings split on purpose
  setsid python3 -m ernie_tui --presets "$W/code/bench/presets-h200.toml" --model "$M" tune seed-A \
      --space "$W/code/bench/tune-space-h200.toml" \
      ${TUNE_SLO:---slo ttft_p99=1000ms --slo itl_p99=50ms} \
      ${TUNE_ARGS:---trials 4 --budget 17m --confirm 2 --start-concurrency 64 --max-concurrency 1024 --confirm-waves 0 --level-time 30 --tolerance 0.25} \
      --log-dir "$W/logs" > "$W/tune.log" 2>&1 < /dev/null &
  sleep 2
  wait_for_it;;
wait)
  wait_for_it;;
*) echo "usage: tune_h200.sh start|wait"; exit 2;;
esac
date -u
