#!/usr/bin/env bash
# GPU job 63 (2026-11-30, session 9): decode splits from the visible interval (attention_tc.h split_range: a device
# length below the planned bound — the model's decode-graph buckets — or a window no longer leaves splits empty), in
# the tensor-core decode kernel and the general kernel; the decode length sweep (fixed cost vs streaming rate) beside
# SDPA at the same lengths; W4A8 GEMV beside load-only roofs at three sizes.
#   PHASE=tests: test_cuda_attention, test_cuda_model; compute-sanitizer memcheck on the split/device-length tests.
#   PHASE=attn:  attention decode rows, new and HEAD's kernels (cuda_bench_old: same bench code, f1565ff's
#                attention.cu / attention_tc.cu), tools/gpu/attn_decode_peer.py, gpu_anchors.py, GEMV rows.
#   PHASE=model: model decode rows at L1024 / L20000 (bucket 32768) / L32768, new and old, each twice.
# Carry .gpu63 (bin.tar.xz: test_cuda_attention, test_cuda_model, cuda_bench, cuda_bench_old; gpu_anchors.py).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu63/bin ] || tar -C .gpu63 -xJf .gpu63/bin.tar.xz
B=.gpu63/bin
case "${PHASE:-tests}" in
tests)
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  F='CudaAttention.SplitsMergeAndDeviceLength:CudaAttention.FoldedMergeEmptySplits'
  ( timeout 420 $SAN --tool memcheck $B/test_cuda_attention --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_memcheck.log" 2>&1; echo "memcheck rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_memcheck.log" | tr '\n' ' ')" > /tmp/san.rc ) &
  for n in test_cuda_attention test_cuda_model; do
    ( timeout 420 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
  done
  wait; cat /tmp/test_cuda_*.rc /tmp/san.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -60
  (cd "$OUT" && tar -czf tests_logs.tgz *.log && rm -f *.log) ;;
attn)
  for v in new old; do
    bin=$B/cuda_bench; [ $v = old ] && bin=$B/cuda_bench_old
    timeout 120 $bin --json "$OUT/attn_$v.json" --filter "attention decode" > "$OUT/attn_$v.txt" 2>&1; echo "attn $v rc=$? ($(( $(date +%s) - T0 )) s)"
  done
  timeout 60 $B/cuda_bench --json "$OUT/gemv.json" --filter "gemv roof" > "$OUT/gemv_roof.txt" 2>&1
  for c in "w4a8 gemv M1 K4096 N4096" "w4a8 gemv M1 K4096 N14336" "w4a8 gemv M1 K8192 N28672" "w8a8 gemv M1 K4096 N14336"; do
    timeout 30 $B/cuda_bench --filter "=$c" 2>&1 | grep -E "^w[48]a8"
  done > "$OUT/gemv_rows.txt"; echo "gemv ($(( $(date +%s) - T0 )) s)"
  PYTHONUNBUFFERED=1 timeout 120 python3 tools/gpu/attn_decode_peer.py > "$OUT/attn_decode_peer.txt" 2>&1; echo "sdpa sweep rc=$? ($(( $(date +%s) - T0 )) s)"
  PYTHONUNBUFFERED=1 timeout 120 python3 .gpu63/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1; echo "anchors rc=$? ($(( $(date +%s) - T0 )) s)"
  python3 tools/gpu/compare.py "$OUT/attn_new.json" "$OUT/attn_decode_peer.json" "$OUT/gpu_anchors.json" > "$OUT/compare.txt" 2>&1
  python3 tools/gpu/compare.py "$OUT/attn_old.json" "$OUT/attn_decode_peer.json" "$OUT/gpu_anchors.json" > "$OUT/compare_old.txt" 2>&1
  cut -c1-150 "$OUT/compare.txt"; cat "$OUT/attn_decode_peer.txt"
  echo "== new / old, every decode row (us)"
  python3 - "$OUT/attn_new.json" "$OUT/attn_old.json" <<'PY'
import json, sys
n, o = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
for k, r in n.items():
    print(f"{k:80s} {r['s']*1e6:8.2f} {o.get(k, {}).get('s', float('nan'))*1e6:8.2f}")
PY
  cat "$OUT/gemv_roof.txt" "$OUT/gemv_rows.txt" | cut -c1-140 ;;
model)
  for round in 1 2; do
    for c in "w4a8 k4v3 L20000" "w4a8 k4v3 L32768" "w8a8 k8v4 L20000" "w8a8 k8v4 L32768" "bf16 kv-bf16 L20000" "bf16 kv-bf16 L32768" "w4a8 k4v3 L1024"; do
      for v in new old; do
        bin=$B/cuda_bench; [ $v = old ] && bin=$B/cuda_bench_old
        timeout 60 $bin --filter "=model decode llama3-8b $c" 2>&1 | grep -E "^model" | sed "s/^/$v r$round /" | cut -c1-140
      done
    done
  done ;;
esac
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
