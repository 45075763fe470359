#!/usr/bin/env bash
# GPU job 30 (2026-11-30, session 5): what sampling on the device is worth per generated token. Llama-3-8B shapes,
# W8A8 + K8V4, KV 1024: the decode step plus the default sampler, host-timed over 64 steps, with the sampler fed the
# device's top-40 candidates or the whole row copied to the host; and the graph-only decode step for reference.
# (Carry .gpu30: cuda_bench alone.)
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "Model name" | head -1
[ -d .gpu30/bin ] || tar -C .gpu30 -xJf .gpu30/bin.tar.xz
B=.gpu30/bin
timeout 400 $B/cuda_bench --json "$OUT/generate.json" --filter "model generate llama3-8b" > "$OUT/generate.txt" 2>&1; echo "rc=$?"
timeout 150 $B/cuda_bench --filter "model decode llama3-8b w8a8 k8v4 L1024" >> "$OUT/generate.txt" 2>&1; echo "rc=$?"
grep -E "^model" "$OUT/generate.txt" | grep -v "v:" | cut -c1-170
echo "total $(( $(date +%s) - T0 )) s"
