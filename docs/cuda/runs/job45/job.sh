#!/usr/bin/env bash
# GPU job 45 (2026-11-30, session 6): the spread of the default W8A8 GEMM M2048 K4096 N14336 (quantization kernel in
# front): jobs 35–43 measured 193.4–202.8 µs while the GEMM alone stayed at 182 µs. Four rounds in one call of the full
# case, the GEMM alone and the quantization alone, interleaved with the `_int_mm` peer, plus the clocks reported by
# nvidia-smi. (Carry .gpu43: cuda_bench of d123114, whose default path is HEAD's.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -d .gpu43/bin ] || tar -C .gpu43 -xJf .gpu43/bin.tar.xz
B=.gpu43/bin
for r in 1 2 3 4; do
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader | sed "s/^/round $r clocks: /"
  for f in "w8a8 gemm M2048 K4096 N14336" "w8a8 gemm only M2048 K4096 N14336" "quantize_rows_int8 bf16 M2048"; do
    timeout 60 $B/cuda_bench --filter "$f" 2>&1 | grep -E "^gemm" | grep -vE "mma.sync|v:" | sed "s/^/round $r /" | cut -c1-95
  done
  PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/gemm_peer.py 2>&1 | grep "int8 _int_mm M2048" | sed "s/^/round $r /"
done | tee "$OUT/spread.txt"
