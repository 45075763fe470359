#!/usr/bin/env bash
# GPU job 33 (2026-11-30, session 5): the final sampler (host top-k through the device path's code) on the GPU:
# test_cuda_model (device sampling = whole-row sampling through generate, every model comparison) and
# `cider generate --device cuda` with the default sampler and greedy. (Carry .gpu33: test_cuda_model and cider.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu33/bin ] || tar -C .gpu33 -xJf .gpu33/bin.tar.xz
B=.gpu33/bin
timeout 150 $B/test_cuda_model --gtest_brief=1 > "$OUT/test_cuda_model.log" 2>&1
echo "test_cuda_model rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_model.log" | tr '\n' ' ') ($(( $(date +%s) - T0 )) s)"
grep -hE -A6 "Failure|FAILED" "$OUT/test_cuda_model.log" | head -20
for args in "" "--temperature 0"; do
  timeout 30 $B/cider generate -m models/cider-tiny --device cuda --weights w8a8 $args --seed 3 --max-tokens 32 \
    -p "Once upon a time" > "$OUT/g.txt" 2>&1; echo "generate [$args] rc=$?"; tail -1 "$OUT/g.txt" | cut -c1-200
done
echo "total $(( $(date +%s) - T0 )) s"
