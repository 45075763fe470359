#!/usr/bin/env bash
# GPU job 5 (2026-11-30, session 2): (1) Nsight Compute on the W4A8 / W8A8 decode GEMV (M1 K4096 N14336), (2) the
# linear-layer benchmark rows (GEMV + GEMM: the GEMM epilogue helpers moved into gemm_epilogue.cuh since the last
# timing), (3) compute-sanitizer over what job 4 could not finish — memcheck of test_cuda_model, racecheck of
# test_cuda_model / test_cuda_ops / test_cuda_gemv — one process per gtest case, many at once (correctness only).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
echo "== ncu gemv"
for c in "w4a8 gemv M1 K4096 N14336" "w8a8 gemv M1 K4096 N14336"; do
  f="$OUT/ncu_$(echo $c | cut -d' ' -f1).txt"
  timeout 90 $NCU --clock-control none --cache-control none -k regex:int_gemv --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters \
    $B/cuda_bench --filter "$c" > "$f" 2>&1
  echo "ncu $c rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Executed Instructions  |Warp Cycles Per Issued|Stall" "$f" | head -30
done
echo "== bench linear ($(( $(date +%s) - T0 )) s)"
$B/cuda_bench --filter "gemv" 2>&1 | tail -25
$B/cuda_bench --filter "gemm" 2>&1 | tail -25
echo "== sanitizers ($(( $(date +%s) - T0 )) s)"
LIMIT=${LIMIT:-380}
pids=()
launch() {  # tool program case
  local tool=$1 prog=$2 case=$3 tag
  tag="${tool}_${prog}_$(echo "$case" | tr -c 'A-Za-z0-9' _)"
  ( timeout $LIMIT compute-sanitizer --tool $tool --error-exitcode 9 $B/$prog --gtest_filter="$case" --gtest_brief=1 \
      > /tmp/san_$tag.log 2>&1
    echo "$tool $prog $case rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san_$tag.log | tail -1 | sed 's/=* //') $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/san_$tag.log | tr '\n' ' ')" > /tmp/san_$tag.rc ) &
  pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "${PAR:-20}" ]; do wait -n; done
}
for spec in "memcheck test_cuda_model" "racecheck test_cuda_model" "racecheck test_cuda_ops" "racecheck test_cuda_gemv"; do
  set -- $spec
  for c in $($B/$2 --gtest_list_tests | awk '/^[^ ]/{s=$1} /^  /{print s $1}'); do launch $1 $2 "$c"; done
done
wait
echo "${#pids[@]} sanitizer processes"
cat /tmp/san_*.rc | sort > "$OUT/sanitize_summary.txt"
cat "$OUT/sanitize_summary.txt"
for f in /tmp/san_*.log; do
  if grep -qE "ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]|Hazard|Invalid" "$f"; then
    echo "---- $f"; grep -E "Error|Hazard|Invalid|at 0x|by thread|in .*kernel" "$f" | head -20
  fi
done
tail -c 100000 -q /tmp/san_*.log > "$OUT/sanitize_logs.txt"
echo "total $(( $(date +%s) - T0 )) s"
