#!/usr/bin/env bash
# GPU job 19 (2026-11-30, session 4): the row GEMV kernel's load rule after job 18 — bulk copies per channel (6
# half-size slots for short rows: W4 K ≤ 4096, W8 K ≤ 2048; else 3 slots), registers per group. test_cuda_gemv (every
# load variant in RowKernelShapesAndGroups), memcheck/racecheck/synccheck on the row tests, the model and PDL tests,
# the GEMV and model decode rows with the bf16 peers; then Nsight Compute on the K4V3 decode attention (where its
# time goes: pipes, stalls, instruction mix) for the notes.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
timeout 150 $B/test_cuda_gemv --gtest_brief=1 > "$OUT/test_cuda_gemv.log" 2>&1
echo "test_cuda_gemv rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_gemv.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
grep -hE -A4 "Failure|FAILED" "$OUT/test_cuda_gemv.log" | head -30
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaGemv.RowKernelShapesAndGroups:CudaGemv.KernelEnvironmentSwitch:CudaGemv.SpecialActivationRows'
for tool in memcheck racecheck synccheck; do
  ( timeout 240 $SAN --tool $tool $B/test_cuda_gemv --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
done
for n in test_cuda_model test_cuda_pdl; do
  ( timeout 200 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -A3 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -30
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 200 $B/cuda_bench --json "$OUT/gemv.json" --filter " M1 " > "$OUT/gemv.txt" 2>&1; echo "rc=$?"
timeout 150 $B/cuda_bench --json "$OUT/model.json" --filter "model decode llama3-8b" > "$OUT/model.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/model.txt" | grep -vE "split|so4|linear only|no-" | cut -c1-140
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/gemv_shapes_peer.py > "$OUT/gemv_shapes_peer.txt" 2>&1
python3 tools/gpu/compare.py "$OUT/gemv.json" "$OUT"/gpu_anchors.json "$OUT/gemv_shapes_peer.json" > "$OUT/compare.txt" 2>&1
grep -E "gemv" "$OUT/compare.txt" | grep -E " M1 " | grep -vE "v:(quantize|8warps|split|no epilogue|register ring|rows/task)"
echo "== ncu attention ($(( $(date +%s) - T0 )) s)"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true); echo "ncu: $NCU"
if [ -n "$NCU" ]; then
  timeout 150 $NCU --clock-control none --cache-control none -k regex:attention_tc --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
    $B/cuda_bench --filter "attention decode K4V3 B1 Hq32 Hkv8 D128 L32768" > "$OUT/ncu_attn.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Duration|Issued Ipc|Issue Slots Busy|Warp Cycles Per Issued|Executed Ipc|Stall|Pipe|Achieved Occupancy|No Eligible|Memory Throughput|Executed Instructions  " "$OUT/ncu_attn.txt" | head -40
fi
(cd "$OUT" && tar -czf logs.tgz *.log model.txt gpu_anchors.txt gemv_shapes_peer.txt gemv.txt ncu_attn.txt && rm -f *.log model.txt gpu_anchors.txt gemv_shapes_peer.txt gemv.txt ncu_attn.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
