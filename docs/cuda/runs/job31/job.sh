#!/usr/bin/env bash
# GPU job 31 (2026-11-30, session 5): whole-model decode of the session's final tree beside llama.cpp's CUDA build in
# the same call on the same GPU (as job 14 of session 3). cider: the model decode rows (W8A8 + K8V4, W4A8 + K4V3, bf16)
# at L1024 / L32768 and generation with device sampling at L1024. Then the llama.cpp peer: .peers/run_llama_cuda.sh
# (kept outside git: builds llama-bench from a trimmed llama.cpp source in /tmp, a random-weight Llama-3-8B-shape Q8_0
# GGUF, llama-bench -n 64 at depth 1024 and 32768, flash attention, KV q8_0 then f16).
# Run: run(command="bash docs/cuda/runs/job31/job.sh", carry=[".gpu30", ".peers"]).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d .gpu30/bin ] || tar -C .gpu30 -xJf .gpu30/bin.tar.xz
B=.gpu30/bin
for f in "w8a8 k8v4 L1024" "w8a8 k8v4 L32768" "w4a8 k4v3 L1024" "w4a8 k4v3 L32768" "bf16 kv-bf16 L1024" "bf16 kv-bf16 L32768"; do
  timeout 60 $B/cuda_bench --filter "model decode llama3-8b $f" 2>&1 | grep -E "^model" | grep -vE " v:| no-|linear only|so4"
done | tee "$OUT/cider_model.txt" | cut -c1-120
timeout 60 $B/cuda_bench --filter "model generate llama3-8b" 2>&1 | grep -E "^model" | tee -a "$OUT/cider_model.txt" | cut -c1-150
echo "== llama.cpp ($(( $(date +%s) - T0 )) s)"
TOTAL_BUDGET_S=$(( 570 - ($(date +%s) - T0) )) bash .peers/run_llama_cuda.sh > /dev/null 2>&1
echo "llama rc=$?"
tail -12 "$OUT/run_llama_cuda.log"
echo "total $(( $(date +%s) - T0 )) s"
