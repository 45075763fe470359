#!/usr/bin/env bash
# GPU job 6 (2026-11-30, session 2): every CUDA test (the 7 programs at once: correctness only), then ALONE on the
# machine every cider benchmark (GEMV tile-group variants, tensor-core prefill attention, model decode/prefill with
# their A/B rows), the PyTorch peers (gpu_anchors.py + the causal SDPA prefill peer), one comparison table, and
# compute-sanitizer on this session's new tests in the time left.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin; T=$OUT/tests.log; : > "$T"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for t in $B/test_cuda_*; do
  n=$(basename "$t")
  ( timeout 240 "$t" --gtest_brief=1 > /tmp/$n.log 2>&1; echo $? > /tmp/$n.rc ) &
done
wait
for t in $B/test_cuda_*; do
  n=$(basename "$t"); rc=$(cat /tmp/$n.rc)
  cat /tmp/$n.log >> "$T"
  echo "$n rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' /tmp/$n.log | tr '\n' ' ')"
  [ "$rc" = 0 ] || grep -E "Failure|exception|Expected|actual|Which is|FAILED|error" /tmp/$n.log | head -16
done
echo "== bench ($(el) s)"
timeout 260 $B/cuda_bench --json "$OUT/cuda_bench.json" > "$OUT/cuda_bench.txt" 2>&1; echo "bench rc=$?"
echo "== peers ($(el) s)"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1; echo "anchors rc=$?"
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/attn_prefill_peer.py > "$OUT/attn_prefill_peer.txt" 2>&1; echo "prefill peer rc=$?"
python3 tools/gpu/compare.py "$OUT/cuda_bench.json" "$OUT/gpu_anchors.json" "$OUT/attn_prefill_peer.json" > "$OUT/compare.txt" 2>&1
grep -E "^(w8a8 gemv M1 K4096 N14336|w4a8 gemv M1 K4096 N14336|attention prefill|attention decode K4V3 B1 Hq32 Hkv8 D128 L32768 )" "$OUT/compare.txt" | cut -c1-150
grep -E "^model" "$OUT/cuda_bench.txt" | cut -c1-160
left=$(( 570 - $(el) ))
echo "== sanitizers on the new tests ($(el) s, ${left} s left)"
if [ $left -gt 40 ]; then
  for spec in "memcheck test_cuda_gemv *TileGroups*:*SplitEnvironment*" "racecheck test_cuda_gemv *TileGroups*" \
              "memcheck test_cuda_attention *Prefill*" "racecheck test_cuda_attention *Prefill*"; do
    set -- $spec
    ( timeout $left compute-sanitizer --tool $1 --error-exitcode 9 $B/$2 --gtest_filter="$3" --gtest_brief=1 > /tmp/s_$1_$2.log 2>&1
      echo "$1 $2 $3 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s_$1_$2.log | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' /tmp/s_$1_$2.log | tr '\n' ' ')" > /tmp/s_$1_$2.rc ) &
  done
  wait
  cat /tmp/s_*.rc | tee "$OUT/sanitize_summary.txt"
  for f in /tmp/s_*.log; do grep -qE "ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]" "$f" && { echo "---- $f"; grep -E "Error|Hazard|Invalid|at 0x" "$f" | head -12; }; done
fi
echo "total $(el) s"
