#!/usr/bin/env bash
# GPU job 29 (2026-11-30, session 5): sampling on the device. cuda::topk_logits (kernels/cuda/topk.cu) and the
# generation loop's device candidates (GpuSession::candidates). Every CUDA test program (the final tree of the
# session: the GEMM of jobs 26–28 included), compute-sanitizer on the top-k tests, the top-k benchmark rows beside
# argmax, and `cider generate --device cuda` with the default sampler and greedy on the embedded model.
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
  ( timeout 200 $t --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE -B2 -A6 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
echo "== sanitizer ($(( $(date +%s) - T0 )) s)"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  timeout 150 $SAN --tool $tool $B/test_cuda_ops --gtest_brief=1 --gtest_filter='CudaOps.Topk*:-*LargeVocab*' > "$OUT/san_$tool.log" 2>&1
  echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')"
done
timeout 150 $SAN --tool memcheck $B/test_cuda_model --gtest_brief=1 --gtest_filter='CudaModel.DeviceSampling*' > "$OUT/san_model.log" 2>&1
echo "sanitizer memcheck model rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_model.log" | tr '\n' ' ')"
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 100 $B/cuda_bench --json "$OUT/topk.json" --filter "topk_logits" > "$OUT/topk.txt" 2>&1; echo "rc=$?"
timeout 60 $B/cuda_bench --filter "argmax" >> "$OUT/topk.txt" 2>&1
grep -E "^ops" "$OUT/topk.txt" | cut -c1-150
echo "== generate ($(( $(date +%s) - T0 )) s)"
G=$OUT/generate.txt; : > "$G"
for args in "--weights w8a8" "--weights w8a8 --temperature 0" "--weights w8a8 --repeat-penalty 1.2" "--weights bf16 --kv bf16 --top-k 0"; do
  echo "-- $args" >> "$G"
  timeout 60 $B/cider generate -m models/cider-tiny --device cuda $args --seed 3 --max-tokens 48 \
    -p "Once upon a time" >> "$G" 2>&1; echo "rc=$?" >> "$G"
done
cut -c1-220 "$G"
(cd "$OUT" && tar -czf logs.tgz *.log topk.txt && rm -f *.log topk.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
