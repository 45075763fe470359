#!/usr/bin/env bash
# GPU job 57 (2026-11-30, session 8): job 56's copy change with the fix (16-byte plane copies only when the split's
# first key is 16-byte aligned in the planes: windows start c0 anywhere). test_cuda_attention + memcheck on the decode
# tests; then an A/B of the copy change's two parts, each binary twice in alternating order:
#   base = job 54's cuda_bench (predicated copies), A = running pointers + 16-byte planes, no full-tile path,
#   B = full-tile path, 4-byte planes, C = both (this tree).
# Carry .gpu57 (bin.tar.xz: test_cuda_attention, cuda_bench (C), cuda_bench_base, cuda_bench_A, cuda_bench_B).
set -u
SKIP_TESTS=${SKIP_TESTS:-0}
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu57/bin ] || tar -C .gpu57 -xJf .gpu57/bin.tar.xz
B=.gpu57/bin
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaAttention.TensorCoreDecodePackedAndUnpackedLayouts:CudaAttention.TensorCoreDecodePath:CudaAttention.TensorCoreDecodePathK8V4:CudaAttention.FoldedMergeEmptySplits'
[ "$SKIP_TESTS" = 1 ] || ( timeout 300 $SAN --tool memcheck $B/test_cuda_attention --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_memcheck.log" 2>&1; echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_memcheck.log" | tr '\n' ' ')" > /tmp/san.rc ) &
[ "$SKIP_TESTS" = 1 ] || ( timeout 300 $B/test_cuda_attention --gtest_brief=1 > "$OUT/test_cuda_attention.log" 2>&1; echo "test_cuda_attention rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_attention.log" | tr '\n' ' ')" > /tmp/t.rc ) &
wait; cat /tmp/t.rc /tmp/san.rc 2>/dev/null; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_attention.log | head -30
echo "== A/B ($(( $(date +%s) - T0 )) s)"
for round in 1 2; do
  for v in base A B C; do
    bin=$B/cuda_bench_$v; [ $v = C ] && bin=$B/cuda_bench
    for c in "K4V3 B1 Hq32 Hkv8 D128 L32768" "K4V3 B8 Hq32 Hkv8 D128 L32768" "K4V3 B1 Hq32 Hkv8 D128 L131072" "K4V3 B1 Hq64 Hkv8 D128 L8192" "K8V4 B1 Hq32 Hkv8 D128 L32768" "K4V3 B1 Hq16 Hkv2 D256 L65536"; do
      if [ $v = base ]; then f="attention decode $c"; else f="=attention decode $c"; fi
      timeout 30 $bin --filter "$f" 2>&1 | grep -E "^attention" | grep -v "v:" | awk -v v=$v -v r=$round '{for (i = 4; i <= NF; ++i) if ($i ~ /^[0-9.]+$/) break; printf "%s r%s %s %s %s %s %s %s %s\n", v, r, $4, $5, $6, $7, $8, $9, $i}'
    done
  done
done
(cd "$OUT" && tar -czf logs.tgz *.log && rm -f *.log)
echo "total $(( $(date +%s) - T0 )) s"
