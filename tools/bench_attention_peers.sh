#!/usr/bin/env bash
# Decode attention, cider against llama.cpp's CPU flash attention (GGML_OP_FLASH_ATTN_EXT), in the same run.
#
#   bash tools/bench_attention_peers.sh [rounds]
#   SKIP_BUILD=1 CIDER_BIN=… HARNESS_BIN=… TASKSET="taskset -c 0,1" bash tools/bench_attention_peers.sh [rounds]
#                                   (prebuilt binaries, e.g. copied to a quieter host; pinned to two cores)
#   PLOT_ONLY=results.jsonl bash tools/bench_attention_peers.sh      (table + plot of an earlier run)
#   PEER_STREAM=0: llama.cpp in hot mode only (its stream mode fills GiBs of K/V per case); DIMS, CTXS, SWEEP,
#   LEVELS, REPS, THREADS select the cases.
#
# Builds, OUTSIDE the repository (under $PEERS, default /work/peers):
#   - ggml (the llama.cpp kernels: the ggml-org/ggml snapshot, unpacked at $GGML_SRC) with its CPU backend, native ISA;
#   - a small harness (written below, our own code) that times ggml_flash_attn_ext on the decode shape: q [D, 1, Hq],
#     K/V [D, kv, Hkv] in f16 / q4_0 / q8_0, an f16 mask [kv, 1], scale 1/sqrt(D), GGML_PREC_F32, a persistent
#     ggml threadpool (so thread start-up is not timed), one warm-up call, then best/median/max of --reps calls;
# and cider's bench/attention_bench (build dir $BUILD, default build-attn). Both run with $THREADS threads (default 2).
# Cases: Hq 32, Hkv 8, D 128 and 256, kv 8192 and 32768 keys (the issue's shapes), then a context sweep at D 128
# for the plot. Modes: hot (one cache, re-read every call: what test-backend-ops' perf mode does) and stream (calls
# rotate over distinct copies totalling >= 1 GiB: each call reads its cache from DRAM, as a decode step reads a
# layer's cache). The runs are interleaved (cider, llama f16, llama q4_0, llama q8_0 per case, $ROUNDS rounds) and
# the best time over the rounds is kept; the spread (worst round's best / best) is printed. Results: JSON lines in
# $OUT (default $PEERS/attention-results), a table on stdout, and docs/benchmarks/attention_decode.png when
# matplotlib is available (python3-matplotlib).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEERS="${PEERS:-/work/peers}"
GGML_SRC="${GGML_SRC:-$PEERS/ggml-src}"
GGML_BUILD="${GGML_BUILD:-$PEERS/ggml-build}"
BUILD="${BUILD:-$ROOT/build-attn}"
THREADS="${THREADS:-2}"
ROUNDS="${1:-${ROUNDS:-3}}"
REPS="${REPS:-15}"
OUT="${OUT:-$PEERS/attention-results}"
SWEEP="${SWEEP:-1024 2048 4096 8192 16384 32768 65536}"
LEVELS="${LEVELS:-avx512 avx2}"  # cider ISA levels to time
DIMS="${DIMS:-128 256}"
CTXS="${CTXS:-8192 32768}"
mkdir -p "$OUT"

TASKSET="${TASKSET:-}"
if [ -n "${PLOT_ONLY:-}" ]; then
  RES="$PLOT_ONLY"
elif [ "${SKIP_BUILD:-0}" = 1 ]; then
  CIDER="${CIDER_BIN:?CIDER_BIN}"
  HARNESS="${HARNESS_BIN:?HARNESS_BIN}"
else
if [ ! -f "$GGML_SRC/CMakeLists.txt" ]; then
  echo "ggml source not found at $GGML_SRC: fetch the ggml-org/ggml snapshot and unpack it there" >&2
  echo "  (e.g. git --git-dir=<mirror> archive HEAD | tar -x -C $GGML_SRC)" >&2
  exit 1
