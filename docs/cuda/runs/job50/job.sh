#!/usr/bin/env bash
# GPU job 50 (2026-11-30, session 7): prompt processing beside llama.cpp in the same call, after the f16 prefill
# attention (job 49's llama.cpp build ran out of time while the tests shared the CPU). First llama.cpp's CUDA
# llama-bench is built outside the repository (.peers/run_llama_cuda.sh: trimmed llama.cpp of the llama-cpp-python
# 0.3.36 sdist; random-weight Llama-3-8B-shape Q8_0 GGUF; its decode row at depth 1024 with q8_0 KV), then, on an
# idle host, cider's model prefill rows and llama-bench -p 512,4096 -n 0 (flash attention, q8_0 KV). Carry .gpu, .peers.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
KV_TYPES="q8_0" DEPTHS=1024 TOTAL_BUDGET_S=380 OUT="$OUT/llama" bash .peers/run_llama_cuda.sh > "$OUT/llama_run.log" 2>&1
echo "llama peer rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "avg|tok/s|depth" "$OUT/llama_run.log" | tail -3
for f in "prefill llama3-8b w8a8 k8v4 n512" "prefill llama3-8b w8a8 k4v3 n4096"; do
  timeout 100 $B/cuda_bench --filter "model $f" >> "$OUT/model.txt" 2>&1; echo "cider $f rc=$? ($(( $(date +%s) - T0 )) s)"
done
grep -hE "^model" "$OUT/model.txt" | grep -v cuda-core | cut -c1-160
BIN=/tmp/llama-peer/build-cuda/bin/llama-bench
MODEL=$(ls /dev/shm/llama3-8b-shape-q8_0-random.gguf /tmp/llama-peer/llama3-8b-shape-q8_0-random.gguf 2>/dev/null | head -1)
timeout 100 $BIN -m "$MODEL" -ngl 99 -fa 1 -ctk q8_0 -ctv q8_0 -p 512,4096 -n 0 -r 3 -o json > "$OUT/llama_pp_q8_0.json" 2> "$OUT/llama_pp_q8_0.err"
echo "llama pp rc=$?"
python3 -c "import json,sys; [print('llama.cpp pp', r['n_prompt'], 'KV', r['type_k'], round(r['avg_ts'],1), '+-', round(r['stddev_ts'],1), 'tok/s') for r in json.load(open(sys.argv[1]))]" "$OUT/llama_pp_q8_0.json"
(cd "$OUT" && tar -czf logs.tgz *.log *.txt *.err 2>/dev/null; rm -f *.err model.txt; rm -f llama/build.log)
ls "$OUT" "$OUT/llama"
echo "total $(( $(date +%s) - T0 )) s"
