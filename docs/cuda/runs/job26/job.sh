#!/usr/bin/env bash
# GPU job 26 (2026-11-30, session 5): the wgmma GEMM's epilogue constants (sw, bias, sx) staged in shared memory by
# cp.async during the tile's mainloop, and a branch-free epilogue for interior tiles. test_cuda_gemm (with the
# cluster tests), the gemm rows, the peer, Nsight Compute of the default kernel (with warp stall reasons).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
timeout 150 $B/test_cuda_gemm --gtest_brief=1 --gtest_also_run_disabled_tests > "$OUT/test_cuda_gemm.log" 2>&1
echo "test_cuda_gemm rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_gemm.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
grep -hE -A4 "Failure|FAILED" "$OUT/test_cuda_gemm.log" | head -20
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  timeout 120 $SAN --tool $tool $B/test_cuda_gemm --gtest_brief=1 --gtest_filter='*WgmmaShapeSweep*:*WgmmaWideTile*:*Reject*' > "$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 120 $B/cuda_bench --json "$OUT/gemm.json" --filter "gemm" > "$OUT/gemm.txt" 2>&1; echo "rc=$?"
CIDER_GEMM_KERNEL=wgmma2 timeout 60 $B/cuda_bench --filter "w8a8 gemm" 2>&1 | grep -E "^gemm" | grep -v mma.sync | cut -c1-100
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 90 python3 tools/gpu/gemm_peer.py > "$OUT/gemm_peer.txt" 2>&1; cat "$OUT/gemm_peer.txt"
python3 tools/gpu/compare.py "$OUT/gemm.json" "$OUT/gemm_peer.json" > "$OUT/compare.txt" 2>&1; cut -c1-150 "$OUT/compare.txt"
echo "== ncu ($(( $(date +%s) - T0 )) s)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
if [ -n "$NCU" ]; then
  timeout 150 $NCU --clock-control none --cache-control none -k regex:wgmma_int8_gemm --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    $B/cuda_bench --filter "w8a8 gemm only M2048 K4096 N14336" > "$OUT/ncu_wgmma.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Duration|SM Frequency|Throughput|Issued Ipc|SM Busy|Stall|Warp Cycles" "$OUT/ncu_wgmma.txt" | cut -c1-120 | head -30
fi
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log gemm.txt gemm_peer.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
