#!/usr/bin/env bash
# `cider serve` on the GPU host beside llama.cpp's llama-server (CUDA), the same random-weight Llama-3-8B-shaped
# Q4_K_M GGUF, the same load generator (tools/serve_bench.py). Run from the repository root after
# `tar -C .gpu -xJf .gpu/pack.tar.xz` (tools/gpu/pack.sh). Phases, each fitting one 10-minute device command:
#   setup   builds llama-server with CUDA (sm_90) from .gpu/llama-src.tar.xz (llama.cpp's source as shipped in the
#           llama-cpp-python sdist, trimmed; built in /tmp, outside the repository) and writes the model
#           (tools/make_random_gguf.py --shape llama3-8b, gguf-py from .gpu/wheels) to /tmp/serve/llama3-8b.gguf;
#           then a smoke test of `cider serve --device cuda` on the embedded model (greedy text == cider generate)
#   bench   both servers, one after the other, at concurrency $LEVELS (default 1,4,16,64), $MAX_TOKENS per stream
# SKIP_LLAMA=1: cider only (no llama-server build or run).
# Outputs under $OUT: serve_bench.md (the table rows), logs.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
W=/tmp/serve
mkdir -p "$W"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
B=.gpu/bin
LEVELS=${LEVELS:-1,4,16,64}
MAX_TOKENS=${MAX_TOKENS:-128}
CIDER_WEIGHTS=${CIDER_WEIGHTS:-w4a8}
CIDER_KV=${CIDER_KV:-k8v4}
LLAMA_KV=${LLAMA_KV:-q8_0}
SLOT_CTX=${SLOT_CTX:-1024}

. tools/gpu/serve_lib.sh  # wait_health, bench_server

phase_setup() {
  (
    if [ -z "${SKIP_LLAMA:-}" ] && [ ! -x "$W/llama/build/bin/llama-server" ]; then
      mkdir -p "$W/llama" && tar -C "$W/llama" -xJf .gpu/llama-src.tar.xz
      cmake -S "$W/llama/llama.cpp" -B "$W/llama/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF > /dev/null
      cmake --build "$W/llama/build" -j "$(nproc)" --target llama-server 2>&1 | tail -3
    fi
  ) > "$OUT/llama_build.log" 2>&1 &
  local build=$!
  if [ ! -s "$W/llama3-8b.gguf" ]; then
    # One by one: the wheels of several Python versions (pyyaml) install only where they match.
    for whl in .gpu/wheels/*.whl; do pip install -q --target "$W/py" --no-deps "$whl" > /dev/null 2>&1; done
    PYTHONPATH=$W/py python3 tools/make_random_gguf.py "$W/llama3-8b.gguf" --shape llama3-8b --ctx 8192 \
      > "$OUT/make_gguf.log" 2>&1 || echo "make_random_gguf failed: $(tail -3 "$OUT/make_gguf.log")"
  fi
  ls -la "$W/llama3-8b.gguf"
  # Smoke: cider serve on CUDA with the embedded model; greedy completion == cider generate --device cuda.
  $B/cider serve --device cuda --port 0 > "$OUT/smoke_serve.log" 2>&1 &
  local pid=$!
  local port=""
  for _ in $(seq 1 120); do
    port=$(grep -o 'listening on http://[0-9.]*:[0-9]*' "$OUT/smoke_serve.log" | sed 's/.*://')
    [ -n "$port" ] && break
    sleep 0.5
  done
  if [ -n "$port" ] && wait_health "http://127.0.0.1:$port" "$pid"; then
    got=$(curl -s "http://127.0.0.1:$port/v1/completions" \
      -d '{"prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": 0}' |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"], end="")')
    want=$($B/cider generate --device cuda -p "def fibonacci(n):" --max-tokens 32 --temperature 0 2> /dev/null)
    if [ "$got" = "$want" ]; then echo "smoke: cuda serve greedy == cider generate --device cuda"; else
      echo "smoke: MISMATCH"; echo "serve: $got"; echo "generate: $want"; fi
  else
    echo "smoke: the server did not start: $(tail -5 "$OUT/smoke_serve.log")"
  fi
  kill -TERM "$pid" 2> /dev/null; wait "$pid"; echo "smoke serve exit $?"
  wait "$build"
  tail -3 "$OUT/llama_build.log"
  ls -la "$W/llama/build/bin/llama-server" 2>&1
}

phase_bench() {
  local maxb
  maxb=$(echo "$LEVELS" | tr ',' '\n' | sort -n | tail -1)
  nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
  echo "| engine | streams | completion tokens | wall s | aggregate tok/s | TTFT p50 ms | ITL p50 ms | ITL p99 ms |" |
    tee -a "$OUT/serve_bench.md"
  $B/cider serve -m "$W/llama3-8b.gguf" --device cuda --weights "$CIDER_WEIGHTS" --kv "$CIDER_KV" --ctx "$SLOT_CTX" \
    --max-batch "$maxb" --port 18080 > "$OUT/cider_serve.log" 2>&1 &
  bench_server "cider $CIDER_WEIGHTS $CIDER_KV" http://127.0.0.1:18080 $! "$MAX_TOKENS" "$OUT/serve_bench.md"
  [ -n "${SKIP_LLAMA:-}" ] && return
  "$W/llama/build/bin/llama-server" -m "$W/llama3-8b.gguf" -ngl 99 -fa on -ctk "$LLAMA_KV" -ctv "$LLAMA_KV" \
    -np "$maxb" -c $((maxb * SLOT_CTX)) --port 18081 > "$OUT/llama_server.log" 2>&1 &
  bench_server "llama-server Q4_K_M $LLAMA_KV" http://127.0.0.1:18081 $! "$MAX_TOKENS" "$OUT/serve_bench.md"
}

for p in "${@:-setup}"; do
  case "$p" in
    setup) phase_setup ;;
    bench) phase_bench ;;
    *) echo "serve_job.sh: unknown phase $p (setup, bench)"; exit 2 ;;
  esac
done
