#!/usr/bin/env bash
# GPU job 41 (2026-11-30, session 6): prompt processing (prefill) beside llama.cpp's CUDA build in the same call, and
# the decode rows again. cider: `cuda_bench` model prefill rows (Llama-3-8B shapes, random weights, 512 and 4096
# prompt tokens, host-timed forward) and decode rows; llama.cpp: .peers/run_llama_cuda.sh builds llama-bench outside
# the repository (trimmed source of llama-cpp-python 0.3.36's vendored llama.cpp), writes the random-weight Q8_0 GGUF,
# runs its decode rows (q8_0 KV), then llama-bench -p 512,4096 -n 0 (flash attention, q8_0 and f16 KV).
# Carry .gpu and .peers (ignored, never committed).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
# The llama.cpp build first (it loads all CPU cores; cider's rows are measured after it, on an idle host).
KV_TYPES="q8_0" TOTAL_BUDGET_S=400 OUT="$OUT/llama" bash .peers/run_llama_cuda.sh > "$OUT/llama_run.log" 2>&1
echo "llama peer rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "avg|tok/s|depth" "$OUT/llama_run.log" | tail -6
for f in "prefill llama3-8b w8a8 k8v4 n512" "prefill llama3-8b w8a8 k4v3 n4096" "prefill llama3-8b bf16 kv-bf16 n512" \
         "decode llama3-8b w8a8 k8v4 L" "decode llama3-8b w4a8 k4v3 L"; do
  timeout 120 $B/cuda_bench --filter "model $f" >> "$OUT/cider_model.txt" 2>&1; echo "cider $f rc=$? ($(( $(date +%s) - T0 )) s)"
done
grep -hE "^model" "$OUT/cider_model.txt" | grep -v "v:" | cut -c1-160
BIN=/tmp/llama-peer/build-cuda/bin/llama-bench
MODEL=$(ls /dev/shm/llama3-8b-shape-q8_0-random.gguf /tmp/llama-peer/llama3-8b-shape-q8_0-random.gguf 2>/dev/null | head -1)
for kv in q8_0 f16; do
  timeout 100 $BIN -m "$MODEL" -ngl 99 -fa 1 -ctk $kv -ctv $kv -p 512,4096 -n 0 -r 3 -o json > "$OUT/llama_pp_$kv.json" 2> "$OUT/llama_pp_$kv.err"
  echo "llama pp KV $kv rc=$?"
  python3 -c "import json,sys; [print('llama.cpp pp', r['n_prompt'], 'KV', r['type_k'], round(r['avg_ts'],1), 'tok/s') for r in json.load(open(sys.argv[1]))]" "$OUT/llama_pp_$kv.json"
done
(cd "$OUT" && tar -czf logs.tgz *.log *.txt *.err 2>/dev/null; rm -f *.err)
ls "$OUT" "$OUT/llama"
echo "total $(( $(date +%s) - T0 )) s"
