#!/usr/bin/env bash
# GPU job 4 of 2026-11-30: the tests and the whole-model rows after removing the fused-GLU GEMV, the CLI on the GPU,
# then compute-sanitizer memcheck + racecheck over every CUDA test program (docs/cuda/runs/sanitize/job.sh).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin; T=$OUT/tests.log; : > "$T"
for t in $B/test_cuda_*; do
  n=$(basename "$t")
  timeout 200 "$t" --gtest_brief=1 > /tmp/$n.log 2>&1; rc=$?
  cat /tmp/$n.log >> "$T"
  echo "$n rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/$n.log | tr '\n' ' ')"
  [ $rc = 0 ] || grep -E "Failure|exception|Expected|actual|Which is|FAILED|error" /tmp/$n.log | head -16
done
G=$OUT/generate.txt; : > "$G"
for w in w8a8 w4a8 bf16; do
  echo "-- cider generate --device cuda --weights $w" >> "$G"
  timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights $w --temperature 0 --max-tokens 48 \
    -p "Once upon a time" >> "$G" 2>&1; echo "rc=$?" >> "$G"
done
grep -E "^prompt|rc=" "$G" | cut -c1-200
echo "== model rows ($(( $(date +%s) - T0 )) s)"
timeout 150 $B/cuda_bench --filter "model decode llama3-8b" --json "$OUT/cuda_bench_model.json" > "$OUT/cuda_bench_model.txt" 2>&1
echo "bench rc=$?"; grep -E "^model" "$OUT/cuda_bench_model.txt" | cut -c1-150
echo "== sanitizers ($(( $(date +%s) - T0 )) s)"
LIMIT=$(( 560 - ($(date +%s) - T0) )) bash docs/cuda/runs/sanitize/job.sh
echo "total $(( $(date +%s) - T0 )) s"
