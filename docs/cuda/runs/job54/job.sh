#!/usr/bin/env bash
# GPU job 54 (2026-11-30, session 8): value codes as f16 subnormals in the decode attention kernel (one LOP3 per two
# codes; accumulator rows scaled by 2^(24 − bit position) after the loop), 2-stage / one-more-CTA variant
# ($CIDER_ATTN_TC_STAGES=2), the prefill workspace fix of session 7 (CudaModel.PrefillTailChunksOfEveryLength).
#   PHASE=tests: every CUDA test program in parallel, compute-sanitizer memcheck + racecheck on the decode tests.
#   PHASE=bench: attention decode rows (new and session 7's cuda_bench_base), SDPA peers, model decode rows.
# Carry .gpu54 (bin.tar.xz: the test programs, cuda_bench, cuda_bench_base, cider; gpu_anchors.py).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu54/bin ] || tar -C .gpu54 -xJf .gpu54/bin.tar.xz
B=.gpu54/bin
if [ "${PHASE:-tests}" = tests ]; then
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  F='CudaAttention.TensorCoreDecodeTwoStages:CudaAttention.TensorCoreDecodePath:CudaAttention.TensorCoreDecodePathK8V4'
  for tool in memcheck racecheck; do
    ( timeout 420 $SAN --tool $tool $B/test_cuda_attention --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
  done
  for t in $B/test_cuda_*; do
    n=$(basename $t)
    ( timeout 400 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
  done
  wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -60
  (cd "$OUT" && tar -czf tests_logs.tgz *.log && rm -f *.log)
else
  for v in base new; do
    bin=$B/cuda_bench; [ $v = base ] && bin=$B/cuda_bench_base
    timeout 100 $bin --json "$OUT/attn_$v.json" --filter "attention decode" > "$OUT/attn_$v.txt" 2>&1; echo "attn $v rc=$? ($(( $(date +%s) - T0 )) s)"
  done
  PYTHONUNBUFFERED=1 timeout 110 python3 .gpu54/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1; echo "anchors rc=$? ($(( $(date +%s) - T0 )) s)"
  python3 tools/gpu/compare.py "$OUT/attn_new.json" "$OUT"/gpu_anchors.json > "$OUT/compare.txt" 2>&1
  grep -E "attention decode" "$OUT/compare.txt" | cut -c1-150
  echo "== base (session 7 binary)"; grep -E "^attention" "$OUT/attn_base.txt" | cut -c1-100
  echo "== model ($(( $(date +%s) - T0 )) s)"
  for c in "w8a8 k8v4 L1024" "w8a8 k8v4 L32768" "w4a8 k4v3 L1024" "w4a8 k4v3 L32768"; do
    timeout 60 $B/cuda_bench_base --json "$OUT/model_base_${c// /_}.json" --filter "=model decode llama3-8b $c" 2>&1 | grep -E "^model" | sed 's/^/base /' | cut -c1-130
    timeout 60 $B/cuda_bench --json "$OUT/model_new_${c// /_}.json" --filter "=model decode llama3-8b $c" 2>&1 | grep -E "^model" | sed 's/^/new  /' | cut -c1-130
    CIDER_ATTN_TC_STAGES=2 timeout 60 $B/cuda_bench --json "$OUT/model_st2_${c// /_}.json" --filter "=model decode llama3-8b $c" 2>&1 | grep -E "^model" | sed 's/^/st2  /' | cut -c1-130
  done
  (cd "$OUT" && tar -czf bench_logs.tgz *.txt && rm -f attn_*.txt gpu_anchors.txt)
fi
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
