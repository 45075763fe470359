#!/usr/bin/env bash
# GPU job 25 (2026-11-30, session 5): the review commit's tree on the GPU (all 7 CUDA test programs) with the
# one-pass activation quantization; then why the 2-CTA-cluster GEMM (wgmma2) was slower than one CTA per tile:
# its grid (the bench note now prints it), a forced cluster count (CIDER_GEMM_CLUSTERS), and Nsight Compute of both
# kernels (throughput of L2 and SM, launch, occupancy). Peer: tools/gpu/gemm_peer.py (_int_mm, fp8 _scaled_mm).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
for t in $B/test_cuda_*; do
  n=$(basename $t)
  ( timeout 170 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE -A3 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -20
echo "== cluster tests ($(( $(date +%s) - T0 )) s)"
timeout 90 $B/test_cuda_gemm --gtest_brief=1 --gtest_also_run_disabled_tests --gtest_filter='*WgmmaCluster*' > "$OUT/cluster_tests.log" 2>&1
echo "cluster tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cluster_tests.log" | tr '\n' ' ')"
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 120 $B/cuda_bench --json "$OUT/gemm.json" --filter "gemm" > "$OUT/gemm.txt" 2>&1; echo "rc=$?"
grep -E "^gemm" "$OUT/gemm.txt" | cut -c1-190
for c in auto 66 64 60; do
  if [ $c = auto ]; then unset CIDER_GEMM_CLUSTERS; else export CIDER_GEMM_CLUSTERS=$c; fi
  echo "-- wgmma2 clusters=$c"
  CIDER_GEMM_KERNEL=wgmma2 timeout 60 $B/cuda_bench --filter "w8a8 gemm" 2>&1 | grep -E "^gemm" | grep -v mma.sync | cut -c1-190
done
unset CIDER_GEMM_CLUSTERS
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 90 python3 tools/gpu/gemm_peer.py > "$OUT/gemm_peer.txt" 2>&1; cat "$OUT/gemm_peer.txt"
python3 tools/gpu/compare.py "$OUT/gemm.json" "$OUT/gemm_peer.json" > "$OUT/compare.txt" 2>&1; cut -c1-150 "$OUT/compare.txt"
echo "== ncu ($(( $(date +%s) - T0 )) s)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
if [ -n "$NCU" ]; then
  $NCU --query-metrics --chip gh100 2>/dev/null | grep -iE "gmma|pipe_tensor" | cut -c1-110 | head -12
  for k in wgmma wgmma2; do
    CIDER_GEMM_KERNEL=$k timeout 150 $NCU --clock-control none --cache-control none -k regex:wgmma_int8_gemm \
      --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
      --section Occupancy --section ComputeWorkloadAnalysis --section SchedulerStats \
      $B/cuda_bench --filter "w8a8 gemm only M2048 K4096 N14336" > "$OUT/ncu_$k.txt" 2>&1
    echo "ncu $k rc=$?"
    grep -E "wgmma_int8_gemm|Duration|SM Frequency|Throughput|L2 Hit|Grid Size|Cluster|Achieved Occupancy|Issued Ipc|Busy|Mem Busy|Max Bandwidth|L1/TEX Hit" "$OUT/ncu_$k.txt" | cut -c1-120 | head -30
  done
fi
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log gemm.txt gemm_peer.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
