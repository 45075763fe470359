#!/usr/bin/env bash
# GPU job 68 (2026-11-30, session 9): `cider generate --device cuda` end to end on the final tree with the embedded
# model (bf16, w8a8, w4a8 weights, the default k8v4/Hadamard cache, greedy), a prompt longer than one 256-token
# prefill chunk (--prefill-chunk 256) and the same prompt on the CPU for comparison. Carry .gpu68 (bin: cider).
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -d .gpu68/bin ] || tar -C .gpu68 -xJf .gpu68/bin.tar.xz
B=.gpu68/bin
G=$OUT/generate.txt; : > "$G"
for w in bf16 w8a8 w4a8; do
  echo "-- --weights $w --device cuda" >> "$G"
  timeout 60 $B/cider generate -m models/cider-tiny --device cuda --weights $w --temperature 0 --max-tokens 32 \
    -p "Once upon a time" >> "$G" 2>&1; echo "rc=$?" >> "$G"
done
P=$(head -c 1500 models/cider-tiny/samples.txt | tr '\n' ' ')
for d in cuda cpu; do
  echo "-- long prompt (1500 characters), --weights w8a8 --device $d --prefill-chunk 256" >> "$G"
  timeout 60 $B/cider generate -m models/cider-tiny --device $d --weights w8a8 --temperature 0 --max-tokens 24 \
    --prefill-chunk 256 -p "$P" 2>&1 | tail -c 400 >> "$G"; echo "rc=$?" >> "$G"
done
cat "$G"
