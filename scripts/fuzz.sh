#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz, clang-14, AddressSanitizer + UndefinedBehaviorSanitizer) in build-fuzz/
# and runs each for a while. Usage:
#
#   bash scripts/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]      (default: 60 s, every tests/fuzz/fuzz_*.cpp)
#   e.g. bash scripts/fuzz.sh 30                  bash scripts/fuzz.sh 600 tokenizer gguf
#
# Each harness fuzzes a scratch corpus, build-fuzz/corpus/<harness>/, seeded from tests/fuzz/corpus/<harness>/ (the
# repository's seeds are never written to). By default libFuzzer runs in fork mode and keeps going after a crash,
# timeout or out-of-memory (FUZZ_FORK=0: stop at the first one). Each reproducer is replayed once; the smallest one
# of each distinct failure (report line + innermost frame) is copied into tests/fuzz/regressions/<harness>/ (which the
# regular CTest build replays: fuzz_replay_<harness>) and printed with that line and frame, and the script exits
# non-zero at the end if anything was found.
#
# Environment: FUZZ_SANITIZE (address,undefined; undefined for long campaigns), FUZZ_JOBS (build parallelism, default nproc), FUZZ_FORK (1), FUZZ_RSS_MB (2048), FUZZ_TIMEOUT (10 s),
# FUZZ_BUILD_DIR (build-fuzz), FUZZ_ARGS (extra libFuzzer flags), FUZZ_MAX_REPLAYS (100). A reproducer replays with
#   build-fuzz/fuzz_<harness> tests/fuzz/regressions/<harness>/<file>
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

seconds=${1:-60}
shift || true
case $seconds in '' | *[!0-9]*) echo "usage: bash scripts/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]" >&2; exit 2 ;; esac

# ---- tools (Debian 12): clang-14 with libFuzzer, the symbolizer, and what the library itself needs ----------------
packages=(clang-14 libclang-rt-14-dev llvm-14 cmake make pkg-config nlohmann-json3-dev libpcre2-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "fuzz: missing packages ${missing[*]} (run as root to install them)" >&2
    exit 1
  fi
  echo "fuzz: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# ---- build ----------------------------------------------------------------------------------------------------------
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${FUZZ_JOBS:-$(nproc)}
CC=clang-14 CXX=clang++-14 cmake -S tests/fuzz -B "$build" -DCIDER_FUZZ_SANITIZE="${FUZZ_SANITIZE:-address,undefined}" \
  > /dev/null
cmake --build "$build" -j "$jobs"

# ---- which harnesses ------------------------------------------------------------------------------------------------
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp; do
    n=$(basename "${f%.cpp}")
    harnesses+=("${n#fuzz_}")
  done
fi

# Per harness: the longest input (seeds longer than this would be truncated) and the dictionary.
max_len_of() {
  case $1 in
    gguf | tokenizer) echo 65536 ;;
    chat_format) echo 4096 ;;
    *) echo 8192 ;;
  esac
}
dict_of() {
  case $1 in
    config) echo tests/fuzz/dict/json.dict ;;
    *) echo "tests/fuzz/dict/$1.dict" ;;
  esac
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=0:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if [ -x /usr/bin/llvm-symbolizer-14 ]; then export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14; fi
export CIDER_ISA=${CIDER_ISA:-ref}  # the fuzz build compiles no x86 ISA kernels
export CIDER_SOURCE_DIR=$root
# Scratch files of the path-only APIs (written every execution): tmpfs when there is one.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then scratch_tmp=/dev/shm/cider-fuzz-run-$$; else scratch_tmp=$root/$build/tmp; fi
trap 'rm -rf "$scratch_tmp"' EXIT
export CIDER_FUZZ_TMP=$scratch_tmp

found_any=0
summary=()
# The first line of a failure report: sanitizer errors, the harnesses' own checks, escaped exceptions, libFuzzer's
# timeout / out-of-memory / exit reports.
report_pattern='(ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error|invariant violated|must succeed|terminate called|ERROR: libFuzzer: (timeout|out-of-memory|fuzz target exited|deadly signal)|internal assertion failed)'

