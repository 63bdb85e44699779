# Sourced by the GPU bench scripts that start a long ernie-tui job in a session of its own and wait
# for it across device calls (rank_h200.sh, tune_h200.sh). The sourcing script defines running()
# (is its job still there) and pack() (what to bring back under $OUT).

# job_prepare HERE W M: a fresh copy of HERE's src/ and bench/ under W/code (a later call's tree may
# differ), the 0.3B-shape stand-in model at M once, W/logs; says which GPU and host it runs on.
job_prepare() {
  rm -rf "$2/code" && mkdir -p "$2/code" && cp -r "$1/src" "$1/bench" "$2/code/"
  [ -f "$3/config.json" ] || python3 -m ernie_tui demo-model "$3" --shape ernie-4.5-0.3b | tail -1
  mkdir -p "$2/logs"
  nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv,noheader
  echo "host $(hostname)"
}

# job_wait SECONDS WHAT LOG TAIL_BYTES: wait up to SECONDS while running(), say whether the WHAT has
# ended, show LOG's last TAIL_BYTES and the GPU's memory, then pack().
job_wait() {
  local i
  for i in $(seq 1 "$1"); do running || break; sleep 1; done
  if running; then echo "the $2 is still running after ${i} s"; else echo "the $2 has ended"; fi
  tail -c "$4" "$3"
  nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu --format=csv,noheader
  pack
}
