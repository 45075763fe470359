#!/usr/bin/env bash
# Greedy continuations of one prompt by Gemma 3 270M under three configurations (bf16 weights + bf16 KV,
# w8a8 weights + bf16 KV, bf16 weights + k4v3/so4-full/g64 KV). Usage: samples.sh CIDER GGUF OUTFILE
set -euo pipefail
CIDER=$1 GGUF=$2 OUT=$3
PROMPT="The Python glossary defines a decorator as"
: > "$OUT"
for cfg in "bf16 bf16" "w8a8 bf16" "bf16 k4v3"; do
  set -- $cfg
  cmd=("$CIDER" generate -m "$GGUF" --weights "$1" --kv "$2" --kv-rotation so4-full --kv-group-size 64
       --temperature 0 --max-tokens 48 --threads 1 -p "$PROMPT")
  { echo "\$ ${cmd[*]}"; "${cmd[@]}" 2>&1; echo; } >> "$OUT"
done
