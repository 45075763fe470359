#!/usr/bin/env bash
# GPU job 48 (2026-11-30, session 7): the f16-tile prefill attention kernel after job 47: back to 16 rows per warp (job 47's 32-row layout was slower), per-lane ldmatrix addresses kept across tiles, the score scale folded into the exponent (one FFMA), per-thread constant dequantization chunks; 8-warp (default) vs 12-warp CTAs (CIDER_ATTN_PREFILL_F16_WARPS=12)
# of the tensor-core prefill path; CIDER_ATTN_PREFILL_MATH=exact keeps the exact-score kernel). test_cuda_attention
# (every prefill case through f16 / exact / CUDA-core, the f16 kernel against its CPU emulation) and test_cuda_model,
# compute-sanitizer memcheck + racecheck on the small f16 test, the prefill attention rows (f16 and exact) with the
# PyTorch SDPA peer, the model prefill rows. Carry .gpu48 (test_cuda_attention, test_cuda_model, cuda_bench, cider).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
[ -d .gpu48/bin ] || tar -C .gpu48 -xJf .gpu48/bin.tar.xz
B=.gpu48/bin
for n in test_cuda_attention test_cuda_model; do
  ( timeout 300 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
( for tool in memcheck racecheck; do
    timeout 200 $SAN --tool $tool $B/test_cuda_attention --gtest_brief=1 --gtest_filter='CudaAttention.PrefillF16KernelSmall' > "$OUT/san_$tool.log" 2>&1
    echo "sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')"
  done > /tmp/san.rc ) &
wait
cat /tmp/test_cuda_*.rc /tmp/san.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -60
echo "== bench ($(( $(date +%s) - T0 )) s)"
timeout 200 $B/cuda_bench --json "$OUT/attn.json" --filter "attention prefill" > "$OUT/attn.txt" 2>&1; echo "rc=$?"
grep -E "^attention prefill" "$OUT/attn.txt" | grep -v "CUDA-core" | cut -c1-130
PYTHONUNBUFFERED=1 timeout 60 python3 tools/gpu/attn_prefill_peer.py > "$OUT/attn_prefill_peer.txt" 2>&1; echo "peer rc=$?"
grep -E "sdpa" "$OUT/attn_prefill_peer.txt" | head
python3 tools/gpu/compare.py "$OUT/attn.json" "$OUT/attn_prefill_peer.json" > "$OUT/compare.txt" 2>&1; grep -E "prefill" "$OUT/compare.txt" | cut -c1-160
echo "== ncu ($(( $(date +%s) - T0 )) s)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
prof() {  # name kernel-regex bench-filter
  timeout 100 $NCU --clock-control none --cache-control none -k "regex:$2" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis -o "/tmp/$1" -f $B/cuda_bench --filter "$3" > "$OUT/$1.log" 2>&1
  echo "$1 rc=$?"
  $NCU --import "/tmp/$1.ncu-rep" --print-details all > "$OUT/$1.txt" 2>&1
  $NCU --import "/tmp/$1.ncu-rep" --page source --csv --print-source sass > "$OUT/$1_sass.csv" 2>&1
  grep -E "Duration|Stall|Warp Cycles Per Issued|Registers|Block Limit|Achieved Occ|Shared|Issue Slots|Pipe" "$OUT/$1.txt" | cut -c1-120 | head -30
}
prof f16w8 attention_prefill_f16 "attention prefill K4V3 B1 Hq32 Hkv8 D128 L4096"
prof f16w12 attention_prefill_f16 "attention prefill K4V3 B1 Hq32 Hkv8 D128 L4096 v:f16 w12"
gzip -f "$OUT"/*_sass.csv
echo "== model ($(( $(date +%s) - T0 )) s)"
for f in "prefill llama3-8b w8a8 k8v4 n512" "prefill llama3-8b w8a8 k4v3 n4096"; do
  timeout 120 $B/cuda_bench --filter "model $f" >> "$OUT/model.txt" 2>&1; echo "rc=$?"
done
grep -hE "^model" "$OUT/model.txt" | grep -v "cuda-core" | cut -c1-160
(cd "$OUT" && tar -czf logs.tgz *.log *.txt && rm -f *.log attn.txt model.txt attn_prefill_peer.txt f16w*.txt)
ls "$OUT"
echo "total $(( $(date +%s) - T0 )) s"
