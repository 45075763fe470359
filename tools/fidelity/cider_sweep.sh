#!/usr/bin/env bash
# Runs `cider perplexity` for a list of (weights, kv, rotation, group) configurations against a baseline
# (bf16 weights + bf16 KV), once per text piece (make_windows.py: one BOS-led window per piece), JOBS at a time.
# One output file per (configuration, piece): OUTDIR/<weights>_<kv>_<rotation>_g<group>.w<NNN>.txt, skipped when it
# already holds a result, so a sweep can resume. Each file starts with the exact command, the date and ends with
# the wall time.
#
# Usage: tools/fidelity/cider_sweep.sh CIDER MODEL CTX OUTDIR "PIECE..." CONFIG...
#   CONFIG = WEIGHTS:KV:ROTATION:GROUP, e.g. bf16:k4v3:so4-full:64; ROTATION+kchan (e.g. hadamard+kchan) adds
#   --kv-layout channel (per-channel keys), a further +oN (hadamard+kchan+o8) adds --kv-outliers N;
#   bf16:bf16:none:64 is the baseline alone
#   (perplexity only). Environment: THREADS (per run, default 1), JOBS (runs at once, default 2),
#   BASE_MODEL (model path for the baseline; default MODEL) — not used by cider itself: a cider-format model
#   loads only with its own weights, so weight sweeps give the GGUF as MODEL.
set -euo pipefail
CIDER=$1 MODEL=$2 CTX=$3 OUT=$4 PIECES=$5
shift 5
export CIDER MODEL CTX OUT THREADS=${THREADS:-1}
JOBS=${JOBS:-2}
mkdir -p "$OUT"
one() {  # config piece-index piece-file
  local cfg=$1 i=$2 piece=$3 W KV ROT G
  IFS=: read -r W KV ROT G <<<"$cfg"
  local name; name=$(printf '%s_%s_%s_g%s.w%03d' "$W" "$KV" "$ROT" "$G" "$i")
  local f="$OUT/$name.txt"
  if [ -s "$f" ] && grep -q '^perplexity:' "$f"; then echo "skip $name"; return 0; fi
  local layout=token outliers=0
  if [[ $ROT =~ \+o([0-9]+)$ ]]; then outliers=${BASH_REMATCH[1]}; ROT=${ROT%+o*}; fi  # +oN: --kv-outliers N
  if [[ $ROT == *+kchan ]]; then layout=channel; fi  # ROTATION+kchan: per-channel keys (--kv-layout channel)
  local cmd=("$CIDER" perplexity -m "$MODEL" -f "$piece" --ctx "$CTX" --threads "$THREADS"
             --weights "$W" --kv "$KV" --kv-rotation "${ROT%+kchan}" --kv-group-size "$G")
  if [ "$layout" = channel ]; then cmd+=(--kv-layout channel); fi
  if [ "$outliers" != 0 ]; then cmd+=(--kv-outliers "$outliers"); fi
  if [ "$W" != bf16 ] || [ "$KV" != bf16 ]; then cmd+=(--baseline-weights bf16 --baseline-kv bf16); fi
  { echo "# command: ${cmd[*]}"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  load: $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$f.tmp"
  local start; start=$(date +%s)
  if "${cmd[@]}" >> "$f.tmp" 2> "$f.err"; then
    echo "# wall_s: $(( $(date +%s) - start ))" >> "$f.tmp"; mv "$f.tmp" "$f"; rm -f "$f.err"
    echo "done $name ($(( $(date +%s) - start )) s): $(grep -E '^(perplexity|mean KL|top-1)' "$f" | cut -c1-60 | tr '\n' ' ')"
  else
    echo "FAILED $name: $(tail -2 "$f.err")"
  fi
}
export -f one
i=0
for p in $PIECES; do
  n=$i  # the window index: NNN of a piece_NNN.txt file, else the position in PIECES
  if [[ $(basename "$p") =~ ^piece_0*([0-9]+)\.txt$ ]]; then n=${BASH_REMATCH[1]}; fi
  for cfg in "$@"; do printf '%s\t%s\t%s\n' "$cfg" "$n" "$p"; done
  i=$((i + 1))
done | xargs -P "$JOBS" -n 1 -d '\n' bash -c 'IFS=$'"'"'\t'"'"' read -r c n p <<<"$0"; one "$c" "$n" "$p"'
