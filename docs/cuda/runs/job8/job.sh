#!/usr/bin/env bash
# GPU job 8 (2026-11-30, session 2, the last device minutes): W4 per-channel GEMV with unsigned nibble codes
# (mma .u8.s8 + 8·Σx correction) and this session's host-side refactors of the attention launchers — the GEMV,
# attention and model tests, the W4A8/W8A8 GEMV rows and the W4A8 model rows, and the cuBLAS bf16 GEMV peer.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
for n in test_cuda_gemv test_cuda_attention test_cuda_model; do
  ( timeout 150 $B/$n --gtest_brief=1 > /tmp/$n.log 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/$n.log | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE "Failure|FAILED|Expected|actual" /tmp/test_cuda_*.log | head -20
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 60 $B/cuda_bench --filter "gemv M1 K4096 N14336" > "$OUT/gemv.txt" 2>&1; echo "rc=$?"
timeout 30 $B/cuda_bench --filter "w4a8 gemv M16" >> "$OUT/gemv.txt" 2>&1
timeout 30 $B/cuda_bench --filter "w4a8 gemv M1 K8192" >> "$OUT/gemv.txt" 2>&1
grep -E "^linear" "$OUT/gemv.txt" | grep -vE "v:(register|quantize|8warps)" | cut -c1-100
timeout 90 $B/cuda_bench --filter "model decode llama3-8b w4a8" > "$OUT/model.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/model.txt" | cut -c1-130
echo "== peer ($(( $(date +%s) - T0 )) s)"
PYTHONUNBUFFERED=1 timeout 100 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
grep -E "GEMV" "$OUT/gpu_anchors.txt"
echo "total $(( $(date +%s) - T0 )) s"
