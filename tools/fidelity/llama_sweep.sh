#!/usr/bin/env bash
# Side-by-side KV-cache fidelity in llama.cpp (built outside the repository by build_llama_cpp.sh):
# first its own f16-KV run, saved as the KL base (--kl-divergence-base), then one --kl-divergence run per KV type
# with its Hadamard KV rotation on (its default for quantized caches) and off (LLAMA_ATTN_ROT_DISABLE=1).
#
# Usage: tools/fidelity/llama_sweep.sh LLAMA_PERPLEXITY MODEL TEXT CTX CHUNKS OUTDIR TYPE...   (TYPE e.g. q4_0;
#   K and V get the same type; TYPE may be K/V, e.g. q8_0/q4_0). Resumable: finished outputs are skipped.
set -euo pipefail
LP=$1 MODEL=$2 TEXT=$3 CTX=$4 CHUNKS=$5 OUT=$6
shift 6
THREADS=${THREADS:-2}
mkdir -p "$OUT"
BASE="$OUT/base_f16.kld"
# --no-repack: no extra CPU buffer types; on this VM the AMX buffer type (picked by -DGGML_NATIVE=ON, the CPU
# advertises AMX) segfaults in ggml_backend_amx_mul_mat. Repacking only changes speed.
common=(-m "$MODEL" -c "$CTX" --chunks "$CHUNKS" -fa on -t "$THREADS" -b "$CTX" -ub "$CTX" --no-repack)
run() {  # name, env-prefix (or ""), args...
  local name=$1 envs=$2; shift 2
  local f="$OUT/$name.txt"
  if [ -s "$f" ] && grep -q -E '(Final estimate|Mean    KLD)' "$f"; then echo "skip $name"; return; fi
  { echo "# command: ${envs:+$envs }$LP $*"; echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  load: $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$f.tmp"
  local start; start=$(date +%s)
  if env $envs "$LP" "$@" >> "$f.tmp" 2>&1; then
    echo "# wall_s: $(( $(date +%s) - start ))" >> "$f.tmp"; mv "$f.tmp" "$f"
    echo "done $name ($(( $(date +%s) - start )) s): $(grep -E '(Final estimate|Mean    KLD|Same top p|Mean PPL\(Q\)  )' "$f" | tr '\n' ' ')"
  else
    echo "FAILED $name: $(tail -3 "$f.tmp")"; mv "$f.tmp" "$f.failed"
  fi
}
# the base: f16 K/V, perplexity over the text, log-probabilities saved
run base_f16 "" "${common[@]}" -f "$TEXT" -ctk f16 -ctv f16 --kl-divergence-base "$BASE"
for t in "$@"; do
  k=${t%%/*}; v=${t##*/}
  run "kld_${k}_${v}_rot" "" "${common[@]}" -ctk "$k" -ctv "$v" --kl-divergence-base "$BASE" --kl-divergence
  if [ "$k" != f16 ] || [ "$v" != f16 ]; then
    run "kld_${k}_${v}_norot" "LLAMA_ATTN_ROT_DISABLE=1" "${common[@]}" -ctk "$k" -ctv "$v" --kl-divergence-base "$BASE" --kl-divergence
  fi
done
