#!/usr/bin/env bash
# GPU job 43 (2026-11-30, session 6): the fused quantization, fourth version — a compact quantizer (two passes over
# the row, the codes in a loop of 4 chunks per step: job 39 showed the fully unrolled row running cold from the
# instruction cache). test_cuda_gemm (the fused tests force it on), test_cuda_model with the fused path on (the
# model's f32 activations), memcheck on the fused tests, the gemm rows (default and v:fused) with the peer, the model
# prefill rows with and without it. (Carry .gpu43: cuda_bench, test_cuda_gemm, test_cuda_model.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu43/bin ] || tar -C .gpu43 -xJf .gpu43/bin.tar.xz
B=.gpu43/bin
( timeout 200 $B/test_cuda_gemm --gtest_brief=1 > "$OUT/test_cuda_gemm.log" 2>&1; echo "test_cuda_gemm rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_cuda_gemm.log" | tr '\n' ' ')" > /tmp/g.rc ) &
( CIDER_GEMM_FUSED_QUANT=1 timeout 200 $B/test_cuda_model --gtest_brief=1 > "$OUT/test_cuda_model_fused.log" 2>&1; echo "test_cuda_model (fused on) rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_model_fused.log" | tr '\n' ' ')" > /tmp/m.rc ) &
wait; cat /tmp/g.rc /tmp/m.rc; grep -hE -B2 -A6 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -30
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 100 $SAN --tool memcheck $B/test_cuda_gemm --gtest_brief=1 --gtest_filter='*FusedQuantizationGraphsAndStreams' > "$OUT/san_memcheck.log" 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_memcheck.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
timeout 120 $B/cuda_bench --json "$OUT/gemm.json" --filter "w8a8 gemm" > "$OUT/gemm.txt" 2>&1; echo "rc=$?"
grep -E "^gemm" "$OUT/gemm.txt" | grep -vE "mma.sync|g64" | cut -c1-100
PYTHONUNBUFFERED=1 timeout 90 python3 tools/gpu/gemm_peer.py > "$OUT/gemm_peer.txt" 2>&1; grep "_int_mm" "$OUT/gemm_peer.txt"
python3 tools/gpu/compare.py "$OUT/gemm.json" "$OUT/gemm_peer.json" > "$OUT/compare.txt" 2>&1
for v in 0 1; do
  for f in "w8a8 k8v4 n512" "w8a8 k4v3 n4096"; do
    CIDER_GEMM_FUSED_QUANT=$v timeout 100 $B/cuda_bench --filter "model prefill llama3-8b $f" 2>&1 | grep -E "^model" | grep -v "v:" | sed "s/^/fused=$v /" | cut -c1-150
  done
done
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log gemm.txt gemm_peer.txt)
echo "total $(( $(date +%s) - T0 )) s"
