#!/usr/bin/env bash
# GPU job 59 (2026-11-30, session 8): software-pipelined decode attention (scores of tile i + 1 beside the softmax
# and P·V of tile i). test_cuda_attention, test_cuda_model, test_cuda_pdl; memcheck + racecheck on the decode tests;
# then the decode rows of this tree and of job 58's binary (cuda_bench_base), alternating twice, and the model
# decode rows of both. Carry .gpu59.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu59/bin ] || tar -C .gpu59 -xJf .gpu59/bin.tar.xz
B=.gpu59/bin
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaAttention.TensorCoreDecodePackedAndUnpackedLayouts:CudaAttention.TensorCoreDecodePath:CudaAttention.TensorCoreDecodePathK8V4:CudaAttention.FoldedMergeEmptySplits'
for tool in memcheck racecheck; do
  ( timeout 300 $SAN --tool $tool $B/test_cuda_attention --gtest_brief=1 --gtest_filter="$F" > "$OUT/san_$tool.log" 2>&1; echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$OUT/san_$tool.log" | tr '\n' ' ')" > /tmp/san_$tool.rc ) &
done
for n in test_cuda_attention test_cuda_model test_cuda_pdl; do
  ( timeout 300 $B/$n --gtest_brief=1 > "$OUT/$n.log" 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$n.log" | tr '\n' ' ')" > /tmp/$n.rc ) &
done
wait; cat /tmp/test_cuda_*.rc /tmp/san_*.rc; grep -hE -B2 -A8 "Failure|FAILED" "$OUT"/test_cuda_*.log | head -30
echo "== A/B ($(( $(date +%s) - T0 )) s)"
for round in 1 2; do
  for v in base new; do
    bin=$B/cuda_bench; [ $v = base ] && bin=$B/cuda_bench_base
    for c in "K4V3 B1 Hq32 Hkv8 D128 L32768" "K4V3 B8 Hq32 Hkv8 D128 L32768" "K4V3 B1 Hq32 Hkv8 D128 L131072" "K4V3 B1 Hq64 Hkv8 D128 L8192" "K8V4 B1 Hq32 Hkv8 D128 L32768" "K8V4 B1 Hq32 Hkv8 D128 L131072" "K4V3 B1 Hq16 Hkv2 D256 L65536" "K8V4 B1 Hq16 Hkv2 D256 L65536" "K4V3 B8 Hq16 Hkv2 D256 L65536"; do
      timeout 30 $bin --filter "=attention decode $c" 2>&1 | grep -E "^attention" | awk -v v=$v -v r=$round '{for (i = 4; i <= NF; ++i) if ($i ~ /^[0-9.]+$/) break; printf "%s r%s %s %s %s %s %s %s %s\n", v, r, $4, $5, $6, $7, $8, $9, $i}'
    done
  done
done
echo "== model ($(( $(date +%s) - T0 )) s)"
for c in "w8a8 k8v4 L1024" "w8a8 k8v4 L32768" "w4a8 k4v3 L1024" "w4a8 k4v3 L32768"; do
  for v in base new; do
    bin=$B/cuda_bench; [ $v = base ] && bin=$B/cuda_bench_base
    timeout 60 $bin --filter "=model decode llama3-8b $c" 2>&1 | grep -E "^model" | sed "s/^/$v /" | cut -c1-110
  done
done
(cd "$OUT" && tar -czf logs.tgz *.log && rm -f *.log)
echo "total $(( $(date +%s) - T0 )) s"