fi

# ---- llama.cpp's kernels (ggml), outside the repository ----
if [ ! -f "$GGML_BUILD/src/libggml.so" ]; then
  cmake -S "$GGML_SRC" -B "$GGML_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BUILD_TESTS=ON \
    -DGGML_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$GGML_BUILD" -j2 --target ggml test-backend-ops >/dev/null
fi

# ---- the harness around ggml_flash_attn_ext ----
cat >"$GGML_BUILD/peer_flash_attn.cpp" <<'EOF'
// Times ggml_flash_attn_ext (CPU backend) on one decode step: q [D, 1, Hq], K/V [D, kv, Hkv], f16 mask [kv, 1].
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml.h"
#include "ggml-cpu.h"

int main(int argc, char** argv) {
  std::string type = "f16";
  int64_t D = 128, kv = 32768, hq = 32, hkv = 8;
  int reps = 15, threads = 2, copies = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--type") type = v;
    else if (a == "--d") D = atoll(v.c_str());
    else if (a == "--kv") kv = atoll(v.c_str());
    else if (a == "--hq") hq = atoll(v.c_str());
    else if (a == "--hkv") hkv = atoll(v.c_str());
    else if (a == "--reps") reps = atoi(v.c_str());
    else if (a == "--threads") threads = atoi(v.c_str());
    else if (a == "--copies") copies = atoi(v.c_str());
  }
  const ggml_type t = type == "q4_0" ? GGML_TYPE_Q4_0 : type == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
  const size_t kv_bytes = ggml_row_size(t, D) * kv * hkv;
  ggml_init_params ip = {2 * kv_bytes * copies + (size_t)hq * D * 4 * 2 * copies + (size_t)kv * 2 * copies +
                             (size_t)64 * 1024 * 1024, nullptr, false};
  ggml_context* ctx = ggml_init(ip);
  // Values uniform in [-2, 2) from a 64-bit LCG (fast: the stream mode fills GiBs; timing does not depend on them).
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto nd = [&](auto&) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int32_t>(state >> 32)) * (2.0f / 2147483648.0f);
  };
  int rng = 0;
  std::vector<float> tmp((size_t)D * kv * hkv);
  std::vector<ggml_cgraph*> graphs;
  for (int c = 0; c < copies; ++c) {
    ggml_tensor* q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, 1, hq, 1);
    ggml_tensor* k = ggml_new_tensor_4d(ctx, t, D, kv, hkv, 1);
    ggml_tensor* v = ggml_new_tensor_4d(ctx, t, D, kv, hkv, 1);
    ggml_tensor* m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, kv, 1, 1, 1);
    for (int64_t i = 0; i < D * hq; ++i) ((float*)q->data)[i] = nd(rng);
    std::memset(m->data, 0, ggml_nbytes(m));
    for (ggml_tensor* x : {k, v}) {
      for (float& f : tmp) f = nd(rng);
      if (t == GGML_TYPE_F16) ggml_fp32_to_fp16_row(tmp.data(), (ggml_fp16_t*)x->data, (int64_t)tmp.size());
      else ggml_quantize_chunk(t, tmp.data(), x->data, 0, kv * hkv, D, nullptr);
    }
    ggml_tensor* out = ggml_flash_attn_ext(ctx, q, k, v, m, 1.0f / std::sqrt((float)D), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32);
    ggml_cgraph* gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    graphs.push_back(gf);
  }
  ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
  ggml_threadpool* tp = ggml_threadpool_new(&tpp);
  std::vector<ggml_cplan> plans;
  std::vector<std::vector<uint8_t>> work(copies);
  for (int c = 0; c < copies; ++c) {
    ggml_cplan p = ggml_graph_plan(graphs[c], threads, tp);
    work[c].resize(p.work_size + 1);
    p.work_data = work[c].data();
    plans.push_back(p);
  }
  ggml_graph_compute(graphs[0], &plans[0]);  // warm-up
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const int c = r % copies;
    const auto t0 = std::chrono::steady_clock::now();
    ggml_graph_compute(graphs[c], &plans[c]);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("{\"engine\":\"llama.cpp\",\"type\":\"%s\",\"d\":%lld,\"kv\":%lld,\"mode\":\"%s\",\"threads\":%d,"
              "\"best_ms\":%.4f,\"median_ms\":%.4f,\"max_ms\":%.4f}\n",
              type.c_str(), (long long)D, (long long)kv, copies > 1 ? "stream" : "hot", threads, ms.front(),
              ms[ms.size() / 2], ms.back());
  ggml_threadpool_free(tp);
  ggml_free(ctx);
  return 0;
}
EOF
HARNESS="$GGML_BUILD/peer_flash_attn"
if [ ! -x "$HARNESS" ] || [ "$GGML_BUILD/peer_flash_attn.cpp" -nt "$HARNESS" ]; then
  g++ -O2 -std=c++17 -I"$GGML_SRC/include" "$GGML_BUILD/peer_flash_attn.cpp" -o "$HARNESS" \
    -L"$GGML_BUILD/src" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$GGML_BUILD/src"
