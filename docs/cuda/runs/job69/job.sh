#!/usr/bin/env bash
# GPU job 69 (2026-11-30, session 9): where the B1 decode call's fixed cost goes. Nsight Compute durations of the two
# kernels of one call (attention_tc_kernel, merge4_kernel), each in isolation (ncu serializes; no PDL overlap), at
# L 1024 / 8192 / 32768 / 131072 (K4V3 B1 Hq32 Hkv8 D128), beside the graph-timed call of job 63 / 67.
# PREDICTED (written before the run): L32768 attention ≈ 16–18 µs, merge ≈ 2–3 µs; L1024 attention ≈ 4–5, merge ≈ 2.
# Carry .gpu69 (bin.tar.xz: cuda_bench).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu69/bin ] || tar -C .gpu69 -xJf .gpu69/bin.tar.xz
B=.gpu69/bin
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true); echo "ncu: $NCU"
for L in 1024 8192 32768 131072; do
  timeout 120 $NCU --clock-control none --cache-control none -k regex:"attention_tc|merge" --launch-skip 40 --launch-count 6 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active \
    $B/cuda_bench --filter "=attention decode K4V3 B1 Hq32 Hkv8 D128 L$L" > "$OUT/ncu_L$L.txt" 2>&1
  echo "== L$L rc=$? ($(( $(date +%s) - T0 )) s)"
  grep -E "attention_tc_kernel|merge4_kernel|merge_kernel|gpu__time_duration|dram__|sm__warps|smsp__issue|^attention" "$OUT/ncu_L$L.txt" | sed 's/  */ /g' | cut -c1-140 | head -40
done
(cd "$OUT" && tar -czf ncu_logs.tgz ncu_*.txt && rm -f ncu_*.txt)
echo "total $(( $(date +%s) - T0 )) s"
