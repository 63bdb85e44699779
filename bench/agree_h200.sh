#!/usr/bin/env bash
# The H200 run behind docs/lab/benchmarks/agree-vllm-bench.md "our burst against vLLM's bench
# client": one device call, after vLLM 0.26.0 was staged (/work/shared/gpu).
# Run from a folder holding src/ and bench/ (copied to .gpu9 of the carry):
#   bash .gpu9/bench/agree_h200.sh       (results in $OUT/agree-h200.tgz; AGREE_ROUNDS, default 3;
#                                        a run cut short by AGREE_DEADLINE_S keeps the rounds it finished)
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH=/root/stage/site:$HERE/src VLLM_USE_FLASHINFER_SAMPLER=0
OUT=${OUT:-/tmp/agree-out}; mkdir -p "$OUT"; W=/root/agree; mkdir -p "$W"
M=$W/m03
date -u; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m ernie_tui demo-model "$M" --shape ernie-4.5-0.3b | tail -1
# seed-A: block 16, max_model_len 4096; everything else vLLM's default.
python3 -m vllm.entrypoints.openai.api_server --model "$M" --served-model-name m03 --port 8000 \
    --block-size 16 --max-model-len 4096 > "$W/server.log" 2>&1 &
SRV=$!
for i in $(seq 1 200); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null && break
  kill -0 $SRV 2>/dev/null || break
  sleep 1
done
echo "server ready after ${i} s"; date -u
timeout $(( ${AGREE_DEADLINE_S:-560} - SECONDS )) python3 "$HERE/bench/agree_vllm_bench.py" --url http://127.0.0.1:8000 --model m03 \
    --tokenizer "$M" --concurrency ${AGREE_C:-128 256} --rate ${AGREE_RATE:-80} --rounds ${AGREE_ROUNDS:-3} --waves 8 \
    --rate-seconds ${AGREE_RATE_S:-10} --json "$W/agree-h200.json" 2>&1 | tee "$W/agree.log"
date -u
kill $SRV; wait $SRV
tar czf "$OUT/agree-h200.tgz" -C "$W" $(cd "$W" && ls agree-h200.json agree.log server.log 2>/dev/null)
ls -la "$OUT"
