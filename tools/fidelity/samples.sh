#!/usr/bin/env bash
# Greedy continuations of one prompt by Gemma 3 270M under four configurations (bf16 weights + bf16 KV,
# w8a8 weights + bf16 KV, bf16 weights + k4v3/so4-full/g64 KV (the old default), bf16 weights + k8v4/hadamard/g64 KV
# (the default)). Usage: samples.sh CIDER GGUF OUTFILE
set -euo pipefail
CIDER=$1 GGUF=$2 OUT=$3
PROMPT="The Python glossary defines a decorator as"
: > "$OUT"
for cfg in "bf16 bf16 so4-full" "w8a8 bf16 so4-full" "bf16 k4v3 so4-full" "bf16 k8v4 hadamard"; do
  set -- $cfg
  cmd=("$CIDER" generate -m "$GGUF" --weights "$1" --kv "$2" --kv-rotation "$3" --kv-group-size 64
       --temperature 0 --max-tokens 48 --threads 1 -p "$PROMPT")
  { echo "\$ ${cmd[*]}"; "${cmd[@]}" 2>&1; echo; } >> "$OUT"
done
