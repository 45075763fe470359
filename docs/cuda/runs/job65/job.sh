#!/usr/bin/env bash
# GPU job 65 (2026-11-30, session 9): the general kernel takes split_range only with a device length (else the plan's
# pieces, as before: job 64 kept the plain bf16 D128 L32768 row 11 % slower at either quantum). Tests (attention,
# model), the plain-bf16 A/B against f1565ff's kernels, the model bf16 rows, and the W4A8 / W8A8 M1 GEMV rows at three
# sizes beside the load-only roofs and gpu_anchors.py's bf16 GEMV.
# Carry .gpu65 (bin.tar.xz: cuda_bench, cuda_bench_old, test_cuda_attention, test_cuda_model; gpu_anchors.py).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu65/bin ] || tar -C .gpu65 -xJf .gpu65/bin.tar.xz
B=.gpu65/bin
for n in test_cuda_attention test_cuda_model; do
  ( timeout 300 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -40
(cd "$OUT" && tar -czf tests_logs.tgz test_cuda_*.log && rm -f test_cuda_*.log)
echo "== attention A/B ($(( $(date +%s) - T0 )) s)"
for round in 1 2; do
  for v in old new; do
    bin=$B/cuda_bench; [ $v = old ] && bin=$B/cuda_bench_old
    for c in "plain-bf16 B1 Hq32 Hkv8 D128 L32768" "plain-bf16 B1 Hq16 Hkv2 D256 L65536" "K4V3 B1 Hq32 Hkv8 D128 L32768" "K4V3 B1 Hq32 Hkv8 D128 L32769 in a 65536 plan"; do
      timeout 30 $bin --filter "=attention decode $c" 2>&1 | grep -E "^attention" | awk -v v=$v -v r=$round '{for (i = 4; i <= NF; ++i) if ($i ~ /^[0-9.]+$/) break; s = ""; for (j = 4; j < i; ++j) s = s " " $j; printf "%s r%s%s %s\n", v, r, s, $i}'
    done
  done
done
echo "== model ($(( $(date +%s) - T0 )) s)"
for round in 1 2; do
  for c in "bf16 kv-bf16 L20000" "bf16 kv-bf16 L32768" "bf16 kv-bf16 L1024" "w8a8 k8v4 L20000"; do
    for v in new old; do
      bin=$B/cuda_bench; [ $v = old ] && bin=$B/cuda_bench_old
      timeout 60 $bin --filter "=model decode llama3-8b $c" 2>&1 | grep -E "^model" | sed "s/^/$v r$round /" | cut -c1-150
    done
  done
done
echo "== gemv ($(( $(date +%s) - T0 )) s)"
timeout 60 $B/cuda_bench --json "$OUT/gemv_roof.json" --filter "gemv roof" 2>&1 | grep -E "^linear" | cut -c1-110
for c in "w4a8 gemv M1 K4096 N4096" "w4a8 gemv M1 K4096 N14336" "w4a8 gemv M1 K8192 N28672" "w8a8 gemv M1 K4096 N4096" "w8a8 gemv M1 K4096 N14336" "w8a8 gemv M1 K8192 N28672"; do
  for round in 1 2; do timeout 30 $B/cuda_bench --filter "=$c" 2>&1 | grep -E "^linear" | cut -c1-120; done
done
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu65/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1; echo "anchors rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E "GEMV|copy" "$OUT/gpu_anchors.txt"
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
