#!/usr/bin/env bash
# GPU job 3 of 2026-11-30: the tests, then every cider benchmark and the PyTorch peers ALONE on the machine (job 2's
# benchmark ran beside the llama.cpp build, which delayed graph launches: some rows doubled), then Nsight Compute of
# one whole-model decode step (kernel durations, as in job 1).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin; T=$OUT/tests.log; : > "$T"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for t in $B/test_cuda_*; do
  n=$(basename "$t")
  timeout 200 "$t" --gtest_brief=1 > /tmp/$n.log 2>&1; rc=$?
  cat /tmp/$n.log >> "$T"
  echo "$n rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/$n.log | tr '\n' ' ')"
  [ $rc = 0 ] || grep -E "Failure|exception|Expected|actual|Which is|FAILED|error" /tmp/$n.log | head -16
done
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 240 $B/cuda_bench --json "$OUT/cuda_bench.json" > "$OUT/cuda_bench.txt" 2>&1; echo "bench rc=$?"
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 150 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1; echo "peers rc=$?"
python3 tools/gpu/compare.py "$OUT/cuda_bench.json" "$OUT/gpu_anchors.json" > "$OUT/compare.txt" 2>&1
grep -E "^(w8a8 gemm M2048|w8a8 gemv M1 K4096 N14336|w4a8 gemv M1 K4096 N14336|attention decode K4V3 B1 Hq32 Hkv8 D128 L32768|attention decode K8V4 B1 Hq32)" "$OUT/compare.txt" | cut -c1-150
grep -E "^model" "$OUT/cuda_bench.txt" | cut -c1-150
left=$(( 585 - ($(date +%s) - T0) ))
echo "== ncu model step ($(( $(date +%s) - T0 )) s, ${left}s left)"
[ $left -gt 60 ] && timeout $left ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --launch-skip 700 --launch-count 700 \
    $B/cuda_bench --filter "model decode llama3-8b w8a8 k8v4 L1024" > /tmp/ncu_model.csv 2>&1
grep -E '^"' /tmp/ncu_model.csv > "$OUT/ncu_model.csv"; wc -l "$OUT/ncu_model.csv"
echo "total $(( $(date +%s) - T0 )) s"
