#!/usr/bin/env bash
# Side-by-side benchmark: cider's kernels against oneDNN (Debian's libdnnl-dev) and llama.cpp's ggml kernels, in
# the same run, interleaved round by round, and a table of best times and ratios per case.
#
# Usage: tools/bench_peers.sh --ggml-git DIR [--rounds N] [--reps N] [--pool-mb N] [--filter A,B,...] [--threads N]
#                              [--taskset CPUS]
#   --ggml-git DIR  a git repository (or bare git dir) of ggml-org/ggml — e.g. the snapshot the fetch tool gives
#                   (/work/.mirror/ggml-org+ggml/repo). It is cloned and built OUTSIDE this repository.
#   --taskset CPUS  pin every timed program to these CPUs (e.g. 0,1 on a bigger, otherwise idle machine)
# Everything is built and written under ${CIDER_PEERS_DIR:-/tmp/cider-peers} (cider_bench too, from this checkout);
# nothing of the peers enters the repository. The harnesses are cider's own code (bench/peers/*.cpp).
# Output: the table on stdout, every timed case as a JSON line in $CIDER_PEERS_DIR/results-<date>.jsonl.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${CIDER_PEERS_DIR:-/tmp/cider-peers}
ggml_git="" rounds=3 reps=20 pool_mb=2048 filter="" threads=2 cpus=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --ggml-git) ggml_git=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --pool-mb) pool_mb=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --taskset) cpus=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench_peers: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $ggml_git ]] || { echo "bench_peers: --ggml-git DIR is required (a ggml-org/ggml git repository)" >&2; exit 2; }
case $work in "$repo"|"$repo"/*) echo "bench_peers: CIDER_PEERS_DIR must be outside the repository" >&2; exit 2 ;; esac
mkdir -p "$work"
jobs=$(nproc)

echo "== building cider_bench, the oneDNN and ggml harnesses under $work" >&2
cmake -S "$repo" -B "$work/cider-build" -DCMAKE_BUILD_TYPE=Release -DCIDER_BUILD_TESTS=OFF -DCIDER_WERROR=OFF > "$work/cider-cmake.log"
cmake --build "$work/cider-build" -j "$jobs" --target cider_bench > "$work/cider-build.log"
if ! [[ -f /usr/include/oneapi/dnnl/dnnl.hpp ]]; then
  echo "bench_peers: oneDNN headers missing: apt-get install libdnnl-dev" >&2; exit 2
fi
g++ -O2 -std=c++17 -o "$work/onednn_bench" "$repo/bench/peers/onednn_bench.cpp" -ldnnl
if [[ ! -d $work/ggml-src/.git ]]; then git clone -q "$ggml_git" "$work/ggml-src"; fi
ggml_rev=$(git -C "$work/ggml-src" rev-parse --short HEAD)
cmake -S "$work/ggml-src" -B "$work/ggml-build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BUILD_TESTS=OFF \
  -DGGML_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF > "$work/ggml-cmake.log"
cmake --build "$work/ggml-build" -j "$jobs" > "$work/ggml-build.log"
g++ -O2 -std=c++17 -I "$work/ggml-src/include" -o "$work/ggml_bench" "$repo/bench/peers/ggml_bench.cpp" \
  "$work/ggml-build/src/libggml.a" "$work/ggml-build/src/libggml-cpu.a" "$work/ggml-build/src/libggml-base.a" \
  -fopenmp -lpthread

out="$work/results-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
: > "$out"
common=(--reps "$reps" --pool-mb "$pool_mb" --threads "$threads")
fargs=()
[[ -n $filter ]] && fargs=(--filter "$filter")
pin=()
[[ -n $cpus ]] && pin=(taskset -c "$cpus")
for ((r = 1; r <= rounds; r++)); do
  echo "== round $r/$rounds: cider, oneDNN (default ISA: AMX where present), oneDNN (VNNI), llama.cpp" >&2
  "${pin[@]}" "$work/cider-build/cider_bench" bench --json "${common[@]}" "${fargs[@]}" | sed "s/^{/{\"round\": $r, /" >> "$out"
  OMP_NUM_THREADS=$threads "${pin[@]}" "$work/onednn_bench" "${common[@]}" "${fargs[@]}" | sed "s/^{/{\"round\": $r, /" >> "$out"
  OMP_NUM_THREADS=$threads ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI "${pin[@]}" "$work/onednn_bench" "${common[@]}" "${fargs[@]}" |
    sed "s/^{/{\"round\": $r, /; s/\"engine\": \"onednn\"/\"engine\": \"onednn-vnni\"/" >> "$out"
  "${pin[@]}" "$work/ggml_bench" "${common[@]}" "${fargs[@]}" 2> /dev/null | sed "s/^{/{\"round\": $r, /" >> "$out"
done

python3 - "$out" "$ggml_rev" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
best = collections.defaultdict(list)  # (case, engine) -> per-round best ms
kern = {}
for r in rows:
    case, _, variant = r["case"].partition(":")
    eng = r["engine"] + (":" + variant if variant else "")
    best[(case, eng)].append(r["best_ms"])
    kern[(case, eng)] = r["kernel"]
order = []
for r in rows:
    c = r["case"].partition(":")[0]
    if c not in order: order.append(c)
print(f"results: {sys.argv[1]} (ggml {sys.argv[2]}); times: best over all calls and rounds; spread: range of the "
      "per-round bests relative to the best; ratio: peer time / cider time (> 1: cider faster)")
print(f"{'case':36} {'engine':22} {'best ms':>9} {'spread':>7} {'ratio':>7}  kernel")
for c in order:
    engines = sorted({e for (cc, e) in best if cc == c}, key=lambda e: (e != "cider", e))
    if "cider" not in engines: continue
    cb = min(best[(c, "cider")])
    for e in engines:
        v = best[(c, e)]
        b = min(v)
        spread = (max(v) - b) / b * 100
        ratio = "" if e == "cider" else f"{b / cb:7.2f}"
        print(f"{c:36} {e:22} {b:9.3f} {spread:6.0f}% {ratio:>7}  {kern[(c, e)]}")
PY
