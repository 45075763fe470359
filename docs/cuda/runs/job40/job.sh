#!/usr/bin/env bash
# GPU job 40 (2026-11-30, session 6): the final tree of the session. The fused quantization is opt-in
# (CIDER_GEMM_FUSED_QUANT=1; jobs 35–39 measured it slower); the separate quantization kernel now codes 8 values at a
# time without a branch per value (codes8_fast, as the fused version). All CUDA test programs, compute-sanitizer on
# the quantization and fused tests, the gemm rows with the PyTorch peer, the model prefill rows, generate.
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
F='CudaGemm.QuantizeRowsBitExact:CudaGemm.WgmmaFusedQuantizationGraphsAndStreams:CudaGemm.WgmmaInteriorTiles'
for tool in memcheck racecheck synccheck; do
  timeout 100 $SAN --tool $tool $B/test_cuda_gemm --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 150 $B/cuda_bench --json "$OUT/gemm.json" --filter "gemm" > "$OUT/gemm.txt" 2>&1; echo "rc=$?"
grep -E "^gemm" "$OUT/gemm.txt" | grep -v "mma.sync" | cut -c1-100
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 90 python3 tools/gpu/gemm_peer.py > "$OUT/gemm_peer.txt" 2>&1; tail -5 "$OUT/gemm_peer.txt"
python3 tools/gpu/compare.py "$OUT/gemm.json" "$OUT/gemm_peer.json" > "$OUT/compare.txt" 2>&1; grep -E "w8a8 gemm (only )?M" "$OUT/compare.txt" | cut -c1-150
echo "== model ($(( $(date +%s) - T0 )) s)"
for f in "prefill llama3-8b w8a8 k8v4 n512" "prefill llama3-8b w8a8 k4v3 n4096" "prefill llama3-8b bf16 kv-bf16 n512"; do
  timeout 120 $B/cuda_bench --filter "model $f" >> "$OUT/model.txt" 2>&1; echo "rc=$?"
done
grep -hE "^model" "$OUT/model.txt" | grep -v "v:" | cut -c1-160
echo "== generate ($(( $(date +%s) - T0 )) s)"
timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights w8a8 --seed 3 --max-tokens 32 \
  -p "Once upon a time" > "$OUT/generate.txt" 2>&1; echo "generate rc=$?"; cut -c1-200 "$OUT/generate.txt" | tail -2
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log gemm.txt gemm_peer.txt model.txt generate.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
