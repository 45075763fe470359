#!/usr/bin/env bash
# GPU job 24 (2026-11-30, session 4): the final tree (checked environment switches in every launch path). All CUDA
# test programs, and `cider generate --device cuda` end to end on the embedded model (bf16, w8a8, w4a8 weights; the
# default k8v4 cache and k4v3), with a bad switch value as the error case. (cuda_bench left out of the archive: the
# carry limit.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
for t in $B/test_cuda_*; do
  n=$(basename $t)
  ( timeout 170 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
G=$OUT/generate.txt; : > "$G"
for w in bf16 w8a8 w4a8; do
  echo "-- --weights $w --device cuda (default kv k8v4/hadamard)" >> "$G"
  timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights $w --temperature 0 --max-tokens 32 \
    -p "Once upon a time" >> "$G" 2>&1; echo "rc=$?" >> "$G"
done
echo "-- w8a8, kv k4v3 so4-full, cuda" >> "$G"
timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights w8a8 --kv k4v3 --kv-rotation so4-full \
  --temperature 0 --max-tokens 32 -p "Once upon a time" >> "$G" 2>&1; echo "rc=$?" >> "$G"
echo "-- error: CIDER_PDL=yes" >> "$G"
CIDER_PDL=yes timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights w8a8 \
  --temperature 0 --max-tokens 8 -p "Once upon a time" >> "$G" 2>&1; echo "rc=$?" >> "$G"
wait; cat /tmp/test_cuda_*.rc; grep -hE -A3 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -20
cut -c1-200 "$G"
(cd "$OUT" && tar -czf logs.tgz *.log && rm -f *.log)
echo "total $(( $(date +%s) - T0 )) s"
