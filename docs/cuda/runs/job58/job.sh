#!/usr/bin/env bash
# GPU job 58 (2026-11-30, session 8): the final tree of session 8. Every CUDA test program; then, on an idle GPU,
# cider's model prefill rows (2048-row chunks, the default) and decode rows, and llama.cpp's CUDA llama-bench in the
# same call: prompt processing 512 / 4096 / 16384 tokens (-ub 512, its default, and -ub 2048) and decode at depth
# 1024 / 32768, Q8_0 weights, q8_0 KV cache, flash attention, on a random-weight Llama-3-8B-shape GGUF.
# llama-bench was built OUTSIDE the repository (/tmp/llama-local: the trimmed llama.cpp of the llama-cpp-python 0.3.36
# sdist in .peers/, cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=OFF
# -DGGML_CUDA_FA_QUANTS=q8_0-q8_0, CUDA 13.0 nvcc) and carried stripped and xz-compressed in the ignored .gpu58/.
# Two calls (the carry limit): PHASE=tests with .gpu58a (bin.tar.xz: the 7 test programs, cuda_bench, cider), then
# PHASE=bench with .gpu58b (bin.tar.xz: cuda_bench; llama-bench.xz; make_random_gguf.py), models/ and the big
# tokenizer fixture moved out of the working tree for that call (the benchmarks use random weights).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PHASE=${PHASE:-tests}
G=.gpu58a; [ "$PHASE" = bench ] && G=.gpu58b
[ -d $G/bin ] || tar -C $G -xJf $G/bin.tar.xz
B=$G/bin
MODEL=/dev/shm/llama3-8b-shape-q8_0-random.gguf
LB=/tmp/llama-bench
if [ "$PHASE" = tests ]; then
for t in $B/test_cuda_*; do
  n=$(basename $t)
  ( timeout 300 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -30
(cd "$OUT" && tar -czf tests_logs.tgz *.log && rm -f *.log)
echo "total $(( $(date +%s) - T0 )) s"
exit 0
fi
[ -x $LB ] || xz -T8 -dc $G/llama-bench.xz > $LB && chmod +x $LB
( [ -f $MODEL.ok ] || { timeout 280 python3 $G/make_random_gguf.py --out $MODEL > "$OUT/gguf.log" 2>&1 && touch $MODEL.ok; }
  echo "gguf rc=$? ($(( $(date +%s) - T0 )) s) $(ls -la $MODEL 2>/dev/null | awk '{print $5}') bytes" > /tmp/gguf.rc ) &
wait; cat /tmp/gguf.rc
$LB --version 2>&1 | tail -2
echo "== cider prefill ($(( $(date +%s) - T0 )) s)"
for c in "w8a8 k8v4 n512" "w8a8 k4v3 n4096" "w8a8 k8v4 n16384"; do
  timeout 90 $B/cuda_bench --filter "=model prefill llama3-8b $c" 2>&1 | grep -E "^model" | cut -c1-150
done
echo "== llama.cpp prompt processing ($(( $(date +%s) - T0 )) s)"
timeout 150 $LB -m $MODEL -ngl 99 -fa 1 -ctk q8_0 -ctv q8_0 -p 512,4096,16384 -n 0 -ub 512,2048 -r 2 -o json > "$OUT/llama_pp.json" 2> "$OUT/llama_pp.err"
echo "llama pp rc=$?"
python3 -c "import json,sys; [print('llama.cpp pp', r['n_prompt'], 'ub', r['n_ubatch'], 'KV', r['type_k'], round(r['avg_ts'],1), '±', round(r['stddev_ts'],1), 'tok/s') for r in json.load(open(sys.argv[1]))]" "$OUT/llama_pp.json"
echo "== llama.cpp decode ($(( $(date +%s) - T0 )) s)"
timeout 120 $LB -m $MODEL -ngl 99 -fa 1 -ctk q8_0 -ctv q8_0 -p 0 -n 64 -d 1024,32768 -r 2 -o json > "$OUT/llama_tg.json" 2> "$OUT/llama_tg.err"
echo "llama tg rc=$?"
python3 -c "import json,sys; [print('llama.cpp tg', r['n_gen'], 'depth', r['n_depth'], 'KV', r['type_k'], round(r['avg_ts'],1), '±', round(r['stddev_ts'],1), 'tok/s') for r in json.load(open(sys.argv[1]))]" "$OUT/llama_tg.json"
echo "== cider decode ($(( $(date +%s) - T0 )) s)"
for c in "w8a8 k8v4 L1024" "w8a8 k8v4 L32768" "w4a8 k4v3 L1024" "w4a8 k4v3 L32768" "bf16 kv-bf16 L1024" "bf16 kv-bf16 L32768"; do
  timeout 60 $B/cuda_bench --filter "=model decode llama3-8b $c" 2>&1 | grep -E "^model" | cut -c1-130
done
(cd "$OUT" && tar -czf logs.tgz *.log *.err 2>/dev/null; rm -f *.log *.err)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
