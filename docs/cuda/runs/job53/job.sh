#!/usr/bin/env bash
# GPU job 53 (2026-11-30, session 7): job 52's llama.cpp build resumed on the still-held machine, then
# llama-bench -p 512,4096,16384 -n 0 -fa 1 (Q8_0, q8_0 KV) and cider's 4096- and 16384-token prefill rows (as long as
# the call's time lasts). Carry .gpu52 and .peers.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu52/bin ] || tar -C .gpu52 -xJf .gpu52/bin.tar.xz
B=.gpu52/bin
KV_TYPES="q8_0" DEPTHS=1024 NGEN=16 REPS=1 TOTAL_BUDGET_S=200 OUT="$OUT/llama" bash .peers/run_llama_cuda.sh > "$OUT/llama_run.log" 2>&1
echo "llama peer rc=$? ($(( $(date +%s) - T0 )) s)"; tail -2 "$OUT/llama_run.log"
BIN=/tmp/llama-peer/build-cuda/bin/llama-bench
MODEL=$(ls /dev/shm/llama3-8b-shape-q8_0-random.gguf /tmp/llama-peer/llama3-8b-shape-q8_0-random.gguf 2>/dev/null | head -1)
timeout 40 $BIN -m "$MODEL" -ngl 99 -fa 1 -ctk q8_0 -ctv q8_0 -p 512,4096,16384 -n 0 -r 3 -o json > "$OUT/llama_pp_q8_0.json" 2> "$OUT/llama_pp_q8_0.err"
echo "llama pp rc=$? ($(( $(date +%s) - T0 )) s)"
python3 -c "import json,sys; [print('llama.cpp pp', r['n_prompt'], 'KV', r['type_k'], round(r['avg_ts'],1), '+-', round(r['stddev_ts'],1), 'tok/s') for r in json.load(open(sys.argv[1]))]" "$OUT/llama_pp_q8_0.json"
timeout 25 $B/cuda_bench --filter "model prefill llama3-8b w8a8 k4v3 n4096" > "$OUT/model.txt" 2>&1
timeout 25 $B/cuda_bench --filter "model prefill llama3-8b w8a8 k8v4 n16384" >> "$OUT/model.txt" 2>&1
grep -hE "^model" "$OUT/model.txt" | cut -c1-160
(cd "$OUT" && tar -czf logs.tgz *.log *.txt *.err 2>/dev/null; rm -f *.err model.txt; rm -f llama/build.log)
echo "total $(( $(date +%s) - T0 )) s"
