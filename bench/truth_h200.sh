#!/usr/bin/env bash
# The H200 run behind docs/lab/capacity-h200/2026-12-01-run01.md "the search against the bench
# client's bracket": device calls on one warm machine, after vLLM 0.26.0 was
# staged (/work/shared/gpu). Run from a folder holding src/ and bench/ (copied
# to .gpu9 of the carry):
#   bash .gpu9/bench/truth_h200.sh start     a seed-A server in a session of its own (outlives the call)
#   bash .gpu9/bench/truth_h200.sh restart   stops that server and starts it again (TRUTH_SERVER_ARGS: more flags;
#                                            TRUTH_API_SERVERS=N: `vllm serve --api-server-count N`; start takes both)
#   bash .gpu9/bench/truth_h200.sh drift     vLLM's bench client alone, run after run at DRIFT_C for DRIFT_S seconds
#                                            from now (bench/server_drift.py): does the server's speed move with age?
#   bash .gpu9/bench/truth_h200.sh pindrift  drift in phases of DRIFT_PHASE_S (default 150) s at DRIFT_C, PIN_PHASES
#                                            (default "u p u"): u, every server thread free to run anywhere; p, its
#                                            engine core and API server pinned to physical cores of their own and the
#                                            bench client kept off them (bench/pin_server.py). Does the wander come
#                                            from where the kernel puts the busy threads?
#   bash .gpu9/bench/truth_h200.sh bracket   the bench client at each TRUTH_C level and TRUTH_R rate (TRUTH_ROUNDS
#                                            rounds of TRUTH_WAVES (default 8) x C requests a run, each split over
#                                            TRUTH_BENCH_PROCS (default 1) bench clients; TRUTH_ONLY: one
#                                            mode, into bracket-MODE.json; a search joins every bracket*.json)
#   bash .gpu9/bench/truth_h200.sh search    TRUTH_SEARCHES of our searches against that bracket (TRUTH_ONLY:
#                                            concurrency or rate alone); packs everything into $OUT/truth-h200.tgz
#                                            and stops the server when TRUTH_STOP=1
#   bash .gpu9/bench/truth_h200.sh interleave  TRUTH_ONLY's mode: bench-client rounds (TRUTH_ROUNDS, one run at each
#                                            TRUTH_C or TRUTH_R level) alternating with TRUTH_SEARCHES of our searches
#                                            (TRUTH_ALTERNATE='--resolution 0': every second search adds those options),
#                                            round first; each call's il-MODE-N.json joins the earlier calls' (judge
#                                            them all with capacity_truth.py --judge-only)
#                                            TRUTH_DEADLINE_S's SIGTERM ends a running search's level (up to
#                                            ~30 s more: give the device call that margin); its levels are kept,
#                                            marked cut_short, unjudged
#   bash .gpu9/bench/truth_h200.sh ilbg      the same, detached (it outlives the call); then
#   bash .gpu9/bench/truth_h200.sh ilwait    waits up to TRUTH_WAIT_S (default 540) for it, then packs (back to back)
#   bash .gpu9/bench/truth_h200.sh agree     our burst against the bench client (bench/agree_vllm_bench.py) at
#                                            AGREE_C concurrencies and AGREE_R rates, AGREE_ROUNDS rounds
#                                            (AGREE_RATE_SECONDS: each rate run's length, default 10;
#                                            AGREE_WAVES: requests per concurrency run / C, default 8;
#                                            AGREE_VARIANT='NAME=PROBE ARGS': a third arm; AGREE_WARMUP=1:
#                                            --warmup-run); each call writes agree-N.json/.log
#   bash .gpu9/bench/truth_h200.sh stop      stops the server and packs everything
#   bash .gpu9/bench/truth_h200.sh sweep     starts, in the background (it outlives the call), the product's own
#                                            capacity sweep of SWEEP_PRESETS (default: the five of
#                                            docs/lab/capacity-h200/) on GPU 0, one server per trial, SWEEP_REPEAT
#                                            rounds, default search flags but SWEEP_ARGS (default
#                                            --start-concurrency 16 --max-concurrency 1024: at 256, the default
#                                            ceiling then, long-doc's search once passed every level, a lower bound)
#   bash .gpu9/bench/truth_h200.sh sweepwait waits up to SWEEP_WAIT_S (default 540) for that sweep, then packs
#                                            its output, logs and run records (call it back to back)
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=/root/stage/site:$HERE/src VLLM_USE_FLASHINFER_SAMPLER=0
export XDG_DATA_HOME=/root/truth/data  # our searches' run records
OUT=${OUT:-/tmp/truth-out}; mkdir -p "$OUT"; W=/root/truth; mkdir -p "$W"
M=$W/m03
SLO=(--slo ttft_p99=1000ms --slo itl_p99=50ms)
pack() {  # everything the run wrote, into $OUT/truth-h200.tgz (extra paths: $@)
  tar czf "$OUT/truth-h200.tgz" -C "$W" $(cd "$W" && ls *.json *.jsonl *.log *.md 2>/dev/null) \
      $([ -d "$W/data" ] && echo data) "$@"
}
start_server() {
  # seed-A: block 16, max_model_len 4096; everything else vLLM's default. TRUTH_API_SERVERS=N: `vllm serve`
  # (its CLI module: the staged vLLM has no console script) with --api-server-count N, which only it runs.
  if [ -n "${TRUTH_API_SERVERS:-}" ]; then
    LAUNCH=(-m vllm.entrypoints.cli.main serve "$M" --api-server-count "$TRUTH_API_SERVERS")
  else
    LAUNCH=(-m vllm.entrypoints.openai.api_server --model "$M")
  fi
  N=1; while [ -f "$W/server-$N.log" ]; do N=$((N + 1)); done
  echo "server-$N: ${LAUNCH[*]} ${TRUTH_SERVER_ARGS:-}" | tee -a "$W/servers.txt"
  setsid python3 "${LAUNCH[@]}" --served-model-name m03 --port 8000 \
      --block-size 16 --max-model-len 4096 ${TRUTH_SERVER_ARGS:-} > "$W/server-$N.log" 2>&1 < /dev/null &
  SRV=$!
  echo $SRV > "$W/server.pid"
  for i in $(seq 1 240); do
    # A server that died (vLLM not staged: one call waited out 240 s for it) ends the wait.
    kill -0 "$SRV" 2> /dev/null || { echo "the server exited after ${i} s:"; tail -n 5 "$W/server-$N.log"; exit 1; }
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null && break
    sleep 1
  done
  date +%s.%N > "$W/ready_at"
  echo "server ready after ${i} s"
}
stop_server() {  # the whole session setsid gave it (API servers, engine core, workers)
  [ -f "$W/server.pid" ] || return 0
  kill -INT -- -"$(cat "$W/server.pid")" 2> /dev/null
  for i in $(seq 1 30); do kill -0 "$(cat "$W/server.pid")" 2> /dev/null || break; sleep 1; done
  kill -KILL -- -"$(cat "$W/server.pid")" 2> /dev/null
  sleep 2
  rm -f "$W/server.pid"
}
drift_run() {  # SECONDS [server_drift.py flags]: one drift-N.json/.log
  local S=$1; shift
  N=1; while [ -f "$W/drift-$N.json" ]; do N=$((N + 1)); done
  echo "drift-$N: $S s $*" | tee -a "$W/servers.txt"
  timeout $(( S + 120 )) python3 "$HERE/bench/server_drift.py" --url http://127.0.0.1:8000 --model m03 \
      --tokenizer "$M" --concurrency ${DRIFT_C:-128 256} --seconds "$S" \
      --ready-at "$(cat "$W/ready_at")" --json "$W/drift-$N.json" "$@" 2>&1 | tee "$W/drift-$N.log"
}
date -u
case "${1:-}" in
start)
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  echo "open files: soft $(ulimit -Sn), hard $(ulimit -Hn)"
  # The chip's own state every 5 s (packed with the rest as gpu.log) ... the thirteenth run's server
  # rose from 16 k to 26.5 k generated tok/s within ten minutes with nothing changed on our side.
  # An earlier start's samplers (a call whose server never came up) would write into the same files.
  [ -f "$W/samplers.pid" ] && kill $(cat "$W/samplers.pid") 2> /dev/null
  rm -f "$W/box.jsonl"
  setsid nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
      --format=csv -l 5 > "$W/gpu.log" 2>&1 < /dev/null &
  echo $! > "$W/samplers.pid"
  setsid bash -c 'while sleep 5; do date -u +%T; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; done' \
      > "$W/gpu-apps.log" 2>&1 < /dev/null &
  echo $! >> "$W/samplers.pid"
  # ... and the host's: CPU busy and steal shares, and which processes used the CPUs (box.jsonl).
  setsid python3 "$HERE/bench/box_sampler.py" --every 5 --out "$W/box.jsonl" > /dev/null 2>&1 < /dev/null &
  echo $! >> "$W/samplers.pid"
  # ... and each CPU's speed (a timed loop on each), and where the server's busy threads ran (cpu.jsonl)
  rm -f "$W/cpu.jsonl"
  setsid python3 "$HERE/bench/cpu_watch.py" --every 2 --probe --out "$W/cpu.jsonl" > "$W/cpu_watch.err" 2>&1 < /dev/null &
  echo $! >> "$W/samplers.pid"
  python3 -m ernie_tui demo-model "$M" --shape ernie-4.5-0.3b | tail -1
  start_server;;
