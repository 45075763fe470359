#!/usr/bin/env bash
# GPU job 34 (2026-11-30, session 5): where the final W8A8 GEMM and topk_logits spend their time, for the next session:
# Nsight Compute warp-state statistics and per-SASS-instruction stall samples (source page, CSV). (Carry .gpu30:
# cuda_bench of the final kernels.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu30/bin ] || tar -C .gpu30 -xJf .gpu30/bin.tar.xz
B=.gpu30/bin
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
prof() {  # name kernel-regex bench-filter
  timeout 100 $NCU --clock-control none --cache-control none -k "regex:$2" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters -o "/tmp/$1" -f \
    $B/cuda_bench --filter "$3" > "$OUT/$1.log" 2>&1
  echo "$1 rc=$?"
  $NCU --import "/tmp/$1.ncu-rep" --print-details all > "$OUT/$1.txt" 2>&1
  $NCU --import "/tmp/$1.ncu-rep" --page source --csv --print-source sass > "$OUT/$1_sass.csv" 2>&1
  grep -E "Duration|Stall|Warp Cycles Per Issued" "$OUT/$1.txt" | cut -c1-120 | head -16
  ls -la "$OUT/$1_sass.csv" | awk '{print $5}'
}
prof gemm wgmma_int8_gemm "w8a8 gemm only M2048 K4096 N14336"
prof topk "topk_" "topk_logits V128256 k40"
echo "total $(( $(date +%s) - T0 )) s"
