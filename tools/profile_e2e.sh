#!/usr/bin/env bash
# Where each engine's time goes, end to end on CPU (issue 4): cider and llama.cpp's llama-bench on the same GGUF
# under `perf record -e cpu-clock -F $FREQ -g`, phases separated by time-stamped markers (see
# tools/profile_categories.py), then a table of categories per phase. Downloads and builds nothing: give the paths.
#
#   CIDER=build-prof/cider LLAMA_BENCH=/path/llama-bench MODEL=gemma-3-270m-q4_k_m.gguf \
#   P512=p512.txt P8K=p8k.txt tools/profile_e2e.sh
#
# Env: CIDER, LLAMA_BENCH, MODEL, P512, P8K (prompt text files: ~512 and ~8k tokens) required;
#      THREADS (2), FREQ (2000), WEIGHTS (w4a8), KV (k8v4), OUT (/tmp/cider-profile-e2e), LLAMA_FLAGS ("--repack 0"),
#      SKIP ("" or e.g. "llama" / "cider" to only report the other engine's existing data), TOP (0: top-N symbols).
#      WIDE (set: one compact table, categories x phase/engine, cells "ms/token (% of samples)").
# A cider built with symbols helps: cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-g -fno-omit-frame-pointer".
# Output: the markdown table on stdout; perf data, markers and the engines' own output under $OUT.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${CIDER:?set CIDER}" "${LLAMA_BENCH:?set LLAMA_BENCH}" "${MODEL:?set MODEL}" "${P512:?set P512}" "${P8K:?set P8K}"
THREADS=${THREADS:-2} FREQ=${FREQ:-2000} WEIGHTS=${WEIGHTS:-w4a8} KV=${KV:-k8v4} OUT=${OUT:-/tmp/cider-profile-e2e}
LLAMA_FLAGS=${LLAMA_FLAGS:---repack 0} SKIP=${SKIP:-} TOP=${TOP:-0}
mkdir -p "$OUT"
rec() { python3 "$here/profile_categories.py" record --freq "$FREQ" "$@"; }

echo "# $(date -u '+%F %T UTC'); $(uptime)" >&2
if [[ $SKIP != cider ]]; then
  echo "== cider: prefill 512 + decode 64" >&2
  rec --engine cider --out "$OUT/cider_512.data" --prompt-file "$P512" -- "$CIDER" generate -m "$MODEL" \
    --weights "$WEIGHTS" --kv "$KV" --threads "$THREADS" --ctx 1024 --temperature 0 --max-tokens 64 --echo \
    -p "$(cat "$P512")"
  grep "^prompt" "$OUT/cider_512.data.stderr" >&2 || true
  echo "== cider: prefill 8k + decode 32" >&2
  rec --engine cider --out "$OUT/cider_8k.data" --prompt-file "$P8K" -- "$CIDER" generate -m "$MODEL" \
    --weights "$WEIGHTS" --kv "$KV" --threads "$THREADS" --ctx 8448 --temperature 0 --max-tokens 32 --echo \
    -p "$(cat "$P8K")"
  grep "^prompt" "$OUT/cider_8k.data.stderr" >&2 || true
fi
if [[ $SKIP != llama ]]; then
  # shellcheck disable=SC2086  # LLAMA_FLAGS is a list of flags
  for spec in "pp512:-p 512 -n 0 -r 3" "tg64d512:-p 0 -n 64 -d 512 -r 3" "tg32d8192:-p 0 -n 32 -d 8192 -r 1"; do
    name=${spec%%:*} args=${spec#*:}
    echo "== llama-bench $args" >&2
    rec --engine llama --out "$OUT/llama_$name.data" -- "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" $args \
      $LLAMA_FLAGS --progress -o md
    grep -E '^\| gemma|^\| [a-z]' "$OUT/llama_$name.data.stdout" | tail -n 1 >&2 || true
  done
fi
echo "# done $(date -u '+%F %T UTC'); $(uptime)" >&2
python3 "$here/profile_categories.py" report --threads "$THREADS" --top "$TOP" ${WIDE:+--wide} "$OUT"/cider_512.data \
  "$OUT"/cider_8k.data "$OUT"/llama_pp512.data "$OUT"/llama_tg64d512.data "$OUT"/llama_tg32d8192.data
