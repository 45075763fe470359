#!/usr/bin/env bash
# GPU job 64 (2026-11-30, session 9): job 63 found the general kernel's plain bf16 D128 L32768 row 11 % slower with
# split_range at a 32-key quantum (80.6 vs 72.8 us); this tree uses quantum 1 there (the plan's pieces when the whole
# length is visible). A/B of the plain-bf16 rows (old = f1565ff's kernels, q32 = job 63's, new = quantum 1), then the
# model decode rows at L1024 / L20000 (bucket 32768) / L32768, new and old, each twice in alternating order.
# Carry .gpu64 (bin.tar.xz: cuda_bench, cuda_bench_old, cuda_bench_q32).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu64/bin ] || tar -C .gpu64 -xJf .gpu64/bin.tar.xz
B=.gpu64/bin
for round in 1 2; do
  for v in old q32 new; do
    bin=$B/cuda_bench_$v; [ $v = new ] && bin=$B/cuda_bench
    for c in "plain-bf16 B1 Hq32 Hkv8 D128 L32768" "plain-bf16 B1 Hq16 Hkv2 D256 L65536" "K4V3 B1 Hq32 Hkv8 D128 L32768"; do
      timeout 30 $bin --filter "=attention decode $c" 2>&1 | grep -E "^attention" | awk -v v=$v -v r=$round '{for (i = 4; i <= NF; ++i) if ($i ~ /^[0-9.]+$/) break; printf "%s r%s %s %s %s %s %s %s %s\n", v, r, $3, $4, $5, $6, $7, $8, $i}'
    done
  done
done
echo "== model ($(( $(date +%s) - T0 )) s)"
for round in 1 2; do
  cases=("w4a8 k4v3 L20000" "w8a8 k8v4 L20000" "bf16 kv-bf16 L20000" "w4a8 k4v3 L32768" "w8a8 k8v4 L32768" "bf16 kv-bf16 L32768" "w4a8 k4v3 L1024")
  [ $round = 2 ] && cases=("w4a8 k4v3 L20000" "w8a8 k8v4 L20000" "bf16 kv-bf16 L20000")
  for c in "${cases[@]}"; do
    for v in new old; do
      [ $(( $(date +%s) - T0 )) -gt 530 ] && { echo "time guard: skipped $v $c"; continue; }
      bin=$B/cuda_bench; [ $v = old ] && bin=$B/cuda_bench_old
      timeout 60 $bin --filter "=model decode llama3-8b $c" 2>&1 | grep -E "^model" | sed "s/^/$v r$round /" | cut -c1-150
    done
  done
  echo "($(( $(date +%s) - T0 )) s)"
done
echo "total $(( $(date +%s) - T0 )) s"
