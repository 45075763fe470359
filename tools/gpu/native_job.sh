#!/usr/bin/env bash
# Native GGUF weights on the GPU host (issue 22): the kernels' tests and speed, and cider beside llama.cpp CUDA on one
# random-weight Llama-3-8B-shaped Q4_K_M GGUF. Run from the repository root after `tar -C .gpu -xJf .gpu/pack.tar.xz`
# (tools/gpu/pack.sh), with .gpu/llama-src.tar.xz (llama.cpp's source as shipped in the llama-cpp-python sdist, trimmed
# to what llama-bench and llama-server build from: no docs, models, tests, other backends; tools/CMakeLists.txt naming
# llama-bench, mtmd, ui and server) and .gpu/wheels (gguf-py) carried in; llama.cpp is built in /tmp, outside the
# repository. Phases (each fits one
# 10-minute device command):
#   check   test_cuda_ggml, the native case of test_cuda_model, compute-sanitizer memcheck of test_cuda_ggml,
#           cuda_bench's native GEMV / GEMM rows (row kernel and warp per row) beside the W8A8/W4A8 GEMV rows and the
#           read-roof rows, and its native model rows with each decode kernel (PACK_ONLY="test_cuda_ggml
#           test_cuda_model cuda_bench")
#   e2e     builds llama-bench (CUDA, sm_90) while it writes the model (tools/make_random_gguf.py --shape llama3-8b);
#           `cider generate --device cuda` (native blocks, the default weights; k8v4 and the default cache) while it
#           builds, then on the idle host llama-bench (-fa 1, f16 and q8_0 caches), cider again, and both servers
#           (tools/serve_bench.py at $LEVELS streams; cider k8v4, llama-server q8_0 with -np slots) unless more than
#           $SERVE_DEADLINE s have gone (PACK_ONLY=cider_cli: the device tool carries at most 64 MiB with the tree)
#   kernel  one command when device calls are scarce: test_cuda_ggml, the native GEMV rows (row kernel and warp per
#           row) and read roofs, `cider generate --device cuda` with each decode kernel, while llama-bench builds
#           and the model is written; llama-bench (f16, q8_0 caches) if it built in time, memcheck of the row-kernel
#           test if time is left (PACK_ONLY="test_cuda_ggml cuda_bench cider_cli"; llama-bench's source only)
# Outputs under $OUT: native_job.txt (every result line), logs.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=/tmp/native
mkdir -p "$W"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
B=.gpu/bin
R=$OUT/native_job.txt
GEN=${GEN:-128}
PROMPT_TOKENS=${PROMPT_TOKENS:-512}
LEVELS=${LEVELS:-1,4,16,64}
G=$W/llama3-8b.gguf
log() { echo "$*" | tee -a "$R"; }

phase_check() {
  log "# check $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  log "## test_cuda_ggml"
  $B/test_cuda_ggml --gtest_brief=1 > "$OUT/test_cuda_ggml.log" 2>&1
  log "exit $? $(grep -E 'PASSED|FAILED' "$OUT/test_cuda_ggml.log" | tr '\n' ' ')"
  log "## test_cuda_model, the native case"
  $B/test_cuda_model --gtest_brief=1 --gtest_filter='*Native*' > "$OUT/test_cuda_model_native.log" 2>&1
  log "exit $? $(grep -E 'PASSED|FAILED|gpu_vs|int8_act|prefill_vs' "$OUT/test_cuda_model_native.log" | tr '\n' ' ')"
  log "## cuda_bench (native GEMV/GEMM, W8A8/W4A8 GEMV, read roofs)"
  for f in ggml- "gemv roof" "w4a8 gemv M1" "w8a8 gemv M1"; do $B/cuda_bench --filter "$f" --variants skip >> "$R" 2>&1; done
  log "## cuda_bench model rows (random weights in device memory, Llama-3-8B shapes)"
  $B/cuda_bench --area model --filter native --variants skip >> "$R" 2>&1
  log "## the same with CIDER_GGML_GEMV=rows (the row kernel for decode) and =warp"
  CIDER_GGML_GEMV=rows $B/cuda_bench --area model --filter native --variants skip >> "$R" 2>&1
  CIDER_GGML_GEMV=warp $B/cuda_bench --area model --filter native --variants skip >> "$R" 2>&1
  log "## test_cuda_model, the whole program"
  $B/test_cuda_model --gtest_brief=1 > "$OUT/test_cuda_model.log" 2>&1
  log "exit $? $(grep -E 'PASSED|FAILED' "$OUT/test_cuda_model.log" | tr '\n' ' ')"
  log "## memcheck test_cuda_ggml"
  compute-sanitizer --tool memcheck --error-exitcode 3 $B/test_cuda_ggml --gtest_brief=1 > "$OUT/memcheck_ggml.log" 2>&1
  log "exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_ggml.log" | tail -1)"
}

