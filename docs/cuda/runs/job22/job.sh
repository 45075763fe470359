#!/usr/bin/env bash
# GPU job 22 (2026-11-30, session 4): the packed decode-attention kernel with its shared-memory loads trimmed (digit
# fragments once per group for all m-tiles, scales/biases as half2 pairs). test_cuda_attention, test_cuda_model,
# memcheck + racecheck on the packed-layout test, the attention decode rows, the model decode rows at 32k, the SDPA
# peers, one compare table.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaAttention.TensorCoreDecodePackedAndUnpackedLayouts'
for tool in memcheck racecheck; do
  ( timeout 200 $SAN --tool $tool $B/test_cuda_attention --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
done
for n in test_cuda_attention test_cuda_model; do
  ( timeout 200 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -B2 -A6 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 120 $B/cuda_bench --json "$OUT/attn.json" --filter "attention decode K" > "$OUT/attn.txt" 2>&1; echo "rc=$?"
for f in "w8a8 k8v4 L32768" "w4a8 k4v3 L32768" "w8a8 k8v4 L1024" "w4a8 k4v3 L1024"; do
  timeout 60 $B/cuda_bench --filter "model decode llama3-8b $f" 2>&1 | grep -E "^model" | grep -vE "gemv|fold|block merge|pdl" | cut -c1-120
done
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
python3 tools/gpu/compare.py "$OUT/attn.json" "$OUT"/gpu_anchors.json > "$OUT/compare.txt" 2>&1
grep -E "attention decode" "$OUT/compare.txt" | grep -vE "CUDA-core|folded" | cut -c1-150
grep -E "Hq8 Hkv2" "$OUT/attn.txt" | cut -c1-110
(cd "$OUT" && tar -czf logs.tgz *.log gpu_anchors.txt attn.txt && rm -f *.log gpu_anchors.txt attn.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
