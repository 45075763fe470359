#!/usr/bin/env bash
# GPU job 13 (2026-11-30, session 3): the row GEMV kernel with equal step ranges per warp (cut rows finished after one
# block barrier) — all 7 CUDA test programs, compute-sanitizer memcheck + racecheck on the row-kernel tests, the SASS
# of its per-channel kernels (the pattern names job 12's template signature, so it finds nothing here), every GEMV
# row with its tile-kernel A/B row, the model's decode rows, the bf16 peers, one compare table.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaGemv.RowKernelShapesAndGroups:CudaGemv.KernelEnvironmentSwitch:CudaGemv.SpecialActivationRows'
for tool in memcheck racecheck; do
  ( timeout 280 $SAN --tool $tool $B/test_cuda_gemv --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
done
for t in $B/test_cuda_*; do
  n=$(basename $t)
  ( timeout 240 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -A3 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
$CUOBJ -sass $B/cuda_bench 2>/dev/null | awk '/Function : .*gemv_rows_kernelILb[01]ELi0ELi1E/{f=1} /Function : /&&!/gemv_rows_kernelILb[01]ELi0ELi1E/{f=0} f' > "$OUT/sass_rows.txt"
echo "sass lines $(wc -l < "$OUT/sass_rows.txt"), LDG $(grep -c LDG "$OUT/sass_rows.txt"), STL $(grep -c STL "$OUT/sass_rows.txt")"
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 150 $B/cuda_bench --json "$OUT/gemv.json" --filter "gemv" > "$OUT/gemv.txt" 2>&1; echo "rc=$?"
timeout 150 $B/cuda_bench --json "$OUT/model.json" --filter "model decode llama3-8b" > "$OUT/model.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/model.txt" | grep -vE "split|so4|linear only" | cut -c1-130
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/gemv_shapes_peer.py > "$OUT/gemv_shapes_peer.txt" 2>&1
python3 tools/gpu/compare.py "$OUT/gemv.json" "$OUT"/gpu_anchors.json "$OUT/gemv_shapes_peer.json" > "$OUT/compare.txt" 2>&1
grep -E "gemv" "$OUT/compare.txt" | grep -vE "v:(register|quantize|8warps|split|no epilogue)"
# The device tool returns at most 8 files: logs, SASS and the text outputs go in one archive.
(cd "$OUT" && tar -czf logs.tgz *.log sass_rows.txt model.txt gpu_anchors.txt gemv_shapes_peer.txt && rm -f *.log sass_rows.txt model.txt gpu_anchors.txt gemv_shapes_peer.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