. tools/gpu/serve_lib.sh  # wait_health, bench_server

# llama.cpp (CUDA, sm_90) from .gpu/llama-src.tar.xz, built in $W: build_llama SERVER(ON|OFF) TARGET...
build_llama() {
  local server=$1
  shift
  mkdir -p "$W/llama" && tar -C "$W/llama" -xJf .gpu/llama-src.tar.xz
  cmake -S "$W/llama/llama.cpp" -B "$W/llama/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER="$server" -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
    -DBUILD_SHARED_LIBS=OFF > /dev/null
  local t
  for t in "$@"; do cmake --build "$W/llama/build" -j "$(nproc)" --target "$t" 2>&1 | tail -3; done
}

phase_e2e() {
  local t0
  t0=$(date +%s)
  log "# e2e $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  build_llama ON llama-bench llama-server > "$OUT/llama_build.log" 2>&1 &
  local build=$!
  pip install -q --target "$W/py" --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
  PYTHONPATH=$W/py python3 tools/make_random_gguf.py "$G" --shape llama3-8b --ctx 8192 > "$OUT/make_gguf.log" 2>&1 ||
    log "make_random_gguf failed: $(tail -3 "$OUT/make_gguf.log")"
  log "$(ls -la "$G")"
  local prompt
  prompt=$(python3 -c "print(' '.join(['the quick brown fox jumps over the lazy dog'] * ($PROMPT_TOKENS // 9)))")
  cider_round() {  # label
    for kv in k8v4 default; do
      local kvarg=()
      [ "$kv" != default ] && kvarg=(--kv "$kv")
      $B/cider generate -m "$G" --device cuda "${kvarg[@]}" --ctx 4096 --temperature 0 --max-tokens "$GEN" \
        --no-stream -p "$prompt" > "$OUT/cider_$1_$kv.log" 2>&1
      log "cider $1 kv=$kv: $(tail -1 "$OUT/cider_$1_$kv.log")"
    done
  }
  log "## cider generate --device cuda (native Q4_K_M blocks, the default weights), while llama.cpp builds"
  cider_round during-build
  wait $build
  log "llama build ($(( $(date +%s) - t0 )) s from the start): $(tail -1 "$OUT/llama_build.log")"
  log "## idle host: llama-bench -ngl 99 -fa 1 (f16 and q8_0 caches), then cider again"
  if [ -x "$W/llama/build/bin/llama-bench" ]; then
    "$W/llama/build/bin/llama-bench" -m "$G" -ngl 99 -fa 1 -ctk f16,q8_0 -ctv f16,q8_0 -p "$PROMPT_TOKENS" \
      -n "$GEN" -r 3 >> "$R" 2>&1
  else
    log "llama-bench did not build: $(tail -5 "$OUT/llama_build.log")"
  fi
  cider_round idle
  if [ $(( $(date +%s) - t0 )) -gt "${SERVE_DEADLINE:-400}" ]; then
    log "serving rows skipped: $(( $(date +%s) - t0 )) s gone"
    return
  fi
  local maxb
  maxb=$(echo "$LEVELS" | tr ',' '\n' | sort -n | tail -1)
  log "## serving (tools/serve_bench.py, $GEN tokens per stream, streams $LEVELS)"
  log "| engine | streams | completion tokens | wall s | aggregate tok/s | TTFT p50 ms | ITL p50 ms | ITL p99 ms |"
  $B/cider serve -m "$G" --device cuda --kv k8v4 --ctx 1024 --max-batch "$maxb" --port 18080 \
    > "$OUT/cider_serve.log" 2>&1 &
  bench_server "cider native k8v4" http://127.0.0.1:18080 $! "$GEN" "$R"
  if [ -x "$W/llama/build/bin/llama-server" ]; then
    "$W/llama/build/bin/llama-server" -m "$G" -ngl 99 -fa on -ctk q8_0 -ctv q8_0 -np "$maxb" -c $((maxb * 1024)) \
      --port 18081 > "$OUT/llama_server.log" 2>&1 &
    bench_server "llama-server Q4_K_M q8_0" http://127.0.0.1:18081 $! "$GEN" "$R"
  fi
}

