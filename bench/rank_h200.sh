#!/usr/bin/env bash
# The preset ranking on a lent H200, in at most two 10-minute device calls after
# vLLM 0.26.0 was staged (../shared/gpu/README.md): the paired capacity sweep
# (`ernie-tui sweep --capacity`'s default) of the five presets of
# docs/lab/capacity-h200/ under one SLO, every server up at once on the one GPU.
#   bash bench/rank_h200.sh start   copies src/ and bench/ to /root/rank/code (a later call's tree may
#                                   differ), writes the 0.3B-shape stand-in model once, starts the sweep
#                                   in a session of its own (it outlives the call) and waits for it up to
#                                   RANK_WAIT_S (default 540) s
#   bash bench/rank_h200.sh wait    waits again (call it back to back: a machine goes back after 30 s idle)
# Both pack what the sweep wrote (its table, JSON with the pair verdicts, the servers' logs,
# its run records) into $OUT/rank-h200.tgz and print the verdicts once it has ended.
# RANK_PRESETS: the presets (default the five); RANK_SLO: the objectives; RANK_KNEES: an earlier run's rank.json
# (--knees-from: each search starts at that run's knee, two levels a preset where it holds); RANK_ARGS: more sweep options
# (default --start-concurrency 64 --max-concurrency 1024 --repeat 3 --confirm-waves 0 --level-time 30
# --tolerance 0.25: round 0's searches only pick each preset's duel load, the highest level that passed, which a
# confirmation does not change and a bracket of 25 % places well enough; the 21st run's round 0 had not ended
# after 12.5 min with confirmations, 60 s levels and 10 %: 12-17 levels a preset, 6 at 25 %).
# The servers start at once, each KV pool pinned (kv_cache_memory_bytes) at its share of the GPU.
# Two runs' verdicts, pair by pair (the same machine later, or a second one):
#   python bench/compare_rankings.py first/rank.json second/rank.json
# Draw it here (the GPU image has no matplotlib): ernie-tui report rank.json --out rank.html
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/gpu_job.sh
. "$HERE/bench/gpu_job.sh"
W=/root/rank; mkdir -p "$W"
OUT=${OUT:-/tmp/rank-out}; mkdir -p "$OUT"
export PYTHONPATH=/root/stage/site:$W/code/src VLLM_USE_FLASHINFER_SAMPLER=0 ERNIE_TUI_HOME=$W/home
M=$W/m03
running() { pgrep -f 'ernie_tui --presets' > /dev/null; }
pack() {
  tar czf "$OUT/rank-h200.tgz" -C "$W" $(cd "$W" && ls rank.* 2>/dev/null) logs home 2>/dev/null
  cp "$W"/rank.md "$OUT/" 2>/dev/null
}
wait_for_it() { job_wait "${RANK_WAIT_S:-540}" sweep "$W/rank.log" 4000; }
case "${1:-}" in
start)
  if running; then echo "a sweep is already running"; wait_for_it; exit 0; fi
  job_prepare "$HERE" "$W" "$M"
  KNEES=(); [ -n "${RANK_KNEES:-}" ] && KNEES=(--knees-from "$(realpath "$RANK_KNEES")")
  date -u +"sweep started %FT%TZ"
  # shellcheck disable=SC2086  # the option strings split on purpose
  setsid python3 -m ernie_tui --presets "$W/code/bench/presets-h200.toml" --model "$M" sweep \
      ${RANK_PRESETS:-seed-A seed-C long-doc seed-A-seqs128 seed-A-batch16k} --capacity \
      ${RANK_SLO:---slo ttft_p99=1000ms --slo itl_p99=50ms} \
      ${RANK_ARGS:---start-concurrency 64 --max-concurrency 1024 --repeat 3 --confirm-waves 0 --level-time 30 --tolerance 0.25} \
      "${KNEES[@]}" --log-dir "$W/logs" --out "$W/rank.md" --out "$W/rank.json" \
      > "$W/rank.log" 2>&1 < /dev/null &
  sleep 2
  wait_for_it;;
wait)
  wait_for_it;;
*) echo "usage: rank_h200.sh start|wait"; exit 2;;
esac
date -u
