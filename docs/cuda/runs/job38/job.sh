#!/usr/bin/env bash
# GPU job 38 (2026-11-30, session 6): the fused quantization, third version: branch-free codes (job 37: a branch per
# value made a row one dependent chain, ≈ 20 µs) and max |x| as an integer max of the abs bit patterns. All
# CUDA test programs, compute-sanitizer on the fused tests, the gemm rows (fused and separate) with the PyTorch peer,
# the model prefill rows with the switch on and off (the model's activations are f32), one generate.
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
  ( timeout 220 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE -B2 -A6 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
echo "== sanitizer ($(( $(date +%s) - T0 )) s)"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaGemm.WgmmaFusedQuantizationGraphsAndStreams:CudaGemm.WgmmaInteriorTiles:CudaGemm.FusedQuantizationSwitch*'
for tool in memcheck racecheck synccheck; do
  timeout 100 $SAN --tool $tool $B/test_cuda_gemm --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 150 $B/cuda_bench --json "$OUT/gemm.json" --filter "gemm" > "$OUT/gemm.txt" 2>&1; echo "rc=$?"
grep -E "^gemm" "$OUT/gemm.txt" | grep -v "mma.sync" | cut -c1-100
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 90 python3 tools/gpu/gemm_peer.py > "$OUT/gemm_peer.txt" 2>&1; tail -12 "$OUT/gemm_peer.txt"
python3 tools/gpu/compare.py "$OUT/gemm.json" "$OUT/gemm_peer.json" > "$OUT/compare.txt" 2>&1; grep -E "w8a8 gemm (only )?M" "$OUT/compare.txt" | cut -c1-150
echo "== model prefill ($(( $(date +%s) - T0 )) s)"
for f in "w8a8 k8v4 n512" "w8a8 k4v3 n4096"; do
  timeout 100 $B/cuda_bench --filter "model prefill llama3-8b $f" >> "$OUT/prefill.txt" 2>&1; echo "rc=$?"
  CIDER_GEMM_FUSED_QUANT=0 timeout 100 $B/cuda_bench --filter "model prefill llama3-8b $f" >> "$OUT/prefill_separate.txt" 2>&1; echo "rc=$?"
done
grep -hE "^model" "$OUT/prefill.txt" "$OUT/prefill_separate.txt" | cut -c1-160
echo "== generate ($(( $(date +%s) - T0 )) s)"
timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights w8a8 --seed 3 --max-tokens 32 \
  -p "Once upon a time" > "$OUT/generate.txt" 2>&1; echo "generate rc=$?"; cut -c1-200 "$OUT/generate.txt" | tail -4
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log gemm.txt gemm_peer.txt prefill*.txt generate.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
