#!/usr/bin/env bash
# GPU job 14 (2026-11-30, session 3): whole-model decode, cider and llama.cpp CUDA in the same call on the same GPU.
# cider: the model decode rows (W8A8 + K8V4, W4A8 + K4V3, bf16) at L1024 / L32768 with the row GEMV kernel of job 12
# (the code job 12 tested). Then the llama.cpp peer: .peers/run_llama_cuda.sh (kept outside git: builds llama-bench
# from a trimmed llama.cpp source in /tmp, a random-weight Llama-3-8B-shape Q8_0 GGUF, llama-bench -n 64 at depth
# 1024 and 32768, flash attention, KV q8_0 then f16). Run: run(command="bash docs/cuda/runs/job14/job.sh",
# carry=[".gpu", ".peers"]).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
[ -d .gpu/bin ] || tar -C .gpu -xJf .gpu/bin.tar.xz
B=.gpu/bin
for f in "w8a8 k8v4 L1024" "w8a8 k8v4 L32768" "w4a8 k4v3 L1024" "w4a8 k4v3 L32768" "bf16 kv-bf16 L1024" "bf16 kv-bf16 L32768"; do
  timeout 60 $B/cuda_bench --filter "model decode llama3-8b $f" 2>&1 | grep -E "^model" | grep -vE " v:| no-|linear only|so4"
done | tee "$OUT/cider_model.txt"
echo "== llama.cpp ($(( $(date +%s) - T0 )) s)"
TOTAL_BUDGET_S=$(( 560 - ($(date +%s) - T0) )) bash .peers/run_llama_cuda.sh > /dev/null 2>&1
echo "llama rc=$?"
tail -12 "$OUT/run_llama_cuda.log"
echo "total $(( $(date +%s) - T0 )) s"
