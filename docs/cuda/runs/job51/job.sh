#!/usr/bin/env bash
# GPU job 51 (2026-11-30, session 7): prefill chunks of 2048 rows by default (CIDER_PREFILL_CHUNK; 512 before) and the
# prefill attention's automatic kernel choice (exact scores for ≤ 64 query rows per KV head). test_cuda_attention and
# test_cuda_model, then the model prefill rows (512, 4096 and 16384 tokens; chunk 2048 vs 512; f16 vs exact attention),
# the decode rows at 1k (unchanged path) and the few-rows prefill attention row. Carry .gpu51.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu51/bin ] || tar -C .gpu51 -xJf .gpu51/bin.tar.xz
B=.gpu51/bin
for n in test_cuda_attention test_cuda_model; do
  ( timeout 300 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
echo "== model ($(( $(date +%s) - T0 )) s)"
for f in "prefill llama3-8b w8a8 k8v4 n512" "prefill llama3-8b w8a8 k4v3 n4096" "prefill llama3-8b w8a8 k8v4 n16384" \
         "decode llama3-8b w8a8 k8v4 L1024"; do
  timeout 150 $B/cuda_bench --filter "model $f" >> "$OUT/model.txt" 2>&1; echo "$f rc=$? ($(( $(date +%s) - T0 )) s)"
done
grep -hE "^model" "$OUT/model.txt" | grep -v "cuda-core\|gemv\|attn \|pdl" | cut -c1-170
timeout 60 $B/cuda_bench --filter "attention prefill K4V3 B1 Hq32 Hkv8 D128 L16 past32768" > "$OUT/attn.txt" 2>&1; grep -E "^attention" "$OUT/attn.txt" | cut -c1-150
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log *.txt)
echo "total $(( $(date +%s) - T0 )) s"
