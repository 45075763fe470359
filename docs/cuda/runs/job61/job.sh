#!/usr/bin/env bash
# GPU job 61 (2026-11-30, session 8): the decode kernel's mma / movmatrix asm without `volatile` (NV), and NV plus the
# intra-warp pipelining of job 59 (P), against job 58's binary (base), each twice in alternating order; the decode
# tests of the NV tree. Carry .gpu61 (bin: test_cuda_attention (NV), cuda_bench (NV), cuda_bench_base, cuda_bench_P).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu61/bin ] || tar -C .gpu61 -xJf .gpu61/bin.tar.xz
B=.gpu61/bin
timeout 150 $B/test_cuda_attention --gtest_brief=1 --gtest_filter='CudaAttention.TensorCore*:CudaAttention.Folded*:CudaAttention.Merge*' > "$OUT/t.log" 2>&1
echo "decode tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/t.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
for round in 1 2; do
  for v in base NV P; do
    bin=$B/cuda_bench_$v; [ $v = NV ] && bin=$B/cuda_bench
    for c in "K4V3 B1 Hq32 Hkv8 D128 L32768" "K4V3 B8 Hq32 Hkv8 D128 L32768" "K4V3 B1 Hq32 Hkv8 D128 L131072" "K8V4 B1 Hq32 Hkv8 D128 L32768" "K4V3 B1 Hq16 Hkv2 D256 L65536"; do
      timeout 30 $bin --filter "=attention decode $c" 2>&1 | grep -E "^attention" | awk -v v=$v -v r=$round '{for (i = 4; i <= NF; ++i) if ($i ~ /^[0-9.]+$/) break; printf "%s r%s %s %s %s %s %s %s %s\n", v, r, $4, $5, $6, $7, $8, $9, $i}'
    done
  done
done
echo "total $(( $(date +%s) - T0 )) s"
