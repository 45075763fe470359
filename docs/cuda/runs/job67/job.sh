#!/usr/bin/env bash
# GPU job 67 (2026-11-30, session 9): early tile copies in the decode attention kernel (the first tiles of cache rows
# below length − L and *d_length read before the PDL wait; $CIDER_ATTN_TC_EARLY=0 = after it, as before). Tests
# (attention, model, pdl; memcheck + racecheck on the decode/device-length tests), then each row with early copies on
# (default) and off, alternating, twice; model decode rows the same way.
# Carry .gpu67 (bin.tar.xz: cuda_bench, test_cuda_attention, test_cuda_model, test_cuda_pdl).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu67/bin ] || tar -C .gpu67 -xJf .gpu67/bin.tar.xz
B=.gpu67/bin
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaAttention.SplitsMergeAndDeviceLength:CudaAttention.TensorCoreDecodePath'
for tool in memcheck racecheck; do
  ( timeout 300 $SAN --tool $tool $B/test_cuda_attention --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "sanitizer $tool rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
done
for n in test_cuda_attention test_cuda_model test_cuda_pdl; do
  ( timeout 300 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
(cd "$OUT" && tar -czf tests_logs.tgz *.log && rm -f *.log)
echo "== attention, early (default) / late ($(( $(date +%s) - T0 )) s)"
for round in 1 2; do
  for c in "K4V3 B1 Hq32 Hkv8 D128 L32768" "K4V3 B1 Hq32 Hkv8 D128 L8192" "K4V3 B1 Hq32 Hkv8 D128 L131072" "K4V3 B8 Hq32 Hkv8 D128 L32768" "K4V3 B1 Hq16 Hkv2 D256 L65536" "K8V4 B1 Hq32 Hkv8 D128 L32768"; do
    for v in early late; do
      f="=attention decode $c"; [ $v = late ] && f="$f v:late copies"
      timeout 30 $B/cuda_bench --filter "$f" 2>&1 | grep -E "^attention" | awk -v v=$v -v r=$round -v c="$c" '{for (i = 4; i <= NF; ++i) if ($i ~ /^[0-9.]+$/ && $(i-1) ~ /^L[0-9]+$|copies$/) break; printf "%-5s r%s %-34s %s\n", v, r, c, $i}'
    done
  done
done
echo "== model ($(( $(date +%s) - T0 )) s)"
for round in 1 2; do
  for c in "w4a8 k4v3 L32768" "w8a8 k8v4 L32768" "w4a8 k4v3 L1024"; do
    for v in early late; do
      f="=model decode llama3-8b $c"; [ $v = late ] && f="$f v:late attention copies"
      timeout 60 $B/cuda_bench --filter "$f" 2>&1 | grep -E "^model" | sed "s/^/$v r$round /" | cut -c1-150
    done
  done
done
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
