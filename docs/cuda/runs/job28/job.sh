#!/usr/bin/env bash
# GPU job 28 (2026-11-30, session 5): 64-byte k-tiles for the per-channel wgmma GEMM (CIDER_GEMM_BK=64: 8 stages of
# 24 KB, more of the ring in flight) against the 128-byte default; the quantization kernel no longer triggers its
# PDL dependent early (job 27: the GEMM's CTAs took SMs from the quantization's second wave, 199.5 vs 193.9 µs).
# test_cuda_gemm with each k-tile, memcheck/racecheck on BK 64, the gemm rows (BK 128 / 64, PDL on / off), the peer.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
for bk in 128 64; do
  CIDER_GEMM_BK=$bk timeout 150 $B/test_cuda_gemm --gtest_brief=1 > "$OUT/test_cuda_gemm_bk$bk.log" 2>&1
  echo "test_cuda_gemm BK $bk rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_gemm_bk$bk.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
  grep -hE -A4 "Failure|FAILED" "$OUT/test_cuda_gemm_bk$bk.log" | head -12
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  CIDER_GEMM_BK=64 timeout 120 $SAN --tool $tool $B/test_cuda_gemm --gtest_brief=1 --gtest_filter='*WgmmaInterior*:*WgmmaWideTile*' > "$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool BK 64 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 120 $B/cuda_bench --json "$OUT/gemm.json" --filter "gemm" > "$OUT/gemm.txt" 2>&1; echo "rc=$?"
for v in "CIDER_GEMM_BK=64" "CIDER_PDL=0" "CIDER_GEMM_BK=64 CIDER_PDL=0"; do
  echo "-- $v"
  env $v timeout 60 $B/cuda_bench --filter "w8a8 gemm" 2>&1 | grep -E "^gemm" | grep -vE "mma.sync|g64|g128" | cut -c1-82
done
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 90 python3 tools/gpu/gemm_peer.py > "$OUT/gemm_peer.txt" 2>&1; cat "$OUT/gemm_peer.txt"
python3 tools/gpu/compare.py "$OUT/gemm.json" "$OUT/gemm_peer.json" > "$OUT/compare.txt" 2>&1; grep -E "w8a8 gemm (only )?M" "$OUT/compare.txt" | cut -c1-150
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log gemm.txt gemm_peer.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
