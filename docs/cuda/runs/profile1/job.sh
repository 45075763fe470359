#!/usr/bin/env bash
# GPU job 1 of 2026-11-30: CUDA tests (GEMV epilogue prefetch now the default), `cider generate --device cuda` on the
# embedded model, then Nsight Compute on the decode attention and on one whole-model decode step (kernel durations
# in graph order), clocks left alone (--clock-control none), caches not flushed (--cache-control none).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin; T=$OUT/tests.log; : > "$T"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true); echo "ncu: $NCU"
echo "== tests"
for t in $B/test_cuda_*; do
  n=$(basename "$t")
  timeout 200 "$t" --gtest_brief=1 > /tmp/$n.log 2>&1; rc=$?
  cat /tmp/$n.log >> "$T"
  echo "$n rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/$n.log | tr '\n' ' ')"
  [ $rc = 0 ] || grep -E "Failure|exception|Expected|actual|Which is|FAILED" /tmp/$n.log | head -12
done
echo "== cider generate --device cuda (embedded cider-tiny)"
G=$OUT/generate.txt; : > "$G"
for w in bf16 w8a8 w4a8; do
  echo "-- --weights $w (default kv k8v4/hadamard)" >> "$G"
  timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights $w --temperature 0 --max-tokens 48 \
    -p "Once upon a time" >> "$G" 2>&1; echo "rc=$?" >> "$G"
  echo "-- --weights $w on the CPU, same prompt" >> "$G"
  timeout 60 $B/cider generate -m models/cider-tiny --weights $w --temperature 0 --max-tokens 48 \
    -p "Once upon a time" >> "$G" 2>&1; echo "rc=$?" >> "$G"
done
echo "-- kv k4v3 so4-full on cuda" >> "$G"
timeout 60 $B/cider generate -m models/cider-tiny --device cuda --kv k4v3 --kv-rotation so4-full --temperature 0 \
  --max-tokens 48 -p "Once upon a time" >> "$G" 2>&1; echo "rc=$?" >> "$G"
echo "-- chat on cuda (one turn from stdin)" >> "$G"
echo "Tell me a story." | timeout 60 $B/cider chat -m models/cider-tiny --device cuda --temperature 0 --max-tokens 32 >> "$G" 2>&1; echo "rc=$?" >> "$G"
echo "-- error: prompt longer than the context" >> "$G"
timeout 60 $B/cider generate -m models/cider-tiny --device cuda --ctx 16 -p "$(printf 'word %.0s' $(seq 60))" >> "$G" 2>&1; echo "rc=$?" >> "$G"
cat "$G" | cut -c1-300
echo "== ncu attention"
if [ -n "$NCU" ]; then
  for c in "attention decode K4V3 B1 Hq32 Hkv8 D128 L32768" "attention decode K4V3 B1 Hq64 Hkv8 D128 L8192"; do
    timeout 120 $NCU --clock-control none --cache-control none -k regex:'attention_tc|merge' --launch-skip 20 --launch-count 2 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis \
      $B/cuda_bench --filter "$c" > "$OUT/ncu_attn_$(echo $c | tr -c 'A-Za-z0-9' _ | cut -c1-60).txt" 2>&1
    echo "ncu attention rc=$?"
  done
  echo "== ncu gemv"
  timeout 90 $NCU --clock-control none --cache-control none -k regex:int_gemv --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis $B/cuda_bench --filter "w8a8 gemv M1 K4096 N14336" > "$OUT/ncu_gemv.txt" 2>&1
  echo "ncu gemv rc=$?"
  echo "== ncu model decode step (W8A8 K8V4 L1024): every kernel's duration"
  timeout 240 $NCU --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    --launch-skip 600 --launch-count 1500 \
    $B/cuda_bench --filter "model decode llama3-8b w8a8 k8v4 L1024" > /tmp/ncu_model.csv 2>&1
  echo "ncu model rc=$?"
  grep -E '^"' /tmp/ncu_model.csv > "$OUT/ncu_model.csv"; wc -l "$OUT/ncu_model.csv"
fi
$B/cuda_bench --filter "model decode llama3-8b w8a8 k8v4 L1024" 2>&1 | tail -3