restart)
  # the same model under other server flags (TRUTH_SERVER_ARGS, TRUTH_API_SERVERS), samplers left running
  stop_server
  start_server;;
drift)
  # vLLM's bench client alone, run after run at DRIFT_C (default 128 256) for DRIFT_S s (default 420):
  # does this server's speed move with its age (bench/server_drift.py)?
  drift_run "${DRIFT_S:-420}"
  pack;;
pindrift)
  # the same in phases of DRIFT_PHASE_S s, PIN_PHASES (default "u p u"; u: as started, p: pinned):
  # is the wander where the kernel puts the busy threads?
  PH=${DRIFT_PHASE_S:-150}
  for phase in ${PIN_PHASES:-u p u}; do
    if [ "$phase" = p ]; then
      python3 "$HERE/bench/pin_server.py" --auto | tee -a "$W/pin.log"
      CL=$(tail -n 1 "$W/pin.log" | python3 -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["clients"])))')
      drift_run "$PH" --cpus "$CL"
    else
      python3 "$HERE/bench/pin_server.py" --unpin | tee -a "$W/pin.log"
      drift_run "$PH"
    fi
  done
  pack;;
bracket)
  timeout ${TRUTH_DEADLINE_S:-560} python3 "$HERE/bench/capacity_truth.py" --url http://127.0.0.1:8000 --model m03 --bench-procs "${TRUTH_BENCH_PROCS:-1}" \
      --tokenizer "$M" "${SLO[@]}" --concurrency ${TRUTH_C:-128 160 192 256} --rate ${TRUTH_R:-} \
      --rate-seconds ${TRUTH_RATE_SECONDS:-10} --rounds ${TRUTH_ROUNDS:-1} --waves ${TRUTH_WAVES:-8} \
      ${TRUTH_ONLY:+--only $TRUTH_ONLY} --searches 0 --json "$W/bracket${TRUTH_ONLY:+-$TRUTH_ONLY}.json" 2>&1 \
      | tee "$W/bracket${TRUTH_ONLY:+-$TRUTH_ONLY}.log"
  pack;;
