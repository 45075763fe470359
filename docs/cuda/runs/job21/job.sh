#!/usr/bin/env bash
# GPU job 21 (2026-11-30, session 4): the one-pass attention split merge (merge4_kernel) on top of the packed decode
# layout. test_cuda_attention (the new MergeKernelsAgree runs both merges), test_cuda_model and test_cuda_pdl (the
# merge sits in every decode layer), memcheck + racecheck on the merge and packed-layout tests, the attention decode
# rows with their A/B rows, the model decode rows, the SDPA peers, one compare table.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaAttention.MergeKernelsAgree:CudaAttention.TensorCoreDecodePackedAndUnpackedLayouts'
for tool in memcheck racecheck; do
  ( timeout 280 $SAN --tool $tool $B/test_cuda_attention --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
done
for n in test_cuda_attention test_cuda_model test_cuda_pdl; do
  ( timeout 200 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -B2 -A6 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 120 $B/cuda_bench --json "$OUT/attn.json" --filter "attention decode" > "$OUT/attn.txt" 2>&1; echo "rc=$?"
timeout 150 $B/cuda_bench --json "$OUT/model.json" --filter "model decode llama3-8b" > "$OUT/model.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/model.txt" | grep -vE "split|so4|linear only|no-|gemv tile|attn fold" | cut -c1-140
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
python3 tools/gpu/compare.py "$OUT/attn.json" "$OUT"/gpu_anchors.json > "$OUT/compare.txt" 2>&1
grep -E "attention decode" "$OUT/compare.txt" | cut -c1-150
grep -E "Hq8 Hkv2" "$OUT/attn.txt" | cut -c1-110
(cd "$OUT" && tar -czf logs.tgz *.log model.txt gpu_anchors.txt attn.txt && rm -f *.log model.txt gpu_anchors.txt attn.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
