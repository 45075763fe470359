#!/usr/bin/env bash
# GPU job 27 (2026-11-30, session 5): one-pass quantization holding the raw words (28 registers: 8 rows per SM), and
# the wgmma GEMM launched with PDL behind it. test_cuda_gemm (+ memcheck/racecheck/synccheck on the wgmma tests),
# the gemm rows with CIDER_PDL on and off, the peer, and the model prefill rows (W8A8 + K8V4, 512 / 4096 tokens).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
timeout 150 $B/test_cuda_gemm --gtest_brief=1 > "$OUT/test_cuda_gemm.log" 2>&1
echo "test_cuda_gemm rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_gemm.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
grep -hE -A4 "Failure|FAILED" "$OUT/test_cuda_gemm.log" | head -20
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  timeout 120 $SAN --tool $tool $B/test_cuda_gemm --gtest_brief=1 --gtest_filter='*Quantize*:*WgmmaInterior*:*WgmmaWideTile*' > "$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 120 $B/cuda_bench --json "$OUT/gemm.json" --filter "gemm" > "$OUT/gemm.txt" 2>&1; echo "rc=$?"
CIDER_PDL=0 timeout 60 $B/cuda_bench --filter "w8a8 gemm M" 2>&1 | grep -E "^gemm" | grep -v mma.sync | sed 's/^gemm /pdl=0/' | cut -c1-80
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 90 python3 tools/gpu/gemm_peer.py > "$OUT/gemm_peer.txt" 2>&1; cat "$OUT/gemm_peer.txt"
python3 tools/gpu/compare.py "$OUT/gemm.json" "$OUT/gemm_peer.json" > "$OUT/compare.txt" 2>&1; cut -c1-150 "$OUT/compare.txt"
echo "== model prefill ($(( $(date +%s) - T0 )) s)"
timeout 200 $B/cuda_bench --json "$OUT/prefill.json" --filter "model prefill llama3-8b w8a8" > "$OUT/prefill.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/prefill.txt" | cut -c1-160
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log gemm.txt gemm_peer.txt prefill.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
