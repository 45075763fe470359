#!/usr/bin/env bash
# GPU job 10/11 (2026-11-30, session 3): the row GEMV kernel for M = 1 (linear_gemv_rows.cu) — GEMV/PDL/model tests,
# the SASS of its W8 and W4 per-channel kernels, every M = 1 GEMV row next to its tile-kernel A/B row and the load
# roofs, the model's decode rows (w8a8/w4a8, and "v:gemv tile"), the bf16 GEMV peers (gpu_anchors.py +
# tools/gpu/gemv_shapes_peer.py for the model's other shapes), one compare table.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
for n in test_cuda_gemv test_cuda_pdl test_cuda_model; do
  ( timeout 200 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE -A3 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -60
echo "== sass ($(( $(date +%s) - T0 )) s)"
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
$CUOBJ -sass $B/cuda_bench 2>/dev/null | awk '/Function : .*gemv_rows_kernelILb[01]ELi0ELi1E/{f=1} /Function : /&&!/gemv_rows_kernelILb[01]ELi0ELi1E/{f=0} f' > "$OUT/sass_rows.txt"
wc -l "$OUT/sass_rows.txt"; grep -cE "LDG" "$OUT/sass_rows.txt"
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 150 $B/cuda_bench --json "$OUT/gemv.json" --filter "gemv" > "$OUT/gemv.txt" 2>&1; echo "rc=$?"
grep -E "^linear" "$OUT/gemv.txt" | grep -vE "v:(register|quantize|8warps|split|no epilogue)" | cut -c1-110
timeout 150 $B/cuda_bench --json "$OUT/model.json" --filter "model decode llama3-8b" > "$OUT/model.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/model.txt" | grep -vE "split|no-|so4|linear only" | cut -c1-130
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/gemv_shapes_peer.py > "$OUT/gemv_shapes_peer.txt" 2>&1
grep -E "GEMV" "$OUT/gpu_anchors.txt" "$OUT/gemv_shapes_peer.txt"
python3 tools/gpu/compare.py "$OUT/gemv.json" "$OUT"/gpu_anchors.json "$OUT/gemv_shapes_peer.json" > "$OUT/compare.txt" 2>&1
grep -E "gemv" "$OUT/compare.txt" | grep -vE "v:(register|quantize|8warps|split|no epilogue)"
# The device tool returns at most 8 files: logs, SASS and the text outputs go in one archive.
(cd "$OUT" && tar -czf logs.tgz *.log sass_rows.txt model.txt gpu_anchors.txt gemv_shapes_peer.txt && rm -f *.log sass_rows.txt model.txt gpu_anchors.txt gemv_shapes_peer.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
