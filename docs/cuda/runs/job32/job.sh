#!/usr/bin/env bash
# GPU job 32 (2026-11-30, session 5): two A/B switches for the last 4 % to the GEMM target — the epilogue constants
# staged per consumer warp (CIDER_GEMM_EPI=warp: no barrier across the warpgroups) and the activation quantization
# with 64 threads per row (CIDER_QUANT_ROWS=narrow: a 2048-row chunk in one wave). test_cuda_gemm under each, the gemm
# rows under each and both, the peer. (Carry .gpu32: test_cuda_gemm and cuda_bench.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu32/bin ] || tar -C .gpu32 -xJf .gpu32/bin.tar.xz
B=.gpu32/bin
for v in "CIDER_GEMM_EPI=warp CIDER_QUANT_ROWS=narrow"; do  # the defaults passed in job 29
  env $v timeout 120 $B/test_cuda_gemm --gtest_brief=1 > "$OUT/t.log" 2>&1
  echo "test_cuda_gemm $v rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/t.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
  grep -hE -A4 "Failure|FAILED" "$OUT/t.log" | head -10
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
CIDER_GEMM_EPI=warp CIDER_QUANT_ROWS=narrow timeout 90 $SAN --tool racecheck $B/test_cuda_gemm --gtest_brief=1 --gtest_filter='*Quantize*:*WgmmaInterior*' > "$OUT/san.log" 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san.log" | tr '\n' ' ')"
echo "== bench ($(( $(date +%s) - T0 )) s)"
for v in "CIDER_GEMM_EPI=block" "CIDER_GEMM_EPI=warp" "CIDER_QUANT_ROWS=narrow" "CIDER_GEMM_EPI=warp CIDER_QUANT_ROWS=narrow"; do
  echo "-- $v"
  for f in "w8a8 gemm M2048" "w8a8 gemm only M2048" "quantize_rows"; do
    env $v timeout 60 $B/cuda_bench --filter "$f" 2>&1 | grep -E "^gemm" | grep -v mma.sync | cut -c1-84
  done
done
PYTHONUNBUFFERED=1 timeout 90 python3 tools/gpu/gemm_peer.py 2>&1 | grep -E "M2048|M512"
echo "total $(( $(date +%s) - T0 )) s"