fi

# ---- cider ----
if [ ! -f "$BUILD/build.ninja" ] && [ ! -f "$BUILD/Makefile" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD" -j2 --target attention_bench >/dev/null
CIDER="$BUILD/attention_bench"
fi

# Copies each llama.cpp stream run rotates over: >= 1 GiB of K+V.
copies_for() {  # type D kv
  local bytes_per_value
  case "$1" in f16) bytes_per_value=2 ;; q8_0) bytes_per_value=1.0625 ;; q4_0) bytes_per_value=0.5625 ;; esac
  python3 -c "import math; print(max(2, math.ceil(1073741824 / (2 * $bytes_per_value * $2 * $3 * 8))))"
}

if [ -z "${PLOT_ONLY:-}" ]; then
RES="$OUT/results-$(date +%Y%m%d-%H%M%S).jsonl"
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -n) threads=$THREADS rounds=$ROUNDS reps=$REPS taskset='$TASKSET'" | tee "$OUT/last-run.txt"
for round in $(seq 1 "$ROUNDS"); do
  for D in $DIMS; do
    for KV in $CTXS; do
      for L in $LEVELS; do
        $TASKSET "$CIDER" --isa "$L" --ctx "$KV" --dims "$D" --threads "$THREADS" --reps "$REPS" --mode hot,stream --no-nn --no-append --json \
          | sed "s/^{/{\"round\":$round,\"engine\":\"cider\",\"d\":$D,\"kv\":$KV,/" >>"$RES"
      done
      for T in f16 q4_0 q8_0; do
        $TASKSET "$HARNESS" --type $T --d $D --kv $KV --threads "$THREADS" --reps "$REPS" \
          | sed "s/^{/{\"round\":$round,/" >>"$RES"
        if [ "${PEER_STREAM:-1}" = 1 ]; then
          $TASKSET "$HARNESS" --type $T --d $D --kv $KV --threads "$THREADS" --reps "$REPS" --copies "$(copies_for $T $D $KV)" \
            | sed "s/^{/{\"round\":$round,/" >>"$RES"
        fi
      done
    done
  done
  if [ "${NO_SWEEP:-0}" != 1 ]; then
    for KV in $SWEEP; do
      for L in $LEVELS; do
        $TASKSET "$CIDER" --isa "$L" --ctx "$KV" --dims 128 --threads "$THREADS" --reps "$REPS" --mode hot --no-nn --no-append --json \
          | sed "s/^{/{\"round\":$round,\"engine\":\"cider\",\"d\":128,\"kv\":$KV,\"sweep\":1,/" >>"$RES"
      done
      for T in f16 q4_0; do
        $TASKSET "$HARNESS" --type $T --d 128 --kv "$KV" --threads "$THREADS" --reps "$REPS" \
          | sed "s/^{/{\"round\":$round,\"sweep\":1,/" >>"$RES"
      done
    done
  fi
