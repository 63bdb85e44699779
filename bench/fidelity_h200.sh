#!/usr/bin/env bash
# Issue #57's GPU goal on a lent H100/H200, after vLLM 0.26.0 was staged (../shared/gpu/README.md):
# seed-A fed by vLLM's own bench client (bench/traffic_fidelity.py --source vllm-bench), its window
# captured from /metrics and from the request log, each capture replayed by our client, and the
# server's output tok/s and TTFT p50 compared, source against replica, three interleaved rounds.
#   bash bench/fidelity_h200.sh start   copies src/ and bench/ to /root/fidelity/code (a later call's tree
#                                       may differ), writes the 0.3B-shape stand-in model once, starts the
#                                       job in a session of its own (it outlives the call) and waits for it
#                                       up to FID_WAIT_S (default 540) s
#   bash bench/fidelity_h200.sh wait    waits again (call it back to back: a machine goes back after 30 s idle)
# The job: seed-A's argv (`ernie-tui presets show seed-A --command`: block 16, max_model_len 4096, port 8000)
# plus --enable-log-requests --enable-prefix-caching, VLLM_LOGGING_LEVEL=DEBUG (the request log's prompt
# tokens, as on CPU); then the bench; then the server is stopped.
# Both verbs pack the bench's JSON lines, its log (the table at its end), the captured profiles and the
# server log's first and last 3000 lines into $OUT/fidelity-h200.tgz, and write and print the table of
# the rows so far ($OUT/fidelity.md: all of them once the job has ended).
# FID_ARGS: the bench's options (default below). The load: vLLM's random dataset, a 256-token prefix in every
# prompt, then 256 +- 80 % tokens (51..460), outputs 128 +- 80 % (25..230, ignore_eos), gamma arrivals of
# shape 0.5 (gap CV 1.41) at 40 req/s, 1200 requests (30 s) a step. Why 40: the same stand-in on an H100 took
# Poisson 80 req/s of similar lengths (29..301 in, 23..233 out) at TTFT p50 ~50 ms, unsaturated, and its
# capacity under TTFT p99 500 ms / ITL p99 30 ms was concurrency 104 at ~100 req/s
# (docs/lab/capacity-h200/2026-12-06-agree-and-search-h100.md). Half that rate leaves the bursts (twice the
# mean rate for seconds at a time) room below the knee, so TTFT reads the server's queueing, not a backlog.
# Expected: ~85 s to the server, ~2.3 min a round (source + 3 replicas of 30 s each, the bench client's
# start), ~9 min in all: the start call and one wait call.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/gpu_job.sh
. "$HERE/bench/gpu_job.sh"
W=/root/fidelity; mkdir -p "$W"
OUT=${OUT:-/tmp/fidelity-out}; mkdir -p "$OUT"
export PYTHONPATH=/root/stage/site:$W/code/src VLLM_USE_FLASHINFER_SAMPLER=0 ERNIE_TUI_HOME=$W/home
M=/root/rank/m03  # rank_h200.sh's and tune_h200.sh's: a warm machine writes it once
URL=http://127.0.0.1:8000
running() { [ -f "$W/job.pid" ] && kill -0 "$(cat "$W/job.pid")" 2>/dev/null; }
pack() {
  [ -f "$W/server.log" ] && { head -n 3000 "$W/server.log"; echo "[...]"; tail -n 3000 "$W/server.log"; } \
      > "$W/server-head-tail.log"
  # shellcheck disable=SC2046  # the names of what exists, split on purpose
  tar czf "$OUT/fidelity-h200.tgz" -C "$W" $(cd "$W" && ls -d job.log fidelity.jsonl fidelity.log \
      server-head-tail.log keep 2>/dev/null)
  # the table of the rows so far (all of them once the job has ended)
  [ -f "$W/fidelity.jsonl" ] && python3 "$W/code/bench/traffic_fidelity.py" --summarise "$W/fidelity.jsonl" \
      > "$OUT/fidelity.md" && cat "$OUT/fidelity.md"
}
wait_for_it() {
  job_wait "${FID_WAIT_S:-540}" "fidelity job" "$W/job.log" 3000
  echo "bench lines so far: $(grep -c '"replica"' "$W/fidelity.jsonl" 2>/dev/null || echo 0) replica rows"
}
case "${1:-}" in
start)
  if running; then echo "a fidelity job is already running"; wait_for_it; exit 0; fi
  job_prepare "$HERE" "$W" "$M"
  rm -rf "$W/keep" "$W/job.pid" "$W/fidelity.jsonl" "$W/fidelity.log" "$W/fidelity.md" "$W/server.log"
  date -u +"job started %FT%TZ"
  setsid bash "$W/code/bench/fidelity_h200.sh" job > "$W/job.log" 2>&1 < /dev/null &
  sleep 2  # (the job writes its pid first thing)
  wait_for_it;;
wait)
  wait_for_it;;
job)  # (run by start, in a session of its own)
  echo $$ > "$W/job.pid"
  mapfile -t SRV < <(python3 -m ernie_tui --model "$M" presets show seed-A --command --json \
      | python3 -c 'import json, sys; print("\n".join(json.load(sys.stdin)["argv"]))')
  [ "${#SRV[@]}" -gt 3 ] || { echo "no argv for seed-A"; exit 1; }
  echo "server: ${SRV[*]} --enable-log-requests --enable-prefix-caching"
  VLLM_LOGGING_LEVEL=DEBUG "${SRV[@]}" --enable-log-requests --enable-prefix-caching > "$W/server.log" 2>&1 &
  S=$!
  for i in $(seq 1 600); do
    python3 -c "import urllib.request as u; u.urlopen('$URL/health', timeout=2)" 2>/dev/null && break
    kill -0 "$S" 2>/dev/null || { echo "the server exited"; tail -n 40 "$W/server.log"; exit 1; }
    sleep 1
  done
  echo "server ready after ${i} s"; date -u
  # shellcheck disable=SC2086  # the option string splits on purpose
  python3 "$W/code/bench/traffic_fidelity.py" --url "$URL" --log "$W/server.log" --tokenizer "$M" \
      --source vllm-bench --keep "$W/keep" \
      ${FID_ARGS:---rounds 3 -n 1200 --seed 81 --rate 40 --shape 0.5 --vb-input-len 256 --vb-output-len 128 --vb-range-ratio 0.8 --vb-prefix-len 256} \
      > "$W/fidelity.jsonl" 2> "$W/fidelity.log"
  echo "bench exited $?"; date -u
  kill "$S"; wait "$S"
  exit 0;;
*) echo "usage: fidelity_h200.sh start|wait"; exit 2;;
esac
date -u
