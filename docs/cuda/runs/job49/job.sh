#!/usr/bin/env bash
# GPU job 49 (2026-11-30, session 7): the final tree of the f16 prefill attention work. Every CUDA test program, and
# in parallel llama.cpp's CUDA llama-bench built outside the repository (.peers/run_llama_cuda.sh, trimmed llama.cpp
# of the llama-cpp-python 0.3.36 sdist; its decode rows with q8_0 KV); then, on an idle host, compute-sanitizer on the
# f16 prefill test, the prefill attention rows with the PyTorch SDPA peer, cider's model prefill rows and
# llama-bench -p 512,4096 -n 0 (Q8_0 weights, q8_0 KV, flash attention) in the same call. Carry .gpu and .peers.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
( KV_TYPES="q8_0" TOTAL_BUDGET_S=330 OUT="$OUT/llama" bash .peers/run_llama_cuda.sh > "$OUT/llama_run.log" 2>&1
  echo "llama peer rc=$? ($(( $(date +%s) - T0 )) s)" > /tmp/llama.rc ) &
for t in $B/test_cuda_*; do
  n=$(basename $t)
  ( timeout 300 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/llama.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
grep -E "avg|tok/s|depth" "$OUT/llama_run.log" | tail -4
echo "== sanitizer ($(( $(date +%s) - T0 )) s)"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  timeout 100 $SAN --tool $tool $B/test_cuda_attention --gtest_brief=1 --gtest_filter='CudaAttention.PrefillF16KernelSmall' > "$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 150 $B/cuda_bench --json "$OUT/attn.json" --filter "attention prefill" > "$OUT/attn.txt" 2>&1; echo "rc=$?"
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/attn_prefill_peer.py > "$OUT/attn_prefill_peer.txt" 2>&1; echo "peer rc=$?"
python3 tools/gpu/compare.py "$OUT/attn.json" "$OUT/attn_prefill_peer.json" > "$OUT/compare.txt" 2>&1; grep -E "prefill" "$OUT/compare.txt" | grep -v "CUDA-core\|compact" | cut -c1-150
echo "== model ($(( $(date +%s) - T0 )) s)"
for f in "prefill llama3-8b w8a8 k8v4 n512" "prefill llama3-8b w8a8 k4v3 n4096"; do
  timeout 100 $B/cuda_bench --filter "model $f" >> "$OUT/model.txt" 2>&1; echo "rc=$?"
done
grep -hE "^model" "$OUT/model.txt" | cut -c1-160
echo "== llama.cpp prompt processing ($(( $(date +%s) - T0 )) s)"
BIN=/tmp/llama-peer/build-cuda/bin/llama-bench
MODEL=$(ls /dev/shm/llama3-8b-shape-q8_0-random.gguf /tmp/llama-peer/llama3-8b-shape-q8_0-random.gguf 2>/dev/null | head -1)
timeout 100 $BIN -m "$MODEL" -ngl 99 -fa 1 -ctk q8_0 -ctv q8_0 -p 512,4096 -n 0 -r 3 -o json > "$OUT/llama_pp_q8_0.json" 2> "$OUT/llama_pp_q8_0.err"
echo "llama pp rc=$?"
python3 -c "import json,sys; [print('llama.cpp pp', r['n_prompt'], 'KV', r['type_k'], round(r['avg_ts'],1), '±', round(r['stddev_ts'],1), 'tok/s') for r in json.load(open(sys.argv[1]))]" "$OUT/llama_pp_q8_0.json"
(cd "$OUT" && tar -czf logs.tgz *.log *.txt *.err 2>/dev/null; rm -f *.log *.err attn.txt model.txt attn_prefill_peer.txt)
ls "$OUT" "$OUT/llama"
echo "total $(( $(date +%s) - T0 )) s"