done
cp "$RES" "$OUT/last.jsonl"
fi

# A Python with matplotlib for the plot (Debian's python3-matplotlib lives in /usr/bin/python3).
PY=python3
for p in python3 /usr/bin/python3; do
  if "$p" -c "import matplotlib" 2>/dev/null; then PY="$p"; break; fi
done
mkdir -p "$ROOT/docs/benchmarks"
"$PY" - "$RES" "$ROOT/docs/benchmarks/attention_decode.png" <<'EOF'
import json, os, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
best = collections.defaultdict(list)  # key -> per-round best times
for r in rows:
    if "mode" not in r:
        continue
    if r["engine"] == "cider":
        if r.get("level") != "avx512" and r.get("level") != "avx2":
            continue
        key = ("cider-" + r["level"], r["mode"], r["d"], r["kv"])
    else:
        key = ("llama-" + r["type"], r["mode"], r["d"], r["kv"])
    best[key].append(r["best_ms"])
def b(key):
    v = best.get(key)
    return (min(v), max(v) / min(v)) if v else (float("nan"), float("nan"))
print("best ms over the rounds (ratio = llama.cpp time / cider time; spread = worst round's best / best)")
print(f"{'D':>4} {'keys':>6} {'mode':>6} {'cider':>7} | {'cider ms':>9} {'llama f16':>10} {'llama q4_0':>10} {'llama q8_0':>10} |"
      f" {'x f16':>6} {'x q4_0':>7} {'x q8_0':>7} | spread cider/f16/q4_0/q8_0")
dims = sorted({k[2] for k in best if k[0].startswith("cider")})
ctxs = sorted({k[3] for k in best if k[0].startswith("cider") and k[1] == "stream"})
for D in dims:
    for kv in ctxs:
        for mode in ("hot", "stream"):
            for lvl in ("avx512", "avx2"):
                c, cs = b(("cider-" + lvl, mode, D, kv))
                if c != c:
                    continue
                f, fs = b(("llama-f16", mode, D, kv))
                q4, q4s = b(("llama-q4_0", mode, D, kv))
                q8, q8s = b(("llama-q8_0", mode, D, kv))
                print(f"{D:>4} {kv:>6} {mode:>6} {lvl:>7} | {c:9.3f} {f:10.3f} {q4:10.3f} {q8:10.3f} | {f/c:6.1f} "
                      f"{q4/c:7.1f} {q8/c:7.1f} | {cs:.2f}/{fs:.2f}/{q4s:.2f}/{q8s:.2f}")
# The plot: decode time against context length (D 128, hot).
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("(matplotlib not available: no plot)")
    sys.exit(0)
sweep = collections.defaultdict(dict)
for (name, mode, D, kv), v in best.items():
    if D == 128 and mode == "hot":
        sweep[name][kv] = min(v)
fig, ax = plt.subplots(figsize=(7, 4.5))
labels = {"cider-avx512": "cider K4/V3 (AVX-512 VNNI)", "cider-avx2": "cider K4/V3 (AVX2)",
          "llama-f16": "llama.cpp f16 K/V", "llama-q4_0": "llama.cpp q4_0 K/V", "llama-q8_0": "llama.cpp q8_0 K/V"}
for name in ("llama-q4_0", "llama-q8_0", "llama-f16", "cider-avx2", "cider-avx512"):
    pts = sorted(sweep.get(name, {}).items())
    if len(pts) >= 2:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=labels[name])
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("context length (cached keys)")
ax.set_ylabel("decode attention time per layer (ms)")
ax.set_title(os.environ.get("PLOT_TITLE", "Decode attention, Hq 32 / Hkv 8 / D 128, 2 threads (best of rounds)"))
ax.grid(True, which="both", alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print("plot:", sys.argv[2])
EOF
