#!/usr/bin/env bash
# GPU job 16 (2026-11-30, session 3): the final code's GEMV, model and PDL tests (the GEMV test gained M = 1 cases past
# the row kernel's K limit; the launchers gained the rows-per-task bench knob since job 12).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
for n in test_cuda_gemv test_cuda_model test_cuda_pdl test_cuda_attention; do
  ( timeout 240 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE -A3 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -30
# The CLI end to end on the GPU (embedded tiny model; its GEMVs are M = 1: the row kernel).
for w in w8a8 w4a8; do
  timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights $w --temperature 0 --max-tokens 32 \
    -p "Once upon a time" > "$OUT/generate_$w.txt" 2>&1; echo "generate $w rc=$?"; tail -2 "$OUT/generate_$w.txt" | cut -c1-200
done
echo "total $(( $(date +%s) - T0 )) s"