agree)
  N=1; while [ -f "$W/agree-$N.json" ] || [ -f "$W/agree-$N.log" ]; do N=$((N + 1)); done
  EXTRA=(); [ -n "${AGREE_VARIANT:-}" ] && EXTRA+=(--variant "$AGREE_VARIANT")
  [ "${AGREE_WARMUP:-0}" = 1 ] && EXTRA+=(--warmup-run)
  timeout ${TRUTH_DEADLINE_S:-560} python3 "$HERE/bench/agree_vllm_bench.py" --url http://127.0.0.1:8000 --model m03 \
      --tokenizer "$M" --concurrency ${AGREE_C-128 256} --rate ${AGREE_R-80} --rounds ${AGREE_ROUNDS:-3} \
      --waves ${AGREE_WAVES:-8} --rate-seconds ${AGREE_RATE_SECONDS:-10} "${EXTRA[@]}" --json "$W/agree-$N.json" \
      2>&1 | tee "$W/agree-$N.log"
  # data: the searches' run records (a search and an agree in one call once lost them)
  pack;;
interleave)
  MODE=${TRUTH_ONLY:?interleave takes one mode: TRUTH_ONLY=concurrency or rate}
  FROM=(); N=1; for f in "$W"/il-$MODE-*.json; do [ -f "$f" ] && { FROM+=(--bracket-from "$f"); N=$((N + 1)); }; done
  LEVELS=(--concurrency ${TRUTH_C:-}); [ "$MODE" = rate ] && LEVELS=(--rate ${TRUTH_R:-})
  timeout ${TRUTH_DEADLINE_S:-560} python3 "$HERE/bench/capacity_truth.py" --url http://127.0.0.1:8000 --model m03 --bench-procs "${TRUTH_BENCH_PROCS:-1}" \
      --tokenizer "$M" "${SLO[@]}" "${LEVELS[@]}" --rate-seconds ${TRUTH_RATE_SECONDS:-10} \
      --rounds ${TRUTH_ROUNDS:-1} --waves ${TRUTH_WAVES:-8} --searches ${TRUTH_SEARCHES:-1} --only "$MODE" --interleave "${FROM[@]}" ${TRUTH_ALTERNATE:+--alternate "$TRUTH_ALTERNATE"} \
      --timeout 500 --keep-records --json "$W/il-$MODE-$N.json" \
      -- ${TRUTH_SEARCH_ARGS:---start-concurrency 16} 2>&1 | tee "$W/il-$MODE-$N.log"
  pack;;
