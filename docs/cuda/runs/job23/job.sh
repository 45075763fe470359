#!/usr/bin/env bash
# GPU job 23 (2026-11-30, session 4): one pass over x in the 16-warp bulk GEMV kernels. test_cuda_gemv (every load
# variant; K 20480 covers the bulk kernels' two-pass fallback), memcheck on the row-kernel tests, the W8A8/W4A8 M1
# rows with their register-load A/B rows, the model decode rows, the bf16 peers, one compare table.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
( timeout 200 $SAN --tool memcheck $B/test_cuda_gemv --gtest_brief=1 --gtest_filter='CudaGemv.RowKernelShapesAndGroups:CudaGemv.SpecialActivationRows' > "$OUT/san_memcheck.log" 2>&1; echo "sanitizer memcheck rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_memcheck.log" | tr '\n' ' ')" > /tmp/san_memcheck.rc ) &
timeout 150 $B/test_cuda_gemv --gtest_brief=1 > "$OUT/test_cuda_gemv.log" 2>&1
echo "test_cuda_gemv rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_gemv.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
grep -hE -A4 "Failure|FAILED" "$OUT/test_cuda_gemv.log" | head -20
wait; cat /tmp/san_memcheck.rc
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 100 $B/cuda_bench --json "$OUT/gemv.json" --filter "a8 gemv M1 K" > "$OUT/gemv.txt" 2>&1; echo "rc=$?"
for f in "w8a8 k8v4 L1024" "w8a8 k8v4 L32768" "w4a8 k4v3 L1024"; do
  timeout 60 $B/cuda_bench --filter "model decode llama3-8b $f" 2>&1 | grep -E "^model" | grep -vE "tile|fold|block merge|pdl|three-chain|split" | cut -c1-120
done
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/gemv_shapes_peer.py > "$OUT/gemv_shapes_peer.txt" 2>&1
python3 tools/gpu/compare.py "$OUT/gemv.json" "$OUT"/gpu_anchors.json "$OUT/gemv_shapes_peer.json" > "$OUT/compare.txt" 2>&1
grep -E "gemv" "$OUT/compare.txt" | grep -vE "v:(rows/task|tile)" | cut -c1-150
(cd "$OUT" && tar -czf logs.tgz *.log gpu_anchors.txt gemv_shapes_peer.txt gemv.txt && rm -f *.log gpu_anchors.txt gemv_shapes_peer.txt gemv.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
