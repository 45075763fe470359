#!/usr/bin/env bash
# compute-sanitizer over every CUDA test program, memcheck and racecheck (shared-memory hazards), all at once on the
# one GPU (each program runs alone under its tool; they share the device). Untimed: correctness only.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
LIMIT=${LIMIT:-520}
pids=()
for t in $B/test_cuda_*; do
  n=$(basename "$t")
  for tool in memcheck racecheck; do
    ( timeout $LIMIT compute-sanitizer --tool $tool --error-exitcode 9 "$t" --gtest_brief=1 > /tmp/san_${tool}_$n.log 2>&1
      echo "$tool $n rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san_${tool}_$n.log | tail -1) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/san_${tool}_$n.log | tr '\n' ' ')" > /tmp/san_${tool}_$n.rc ) &
    pids+=($!)
  done
done
wait "${pids[@]}"
cat /tmp/san_*.rc | sort
for f in /tmp/san_*.log; do
  if grep -qE "ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]|Hazard|Invalid" "$f"; then
    echo "---- $f"; grep -E "Error|Hazard|Invalid|at 0x|by thread|in .*kernel" "$f" | head -20
  fi
done
cat /tmp/san_*.rc | sort > "$OUT/sanitize_summary.txt"
tail -c 200000 -q /tmp/san_*.log > "$OUT/sanitize_logs.txt"
echo "total $(( $(date +%s) - T0 )) s"
