#!/usr/bin/env bash
# GPU job 2 of 2026-11-30: llama.cpp CUDA peer built in the background (outside the repo, from the ignored .peers/),
# meanwhile every CUDA test and every cider benchmark with the PyTorch peers; then llama-bench on the same GPU,
# after ours (never two timed runs at once).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
if [ -f .peers/run_llama_cuda.sh ]; then
  (KV_TYPES="" TOTAL_BUDGET_S=420 OUT=/tmp/llama-out bash .peers/run_llama_cuda.sh > /tmp/llama-build.log 2>&1) &
  LPID=$!
fi
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin; T=$OUT/tests.log; : > "$T"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "== tests"
for t in $B/test_cuda_*; do
  n=$(basename "$t")
  timeout 200 "$t" --gtest_brief=1 > /tmp/$n.log 2>&1; rc=$?
  cat /tmp/$n.log >> "$T"
  echo "$n rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/$n.log | tr '\n' ' ')"
  [ $rc = 0 ] || grep -E "Failure|exception|Expected|actual|Which is|FAILED|error" /tmp/$n.log | head -16
done
echo "== cider generate --device cuda"
for w in w8a8 bf16; do
  timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights $w --temperature 0 --max-tokens 32 \
    -p "Once upon a time" 2>&1 | tail -2 | cut -c1-200
done
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 240 $B/cuda_bench --json "$OUT/cuda_bench.json" > "$OUT/cuda_bench.txt" 2>&1; echo "bench rc=$?"
echo "== peers ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 150 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1; echo "peers rc=$?"
python3 tools/gpu/compare.py "$OUT/cuda_bench.json" "$OUT/gpu_anchors.json" > "$OUT/compare.txt" 2>&1
cat "$OUT/compare.txt" | cut -c1-160
grep -E "^model" "$OUT/cuda_bench.txt" | cut -c1-170
if [ -n "${LPID:-}" ]; then
  echo "== llama.cpp peer ($(( $(date +%s) - T0 )) s): waiting for its build"
  wait $LPID; tail -4 /tmp/llama-build.log
  left=$(( 590 - ($(date +%s) - T0) ))
  echo "llama bench budget ${left}s"
  [ $left -gt 60 ] && TOTAL_BUDGET_S=$left REPS=2 OUT=/tmp/llama-out2 bash .peers/run_llama_cuda.sh 2>&1 | grep -E "summary|q8_0|f16 |tok/s|FATAL|ERROR" | head -20
  cp /tmp/llama-out2/llama_cuda_summary.json /tmp/llama-out2/run_llama_cuda.log "$OUT/" 2>/dev/null
fi
echo "total $(( $(date +%s) - T0 )) s"
