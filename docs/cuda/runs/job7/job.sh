#!/usr/bin/env bash
# GPU job 7 (2026-11-30, session 2): the GEMV default is now 4 warps per tile (job 6's variant rows). Re-run the GEMV
# and model tests, the whole-model decode rows with that default (and $CIDER_GEMV_SPLIT=16 as the A/B), the M1 GEMV
# rows, and `cider generate --device cuda` on the embedded model.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
for n in test_cuda_gemv test_cuda_model; do
  ( timeout 120 $B/$n --gtest_brief=1 > /tmp/$n.log 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/$n.log | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE "Failure|FAILED" /tmp/test_cuda_*.log | head
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 150 $B/cuda_bench --filter "model decode llama3-8b" --json "$OUT/model.json" > "$OUT/model.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/model.txt" | cut -c1-140
timeout 60 $B/cuda_bench --filter "gemv M1 K4096 N14336" > "$OUT/gemv.txt" 2>&1; echo "rc=$?"
grep -vE "v:(register|quantize|8warps)" "$OUT/gemv.txt" | cut -c1-110
for w in w8a8 w4a8; do
  timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights $w --temperature 0 --max-tokens 32 \
    -p "Once upon a time" > "$OUT/generate_$w.txt" 2>&1; echo "generate $w rc=$?"; tail -3 "$OUT/generate_$w.txt" | cut -c1-200
done
echo "total $(( $(date +%s) - T0 )) s"