for h in "${harnesses[@]}"; do
  exe=$build/fuzz_$h
  if [ ! -x "$exe" ]; then
    echo "fuzz: no harness '$h' (tests/fuzz/fuzz_$h.cpp)" >&2
    exit 2
  fi
  corpus=$build/corpus/$h
  artifacts=$build/artifacts/$h
  log=$build/logs/$h.log
  mkdir -p "$corpus" "$artifacts" "$build/logs" "$scratch_tmp"
  rm -f "$artifacts"/*
  if [ -d "tests/fuzz/corpus/$h" ]; then cp -n "tests/fuzz/corpus/$h"/* "$corpus"/ 2> /dev/null || true; fi
  flags=(-max_total_time="$seconds" -rss_limit_mb="${FUZZ_RSS_MB:-2048}" -timeout="${FUZZ_TIMEOUT:-10}"
         -max_len="$(max_len_of "$h")" -artifact_prefix="$artifacts/" -print_final_stats=1 -print_funcs=0)
  dict=$(dict_of "$h")
  if [ -f "$dict" ]; then flags+=(-dict="$dict"); fi
  if [ "${FUZZ_FORK:-1}" = 1 ]; then
    flags+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  # shellcheck disable=SC2206
  extra=(${FUZZ_ARGS:-})
  echo "== fuzz_$h: ${seconds} s (log: $log)"
  set +e
  "$exe" "${flags[@]}" "${extra[@]}" "$corpus" > "$log" 2>&1
  rc=$?
  set -e
  rm -rf "${scratch_tmp:?}"/*

  # Executions and speed: fork mode prints "#<execs>: ... exec/s <n> ..." lines, plain mode the final stats.
  execs=$( (grep -oE '^stat::number_of_executed_units: [0-9]+' "$log" || true) | awk '{print $2}' | tail -1)
  rate=$( (grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$log" || true) | awk '{print $2}' | tail -1)
  if [ -z "$execs" ]; then
    execs=$( (grep -oE '^#[0-9]+' "$log" || true) | tail -1 | tr -d '#')
    rate=$( (grep -oE 'exec/s:? [0-9]+' "$log" || true) | tail -1 | grep -oE '[0-9]+$' || true)
  fi
  execs=${execs:-0}
  rate=${rate:-0}

  # Reproducers: crash-*, leak-*, timeout-*, oom-* in the artifact directory (named by content hash). Fork mode
  # keeps finding the same bug, so each is replayed once and only the smallest input of each distinct failure (its
  # report line and innermost frame in cider's sources or the harness) is copied into the repository.
  saved=()
  reports=()
  artifacts_found=0
  declare -A seen=()
  while IFS= read -r a; do
    [ -n "$a" ] || continue
    artifacts_found=$((artifacts_found + 1))
    [ $artifacts_found -le "${FUZZ_MAX_REPLAYS:-100}" ] || continue
    report=$("$exe" -runs=1 -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb="${FUZZ_RSS_MB:-2048}" "$a" 2>&1 || true)
    what=$(printf '%s\n' "$report" | grep -m1 -E "$report_pattern" || true)
    where=$(printf '%s\n' "$report" | grep -m1 -E '#[0-9]+ 0x[0-9a-f]+ in .*(/src/|/tests/fuzz/)' || true)
    sig=$(printf '%s | %s' "$what" "${where##* in }" |
          sed -E 's/==[0-9]+==//g; s/0x[0-9a-f]+//g; s/(cider::Error: \[[^]]*\]).*/\1/; s/[0-9]+ bytes/N bytes/g')
    [ -z "${seen[$sig]:-}" ] || continue
    seen[$sig]=1
    mkdir -p "tests/fuzz/regressions/$h"
    dest=tests/fuzz/regressions/$h/$(basename "$a")
    cp "$a" "$dest"
    saved+=("$dest")
    reports+=("${what:-(no report line: replay $dest)}"$'\n'"      at ${where##* in }")
  done < <(ls -S -r "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-* 2> /dev/null || true)

  if [ "$execs" = 0 ]; then
    # The harness never ran (bad flag, dictionary syntax, a crash while loading the corpus in fork mode, ...).
    found_any=1
    line="fuzz_$h: DID NOT RUN (exit $rc; see $log)"
    echo "$line"
    tail -5 "$log" | sed 's/^/  /'
  elif [ ${#saved[@]} -gt 0 ] || { [ "${FUZZ_FORK:-1}" != 1 ] && [ $rc -ne 0 ]; }; then
    found_any=1
    line="fuzz_$h: $execs executions, $rate exec/s, FOUND ${#saved[@]} distinct failure(s) (exit $rc)"
    echo "$line"
    for i in "${!saved[@]}"; do
      echo "  ${saved[$i]}"
      printf '%s\n' "${reports[$i]}" | sed 's/^ */      /'
    done
    if [ "$artifacts_found" -gt ${#saved[@]} ]; then
      echo "  ($artifacts_found reproducers in all, duplicates of these left in $artifacts)"
    fi
  else
    line="fuzz_$h: $execs executions, $rate exec/s, no crash"
    echo "$line"
  fi
  summary+=("$line")
done

echo "== fuzz summary (${seconds} s per harness)"
printf '  %s\n' "${summary[@]}"
if [ $found_any -ne 0 ]; then
  echo "fuzz: reproducers were copied into tests/fuzz/regressions/ (replay: $build/fuzz_<harness> <file>)"
  exit 1
fi
