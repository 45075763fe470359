#!/usr/bin/env bash
# GPU job 15 (2026-11-30, session 3): two A/B questions, benchmarks only (the kernels are job 12's; the new knobs only
# choose among instantiations the tests already cover). (1) Row GEMV kernel, rows per warp task forced to 1 for W4
# K4096 (rule: 2) and 2 for W8 K4096 (rule: 1). (2) Model decode with the decode attention's merge folded into the
# kernel ($CIDER_ATTN_TC_FOLD=1) at 1k (8 splits per head) and 32k, next to the default rows. Plus the GEMV rows'
# bf16 peer (gpu_anchors.py).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
timeout 60 $B/test_cuda_gemv --gtest_brief=1 --gtest_filter='CudaGemv.KernelEnvironmentSwitch:CudaGemv.SpecialActivationRows' 2>&1 | tail -2
for f in "w4a8 gemv M1 K4096 N14336" "w4a8 gemv g64 M1 K4096 N14336" "w4a8 gemv M1 K4096 N4096" "w8a8 gemv M1 K4096 N14336"; do
  timeout 40 $B/cuda_bench --filter "$f" 2>&1 | grep -E "^linear" | grep -vE "v:(register|quantize|8warps|split|no epilogue|no pdl)"
done | tee "$OUT/gemv.txt"
for f in "w8a8 k8v4 L1024" "w4a8 k4v3 L1024" "w8a8 k8v4 L32768"; do
  timeout 60 $B/cuda_bench --filter "model decode llama3-8b $f" 2>&1 | grep -E "^model" | grep -vE "split| no-|linear only|so4|no pdl"
done | tee "$OUT/model.txt"
PYTHONUNBUFFERED=1 timeout 120 python3 .gpu/gpu_anchors.py > "$OUT/gpu_anchors.txt" 2>&1
grep -E "GEMV" "$OUT/gpu_anchors.txt"
echo "total $(( $(date +%s) - T0 )) s"