ilbg)
  # interleave, detached (it outlives the call, as a sweep does); ilwait waits for it
  MODE=${TRUTH_ONLY:?ilbg takes one mode: TRUTH_ONLY=concurrency or rate}
  FROM=(); N=1; for f in "$W"/il-$MODE-*.json; do [ -f "$f" ] && { FROM+=(--bracket-from "$f"); N=$((N + 1)); }; done
  LEVELS=(--concurrency ${TRUTH_C:-}); [ "$MODE" = rate ] && LEVELS=(--rate ${TRUTH_R:-})
  setsid python3 "$HERE/bench/capacity_truth.py" --url http://127.0.0.1:8000 --model m03 --bench-procs "${TRUTH_BENCH_PROCS:-1}" \
      --tokenizer "$M" "${SLO[@]}" "${LEVELS[@]}" --rate-seconds ${TRUTH_RATE_SECONDS:-10} \
      --rounds ${TRUTH_ROUNDS:-1} --waves ${TRUTH_WAVES:-8} --searches ${TRUTH_SEARCHES:-1} --only "$MODE" --interleave "${FROM[@]}" ${TRUTH_ALTERNATE:+--alternate "$TRUTH_ALTERNATE"} \
      --timeout 500 --keep-records --json "$W/il-$MODE-$N.json" \
      -- ${TRUTH_SEARCH_ARGS:---start-concurrency 16} > "$W/il-$MODE-$N.log" 2>&1 < /dev/null &
  echo $! > "$W/il.pid"
  echo "interleave started: il-$MODE-$N";;
ilwait)
  # By its pid: `pgrep -f` on the script's name also matched the device call's own command line
  # (when it named the script, e.g. in a pkill after the wait), and waited out every second given.
  PID=$(cat "$W/il.pid")
  for i in $(seq 1 ${TRUTH_WAIT_S:-540}); do kill -0 "$PID" 2> /dev/null || break; sleep 1; done
  kill -0 "$PID" 2> /dev/null && echo "interleave still running after ${i} s" || echo "interleave done after ${i} s"
  tail -n 40 "$(ls -t "$W"/il-*.log | head -1)"
  pack;;
stop)
  stop_server
  pack;;
search)
  # A bracket measured on an earlier machine (same server flags) can be carried in TRUTH_BRACKET.
  [ -n "${TRUTH_BRACKET:-}" ] && [ ! -f "$W/bracket.json" ] && cp "$TRUTH_BRACKET" "$W/bracket.json"
  TAG=${TRUTH_TAG:-truth}
  FROM=(); for f in "$W"/bracket*.json; do [ -f "$f" ] && FROM+=(--bracket-from "$f"); done
  # Without a bracket the script has no levels to search at (it once ran nothing, silently).
  [ ${#FROM[@]} -eq 0 ] && { echo "no $W/bracket*.json: run bracket first, or interleave"; exit 1; }
  timeout ${TRUTH_DEADLINE_S:-540} python3 "$HERE/bench/capacity_truth.py" --url http://127.0.0.1:8000 --model m03 --bench-procs "${TRUTH_BENCH_PROCS:-1}" \
      --tokenizer "$M" "${SLO[@]}" "${FROM[@]}" --searches ${TRUTH_SEARCHES:-2} \
      ${TRUTH_ONLY:+--only $TRUTH_ONLY} --timeout 500 \
      --keep-records --json "$W/$TAG.json" -- ${TRUTH_SEARCH_ARGS:---start-concurrency 16} 2>&1 | tee "$W/$TAG.log"
  [ "${TRUTH_STOP:-0}" = 1 ] && stop_server
  pack;;
sweep)
  python3 -m ernie_tui demo-model "$M" --shape ernie-4.5-0.3b | tail -1
  mkdir -p "$W/sweep-logs"
  setsid python3 -m ernie_tui --presets "$HERE/bench/presets-h200.toml" --model "$M" sweep \
      ${SWEEP_PRESETS:-seed-A seed-C long-doc seed-A-seqs128 seed-A-batch16k} --capacity "${SLO[@]}" \
      ${SWEEP_ARGS:---start-concurrency 16 --max-concurrency 1024} --repeat ${SWEEP_REPEAT:-1} --gpus 0 \
      --gpus-per-trial 1 \
      --log-dir "$W/sweep-logs" --out "$W/sweep.md" --out "$W/sweep.json" > "$W/sweep.log" 2>&1 < /dev/null &
  echo "sweep started";;
sweepwait)
  for i in $(seq 1 ${SWEEP_WAIT_S:-540}); do pgrep -f 'ernie_tui --presets' > /dev/null || break; sleep 1; done
  pgrep -f 'ernie_tui --presets' > /dev/null && echo "sweep still running after ${i} s" || echo "sweep done"
  tail -c 3000 "$W/sweep.log"
  pack sweep-logs;;
*) echo "usage: truth_h200.sh start|restart|drift|pindrift|bracket|interleave|ilbg|ilwait|search|agree|stop|sweep|sweepwait"
   exit 2;;
esac
date -u