# One command for a scarce device: the decode kernels' test and A/B, and the model beside llama-bench (no serving).
# llama.cpp builds and the model is written in the background from the start; the GPU timings run beside the build
# (the host's CPUs busy; the kernels are timed in CUDA graphs). Steps past $KERNEL_DEADLINE s are skipped.
phase_kernel() {
  local t0 deadline=${KERNEL_DEADLINE:-420}
  t0=$(date +%s)
  left() { [ $(( $(date +%s) - t0 )) -lt "$1" ]; }
  log "# kernel $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  build_llama OFF llama-bench > "$OUT/llama_build.log" 2>&1 &
  local build=$!
  (
    pip install -q --target "$W/py" --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
    PYTHONPATH=$W/py python3 tools/make_random_gguf.py "$G" --shape llama3-8b --ctx 8192
  ) > "$OUT/make_gguf.log" 2>&1 &
  local gguf=$!
  log "## test_cuda_ggml"
  $B/test_cuda_ggml --gtest_brief=1 > "$OUT/test_cuda_ggml.log" 2>&1
  log "exit $? $(grep -E 'PASSED|FAILED' "$OUT/test_cuda_ggml.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
  log "## cuda_bench: native GEMV (row kernel / warp per row), read roofs"
  for f in "ggml-gemv" "gemv roof read"; do $B/cuda_bench --filter "$f" --variants skip >> "$R" 2>&1; done
  wait $gguf || log "make_random_gguf failed: $(tail -3 "$OUT/make_gguf.log")"
  local prompt
  prompt=$(python3 -c "print(' '.join(['the quick brown fox jumps over the lazy dog'] * ($PROMPT_TOKENS // 9)))")
  for run in rows:k8v4 warp:k8v4 rows:default; do
    left "$deadline" || { log "cider $run skipped: $(( $(date +%s) - t0 )) s gone"; continue; }
    local kern=${run%%:*} kv=${run##*:} kvarg=()
    [ "$kv" != default ] && kvarg=(--kv "$kv")
    CIDER_GGML_GEMV=$kern $B/cider generate -m "$G" --device cuda "${kvarg[@]}" --ctx 4096 --temperature 0 \
      --max-tokens "$GEN" --no-stream -p "$prompt" > "$OUT/cider_${kern}_$kv.log" 2>&1
    log "cider CIDER_GGML_GEMV=$kern kv=$kv ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/cider_${kern}_$kv.log")"
  done
  if kill -0 "$build" 2> /dev/null; then
    log "llama.cpp still building at $(( $(date +%s) - t0 )) s: llama-bench not run"
    kill "$build" 2> /dev/null
  elif [ -x "$W/llama/build/bin/llama-bench" ] && left "$deadline"; then
    log "## llama-bench -ngl 99 -fa 1 (f16 and q8_0 caches)"
    "$W/llama/build/bin/llama-bench" -m "$G" -ngl 99 -fa 1 -ctk f16,q8_0 -ctv f16,q8_0 -p "$PROMPT_TOKENS" \
      -n "$GEN" -r 2 >> "$R" 2>&1
  else
    log "llama-bench not run: $(tail -3 "$OUT/llama_build.log")"
  fi
  if left "${MEMCHECK_DEADLINE:-$deadline}"; then
    log "## memcheck of test_cuda_ggml's row-kernel test"
    compute-sanitizer --tool memcheck --error-exitcode 3 $B/test_cuda_ggml --gtest_brief=1 \
      --gtest_filter='*RowKernel*' > "$OUT/memcheck_rows.log" 2>&1
    log "exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_rows.log" | tail -1)"
  else
    log "memcheck skipped: $(( $(date +%s) - t0 )) s gone"
  fi
}

for p in "${@:-check}"; do
  case "$p" in
    check) phase_check ;;
    e2e) phase_e2e ;;
    kernel) phase_kernel ;;
    *) echo "native_job.sh: unknown phase $p (check, e2e, kernel)"; exit 2 ;;
  esac
done
cat "$R"
