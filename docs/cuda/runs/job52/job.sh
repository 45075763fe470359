#!/usr/bin/env bash
# GPU job 52 (2026-11-30, session 7): prompt processing beside llama.cpp in the same call with 2048-row prefill
# chunks (512, 4096 and 16384 prompt tokens), and the fixed argument test of job 51. llama.cpp's CUDA llama-bench is
# built outside the repository first (.peers/run_llama_cuda.sh, trimmed llama.cpp of the llama-cpp-python 0.3.36
# sdist; a short decode row), the test runs meanwhile (GPU, seconds); then, on an idle host, cider's prefill rows and
# llama-bench -p 512,4096,16384 -n 0 -fa 1 (Q8_0 weights, q8_0 KV). Carry .gpu52 and .peers.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu52/bin ] || tar -C .gpu52 -xJf .gpu52/bin.tar.xz
B=.gpu52/bin
( KV_TYPES="q8_0" DEPTHS=1024 NGEN=16 REPS=1 TOTAL_BUDGET_S=300 OUT="$OUT/llama" bash .peers/run_llama_cuda.sh > "$OUT/llama_run.log" 2>&1
  echo "llama peer rc=$? ($(( $(date +%s) - T0 )) s)" > /tmp/llama.rc ) &
timeout 60 $B/test_cuda_attention --gtest_brief=1 --gtest_filter='CudaAttention.PrefillPathEligibilityAndBadArguments' > "$OUT/test.log" 2>&1
echo "test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test.log" | tr '\n' ' ')"
wait; cat /tmp/llama.rc
for f in "prefill llama3-8b w8a8 k8v4 n512" "prefill llama3-8b w8a8 k4v3 n4096" "prefill llama3-8b w8a8 k8v4 n16384"; do
  timeout 100 $B/cuda_bench --filter "model $f" >> "$OUT/model.txt" 2>&1; echo "cider $f rc=$? ($(( $(date +%s) - T0 )) s)"
done
grep -hE "^model" "$OUT/model.txt" | grep -v "cuda-core" | cut -c1-160
BIN=/tmp/llama-peer/build-cuda/bin/llama-bench
MODEL=$(ls /dev/shm/llama3-8b-shape-q8_0-random.gguf /tmp/llama-peer/llama3-8b-shape-q8_0-random.gguf 2>/dev/null | head -1)
timeout 90 $BIN -m "$MODEL" -ngl 99 -fa 1 -ctk q8_0 -ctv q8_0 -p 512,4096,16384 -n 0 -r 3 -o json > "$OUT/llama_pp_q8_0.json" 2> "$OUT/llama_pp_q8_0.err"
echo "llama pp rc=$?"
python3 -c "import json,sys; [print('llama.cpp pp', r['n_prompt'], 'KV', r['type_k'], round(r['avg_ts'],1), '+-', round(r['stddev_ts'],1), 'tok/s') for r in json.load(open(sys.argv[1]))]" "$OUT/llama_pp_q8_0.json"
(cd "$OUT" && tar -czf logs.tgz *.log *.txt *.err 2>/dev/null; rm -f *.err *.log model.txt; rm -f llama/build.log)
echo "total $(( $(date +%s) - T0 )) s"
