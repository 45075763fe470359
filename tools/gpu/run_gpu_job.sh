#!/usr/bin/env bash
# One GPU job, from the repository root on a GPU host. Either tools/gpu/pack.sh filled .gpu/ on another machine (the
# lent H200 has no gtest/CLI11 packages, so we build here and carry the programs), or, with no .gpu/, this script
# installs the dependencies (scripts/setup.sh, Debian/Ubuntu) and builds the CUDA backend itself. Then:
#   1. every CUDA test program, 2. compute-sanitizer memcheck (+ racecheck on the attention tests) unless
#   GPU_JOB_SANITIZE=0, 3. cuda_bench, 4. the PyTorch peers (gpu_anchors.py, tools/gpu/attn_prefill_peer.py,
#   tools/gpu/gemv_shapes_peer.py) in the same job, 5. one table of
#   cider's times against the peers' (tools/gpu/compare.py). Logs and JSON go to $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/gpu.txt"
if [ -f .gpu/bin.tar.xz ] && [ ! -d .gpu/bin ]; then
  tar -C .gpu -xJf .gpu/bin.tar.xz
elif [ ! -d .gpu/bin ]; then
  echo "== building the CUDA backend here =="
  bash scripts/setup.sh > "$OUT/setup.log" 2>&1 || { echo "setup failed: see $OUT/setup.log"; exit 1; }
  GPU_ANCHORS=${GPU_ANCHORS:-../shared/tools/gpu_anchors.py} bash tools/gpu/pack.sh > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }
  tar -C .gpu -xJf .gpu/bin.tar.xz
fi
status=0
echo "== tests =="
for t in .gpu/bin/test_cuda_*; do
  [ -x "$t" ] || continue
  if "$t" --gtest_brief=1 > "$OUT/$(basename "$t").log" 2>&1; then
    echo "PASS $(basename "$t") ($(grep -c '^\[       OK \]' "$OUT/$(basename "$t").log" || true) ok)"
  else
    status=1; echo "FAIL $(basename "$t")"; grep -E "Failure|FAILED|error|Expected|Which is|actual|exception" "$OUT/$(basename "$t").log" | head -40
  fi
done
if [ "${GPU_JOB_SANITIZE:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  echo "== compute-sanitizer =="
  for t in .gpu/bin/test_cuda_*; do
    tools="memcheck"; case "$t" in *attention*|*gemm*|*linear*) tools="memcheck racecheck";; esac
    for tool in $tools; do
      if compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" --gtest_brief=1 ${GPU_JOB_SANITIZE_FILTER:+--gtest_filter=$GPU_JOB_SANITIZE_FILTER} > "$OUT/san-$tool-$(basename "$t").log" 2>&1; then
        echo "clean $tool $(basename "$t")"
      else
        status=1; echo "DIRTY $tool $(basename "$t")"; grep -E "=========|Failure" "$OUT/san-$tool-$(basename "$t").log" | head -20
      fi
    done
  done
fi
echo "== cuda_bench =="
.gpu/bin/cuda_bench ${GPU_BENCH_FILTER:+--filter "$GPU_BENCH_FILTER"} --json "$OUT/cuda_bench.json" 2>&1 | tee "$OUT/cuda_bench.txt" || status=1
if [ -f .gpu/gpu_anchors.py ] && [ "${GPU_JOB_PEERS:-1}" = 1 ]; then
  echo "== PyTorch peers (gpu_anchors.py) =="
  PYTHONUNBUFFERED=1 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1 || status=1
  tail -n 30 "$OUT/gpu_anchors.txt"
  # cider's peers for shapes gpu_anchors.py does not time: causal prefill SDPA, bf16 GEMV at the model's other shapes.
  for peer in attn_prefill_peer gemv_shapes_peer; do
    PYTHONUNBUFFERED=1 python3 "tools/gpu/$peer.py" > "$OUT/$peer.txt" 2>&1 || status=1
  done
fi
[ -f "$OUT/cuda_bench.json" ] && [ -f "$OUT/gpu_anchors.json" ] && python3 tools/gpu/compare.py "$OUT/cuda_bench.json" \
  "$OUT/gpu_anchors.json" $(ls "$OUT"/attn_prefill_peer.json "$OUT"/gemv_shapes_peer.json 2>/dev/null) | tee "$OUT/compare.txt"
exit $status
