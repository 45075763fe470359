#!/usr/bin/env bash
# GPU job 56 (2026-11-30, session 8): cheaper tile copies in the decode attention kernel (full-tile path without
# predicates, running source pointers, 16-byte scale/bias-plane copies), the fixed PrefillTailChunksOfEveryLength.
# Tests (attention, model, pdl) with memcheck/racecheck on the decode tests, then the attention decode rows of this
# tree and of job 54's binary (cuda_bench_base), the SDPA peers and the model decode rows of both.
# Carry .gpu56 (bin.tar.xz: test_cuda_attention, test_cuda_model, test_cuda_pdl, cuda_bench, cuda_bench_base,
# cider; gpu_anchors.py).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu56/bin ] || tar -C .gpu56 -xJf .gpu56/bin.tar.xz
B=.gpu56/bin
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaAttention.TensorCoreDecodePackedAndUnpackedLayouts:CudaAttention.TensorCoreDecodePath:CudaAttention.TensorCoreDecodePathK8V4:CudaAttention.FoldedMergeEmptySplits'
for tool in memcheck racecheck; do
  ( timeout 300 $SAN --tool $tool $B/test_cuda_attention --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
done
for n in test_cuda_attention test_cuda_model test_cuda_pdl; do
  ( timeout 300 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
echo "== bench ($(( $(date +%s) - T0 )) s)"
for v in base new; do
  bin=$B/cuda_bench; [ $v = base ] && bin=$B/cuda_bench_base
  timeout 100 $bin --json "$OUT/attn_$v.json" --filter "attention decode" > "$OUT/attn_$v.txt" 2>&1; echo "attn $v rc=$? ($(( $(date +%s) - T0 )) s)"
done
PYTHONUNBUFFERED=1 timeout 110 python3 .gpu56/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1; echo "anchors rc=$? ($(( $(date +%s) - T0 )) s)"
python3 tools/gpu/compare.py "$OUT/attn_new.json" "$OUT"/gpu_anchors.json > "$OUT/compare.txt" 2>&1
grep -E "attention decode" "$OUT/compare.txt" | grep -v "v:" | cut -c1-150
echo "== base (job 54 binary)"; grep -E "^attention" "$OUT/attn_base.txt" | grep -v "v:" | cut -c1-90
echo "== model ($(( $(date +%s) - T0 )) s)"
for c in "w8a8 k8v4 L1024" "w8a8 k8v4 L32768" "w4a8 k4v3 L1024" "w4a8 k4v3 L32768"; do
  for v in base new; do
    bin=$B/cuda_bench; [ $v = base ] && bin=$B/cuda_bench_base
    timeout 60 $bin --filter "=model decode llama3-8b $c" 2>&1 | grep -E "^model" | sed "s/^/$v /" | cut -c1-120
  done
done
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log attn_*.txt gpu_anchors.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
