#!/usr/bin/env bash
# Final GPU job of 2026-11-29/30: all CUDA tests, targeted sanitizer runs, every bench case (with the opt-in K8V4
# tensor-core attention switched on), the PyTorch peers, then the opt-in wgmma cluster variant last (a hang there
# must not cost the rest).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin; T=$OUT/tests.log; : > "$T"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "== tests"
for t in $B/test_cuda_*; do
  n=$(basename "$t")
  timeout 200 "$t" --gtest_brief=1 > /tmp/$n.log 2>&1; rc=$?
  cat /tmp/$n.log >> "$T"
  echo "$n rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/$n.log | tr '\n' ' ')"
  [ $rc = 0 ] || grep -E "Failure|exception|Expected|actual|Which is|FAILED" /tmp/$n.log | head -12
done
echo "== memcheck"
for f in "test_cuda_attention:*K8V4*" "test_cuda_model:*Hadamard*" "test_cuda_gemv:*Special*"; do
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $B/${f%%:*} --gtest_brief=1 --gtest_filter="${f#*:}" > /tmp/san.log 2>&1
  echo "memcheck ${f} rc=$? $(grep -E 'ERROR SUMMARY' /tmp/san.log | tail -1)"; cat /tmp/san.log >> "$T"
done
echo "== bench"
CIDER_ATTN_TC_K8V4=1 timeout 200 $B/cuda_bench --json "$OUT/cuda_bench.json" > "$OUT/cuda_bench.txt" 2>&1; echo "bench rc=$?"
echo "== peers"
PYTHONUNBUFFERED=1 timeout 150 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1; echo "peers rc=$?"
python3 tools/gpu/compare.py "$OUT/cuda_bench.json" "$OUT/gpu_anchors.json" > "$OUT/compare.txt" 2>&1
cat "$OUT/compare.txt"
echo "== wgmma2 cluster variant (opt-in)"
timeout 60 $B/test_cuda_gemm --gtest_brief=1 --gtest_also_run_disabled_tests --gtest_filter='*WgmmaCluster*' > /tmp/w2.log 2>&1; echo "wgmma2 tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' /tmp/w2.log | tr '\n' ' ')"
CIDER_GEMM_KERNEL=wgmma2 timeout 40 $B/cuda_bench --filter "w8a8 gemm" > "$OUT/wgmma2.txt" 2>&1; echo "wgmma2 bench rc=$?"; grep -E "^gemm " "$OUT/wgmma2.txt" | cut -c1-110
