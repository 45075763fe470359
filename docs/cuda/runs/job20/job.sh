#!/usr/bin/env bash
# GPU job 20 (2026-11-30, session 4): the packed decode-attention layout for R ≤ 4 query rows and the final row-GEMV
# load rule (bulk copies for per-channel matrices ≥ 28 MB). All 7 CUDA test programs (attention: the new
# TensorCoreDecodePackedAndUnpackedLayouts runs both layouts), compute-sanitizer memcheck + racecheck on the
# tensor-core decode tests, the attention and model decode rows with their A/B rows, the GEMV M1 rows, the PyTorch
# peers, one compare table; Nsight Compute on the packed K4V3 decode kernel.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
timeout 200 $B/test_cuda_attention --gtest_brief=1 > "$OUT/test_cuda_attention.log" 2>&1
echo "test_cuda_attention rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_attention.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
grep -hE -B2 -A6 "Failure|FAILED" "$OUT/test_cuda_attention.log" | head -40
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaAttention.TensorCoreDecodePackedAndUnpackedLayouts:CudaAttention.FoldedMerge*'
for tool in memcheck racecheck; do
  ( timeout 280 $SAN --tool $tool $B/test_cuda_attention --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
done
for t in $B/test_cuda_*; do
  n=$(basename $t); [ "$n" = test_cuda_attention ] && continue
  ( timeout 200 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -A3 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -30
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 120 $B/cuda_bench --json "$OUT/attn.json" --filter "attention decode" > "$OUT/attn.txt" 2>&1; echo "rc=$?"
timeout 150 $B/cuda_bench --json "$OUT/model.json" --filter "model decode llama3-8b" > "$OUT/model.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/model.txt" | grep -vE "split|so4|linear only|no-" | cut -c1-140
timeout 120 $B/cuda_bench --json "$OUT/gemv.json" --filter " M1 " > "$OUT/gemv.txt" 2>&1; echo "rc=$?"
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/gemv_shapes_peer.py > "$OUT/gemv_shapes_peer.txt" 2>&1
python3 tools/gpu/compare.py "$OUT/attn.json" "$OUT"/gpu_anchors.json > "$OUT/compare.txt" 2>&1
python3 tools/gpu/compare.py "$OUT/gemv.json" "$OUT"/gpu_anchors.json "$OUT/gemv_shapes_peer.json" >> "$OUT/compare.txt" 2>&1
grep -E "attention decode" "$OUT/compare.txt" | cut -c1-150
grep -E "gemv" "$OUT/compare.txt" | grep -vE "v:(quantize|8warps|split|no epilogue|register ring|rows/task|tile)" | cut -c1-150
echo "== ncu ($(( $(date +%s) - T0 )) s)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
if [ -n "$NCU" ]; then
  timeout 120 $NCU --clock-control none --cache-control none -k regex:attention_tc --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section InstructionStats --section WarpStateStats --section SchedulerStats --section Occupancy \
    $B/cuda_bench --filter "attention decode K4V3 B1 Hq32 Hkv8 D128 L32768" > "$OUT/ncu_attn.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "attention_tc_kernel|Duration|Issued Ipc|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Executed Instructions  |Achieved Occupancy" "$OUT/ncu_attn.txt" | cut -c1-120 | head -12
fi
(cd "$OUT" && tar -czf logs.tgz *.log model.txt gpu_anchors.txt gemv_shapes_peer.txt gemv.txt attn.txt ncu_attn.txt && rm -f *.log model.txt gpu_anchors.txt gemv_shapes_peer.txt gemv.txt attn.txt ncu_attn.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
