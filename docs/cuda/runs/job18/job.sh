#!/usr/bin/env bash
# GPU job 18 (2026-11-30, session 4): the row GEMV kernel with bulk-copy (TMA) weight loads into warp-private
# shared-memory slots (16 warps × 3 slots × 4 KB = 192 KB in flight per SM) against session 3's register loads
# (24 warps × 4 KB = 96 KB): all 7 CUDA test programs (every M = 1 GEMV case runs the bulk default, the register
# loads, the tile kernel, and in RowKernelShapesAndGroups the 2-slot bulk variant), compute-sanitizer memcheck +
# racecheck on the row-kernel tests, SASS resource summary, the GEMV rows with their load A/B rows, the model decode
# rows, the bf16 peers, one compare table.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
# GEMV tests first, alone (a hang in the new mbarrier waits would show here, bounded by the timeout).
timeout 150 $B/test_cuda_gemv --gtest_brief=1 > "$OUT/test_cuda_gemv.log" 2>&1
echo "test_cuda_gemv rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_gemv.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
grep -hE -A4 "Failure|FAILED" "$OUT/test_cuda_gemv.log" | head -30
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaGemv.RowKernelShapesAndGroups:CudaGemv.KernelEnvironmentSwitch:CudaGemv.SpecialActivationRows'
for tool in memcheck racecheck synccheck; do
  ( timeout 240 $SAN --tool $tool $B/test_cuda_gemv --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
done
for t in $B/test_cuda_*; do
  n=$(basename $t); [ "$n" = test_cuda_gemv ] && continue
  ( timeout 200 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -A3 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -30
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
$CUOBJ -res-usage $B/cuda_bench 2>/dev/null | grep -A1 gemv_rows_kernel | grep -oE "gemv_rows_kernelIL[^E]*E[^ ]*|REG:[0-9]+|STACK:[0-9]+|SHARED:[0-9]+|LOCAL:[0-9]+" | paste - - - - - > "$OUT/res_rows.txt"
echo "resource lines $(wc -l < "$OUT/res_rows.txt")"
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 200 $B/cuda_bench --json "$OUT/gemv.json" --filter "gemv" > "$OUT/gemv.txt" 2>&1; echo "rc=$?"
timeout 150 $B/cuda_bench --json "$OUT/model.json" --filter "model decode llama3-8b" > "$OUT/model.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/model.txt" | grep -vE "split|so4|linear only" | cut -c1-140
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/gemv_shapes_peer.py > "$OUT/gemv_shapes_peer.txt" 2>&1
python3 tools/gpu/compare.py "$OUT/gemv.json" "$OUT"/gpu_anchors.json "$OUT/gemv_shapes_peer.json" > "$OUT/compare.txt" 2>&1
grep -E "gemv" "$OUT/compare.txt" | grep -E " M1 " | grep -vE "v:(quantize|8warps|split|no epilogue)"
(cd "$OUT" && tar -czf logs.tgz *.log res_rows.txt model.txt gpu_anchors.txt gemv_shapes_peer.txt gemv.txt && rm -f *.log res_rows.txt model.txt gpu_anchors.txt gemv_shapes_peer.txt gemv.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
