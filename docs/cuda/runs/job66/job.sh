#!/usr/bin/env bash
# GPU job 66 (2026-11-30, session 9): the final tree's attention and model tests (job 65's kernels; the keys.length
# < 2^31 check moved before the plan, with its test in CudaAttention.RejectsBadArguments).
# Carry .gpu66 (bin.tar.xz: test_cuda_attention, test_cuda_model).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu66/bin ] || tar -C .gpu66 -xJf .gpu66/bin.tar.xz
B=.gpu66/bin
for n in test_cuda_attention test_cuda_model; do
  ( timeout 300 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
(cd "$OUT" && tar -czf tests_logs.tgz test_cuda_*.log && rm -f test_cuda_*.log)
echo "total $(( $(date +%s) - T0 )) s"
