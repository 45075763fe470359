#!/usr/bin/env bash
# GPU job 39 (2026-11-30, session 6): where the third fused version spends its time (job 38: M512 K4096 N4096 35.6 µs
# fused vs 24.3 µs with the separate kernel; M2048 K4096 N14336 209.9 vs 198.2). Nsight Compute on the fused kernel:
# speed of light, warp states, per-SASS stall samples. (Carry .gpu, packed from c28845d.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
prof() {  # name kernel-regex bench-filter
  timeout 120 $NCU --clock-control none --cache-control none -k "regex:$2" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy \
    -o "/tmp/$1" -f $B/cuda_bench --filter "$3" > "$OUT/$1.log" 2>&1
  echo "$1 rc=$?"
  $NCU --import "/tmp/$1.ncu-rep" --print-details all > "$OUT/$1.txt" 2>&1
  $NCU --import "/tmp/$1.ncu-rep" --page source --csv --print-source sass > "$OUT/$1_sass.csv" 2>&1
  grep -E "Duration|Stall|Warp Cycles Per Issued|Registers|Grid Size|Block Limit|Achieved Occ" "$OUT/$1.txt" | cut -c1-120 | head -24
  ls -la "$OUT/$1_sass.csv" | awk '{print $5}'
}
prof fused512 wgmma_int8_gemm "w8a8 gemm M512 K4096 N4096"

gzip -f "$OUT"/*_sass.csv
echo "total $(( $(date +%s) - T0 )) s"
