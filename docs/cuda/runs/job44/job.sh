#!/usr/bin/env bash
# GPU job 44 (2026-11-30, session 6): where the fused quantization's extra time goes — an experiment build (not
# committed: a CIDER_FUSED_DEBUG bit mask read by the launcher, wrong results on purpose) that removes one piece at a
# time: 1 = no fences after a row, 2 = no early weight copies, 4 = the producer does not wait for the rows, 8 = the
# quantizer warps claim and count rows without loading or writing them. (Carry .gpu44: that cuda_bench.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -d .gpu44/bin ] || tar -C .gpu44 -xJf .gpu44/bin.tar.xz
B=.gpu44/bin
$B/cuda_bench --filter "w8a8 gemm only M" 2>&1 | grep -E "^gemm" | cut -c1-90
for d in 0 1 2 4 8 12 3 15; do
  CIDER_FUSED_DEBUG=$d timeout 60 $B/cuda_bench --filter "v:fused quantization" 2>&1 | grep -E "^gemm" | grep -v g128 | sed "s/^/dbg=$d /" | cut -c1-100
done
