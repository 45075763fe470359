#!/usr/bin/env bash
# Mixture-of-experts speed on the GPU host: cider (--device cuda) beside llama.cpp's llama-bench (CUDA) on one
# random-weight Mixtral-8x7B-shaped Q4_K_M GGUF with $LAYERS of its 32 layers (tools/make_random_gguf.py --shape
# mixtral-8x7b --layers N: every layer has the real model's shapes, so per-token times scale with the layer count;
# fewer layers keep the file, the load and the run inside one 10-minute device command). Run from the repository
# root after `tar -C .gpu -xJf .gpu/pack.tar.xz` (tools/gpu/pack.sh), with .gpu/llama-src.tar.xz (llama.cpp's source
# as shipped in the llama-cpp-python sdist) and .gpu/wheels (gguf-py) carried in. llama.cpp is built in /tmp.
# Outputs under $OUT: moe_bench.txt (both engines' lines), logs.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
W=/tmp/moe
mkdir -p "$W"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
LAYERS=${LAYERS:-8}
PROMPT_TOKENS=${PROMPT_TOKENS:-512}
GEN=${GEN:-64}
WEIGHTS=${WEIGHTS:-w4a8 w8a8}  # cider's weight formats to run
ROUNDS=${ROUNDS:-1}            # alternating rounds of the two routings (the host's speed drifts between minutes)
G=$W/mixtral-${LAYERS}l.gguf
(
  mkdir -p "$W/llama" && tar -C "$W/llama" -xJf .gpu/llama-src.tar.xz
  cmake -S "$W/llama/llama.cpp" -B "$W/llama/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF > /dev/null
  cmake --build "$W/llama/build" -j "$(nproc)" --target llama-bench 2>&1 | tail -3
) > "$OUT/llama_build.log" 2>&1 &
build=$!
pip install -q --target "$W/py" --no-deps .gpu/wheels/*.whl > /dev/null 2>&1
PYTHONPATH=$W/py python3 tools/make_random_gguf.py "$G" --shape mixtral-8x7b --layers "$LAYERS" --ctx 4096 \
  > "$OUT/make_gguf.log" 2>&1 || echo "make_random_gguf failed: $(tail -3 "$OUT/make_gguf.log")"
ls -la "$G"
# A prompt of about PROMPT_TOKENS tokens of the fixture vocabulary (the file's tokenizer is a small BPE one).
prompt=$(python3 -c "import sys; print(' '.join(['the quick brown fox jumps over the lazy dog'] * ($PROMPT_TOKENS // 9)))")
# Each weight format converted once into cider's format (beside the build), so that every timed run loads in seconds.
for w in $WEIGHTS; do
  rm -rf "$W/conv-$w"
  .gpu/bin/cider convert -m "$G" --weights "$w" -o "$W/conv-$w" > "$OUT/convert-$w.log" 2>&1 ||
    echo "convert $w failed: $(tail -3 "$OUT/convert-$w.log")"
done
wait $build  # the timings below run on an idle host (the build takes every CPU)
# $BUSY_PID: another process of the same job using the GPU (tests run beside the build); the timings wait for it.
while [ -n "${BUSY_PID:-}" ] && kill -0 "$BUSY_PID" 2> /dev/null; do sleep 2; done
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $LAYERS of 32 Mixtral-8x7B layers"
  for w in $WEIGHTS; do
    # MoE decode rows routed on the device (the default: graphs) or on the host (the path prefill keeps)
    for routing in $(for r in $(seq "$ROUNDS"); do echo device host; done); do
      echo "## cider --device cuda --weights $w --kv k8v4, CIDER_CUDA_MOE_ROUTING=$routing"
      CIDER_CUDA_MOE_ROUTING=$routing .gpu/bin/cider generate -m "$W/conv-$w" --device cuda --weights $w --kv k8v4 --ctx 4096 \
        --temperature 0 --max-tokens "$GEN" --no-stream -p "$prompt" 2>&1 | tail -1
    done
  done
} > "$OUT/moe_bench.txt" 2>&1
echo "## cuda_bench: an expert's gate|up GEMM (its 128 rows of a 512-token prefill) against the dense one (512 rows)" \
  >> "$OUT/moe_bench.txt"
if [ -x .gpu/bin/cuda_bench ]; then .gpu/bin/cuda_bench --filter "moe-" >> "$OUT/moe_bench.txt" 2>&1; fi
echo "## llama-bench (CUDA, -ngl 99 -fa 1, Q4_K_M as it is, f16 KV)" >> "$OUT/moe_bench.txt"
if [ -x "$W/llama/build/bin/llama-bench" ]; then
  "$W/llama/build/bin/llama-bench" -m "$G" -ngl 99 -fa 1 -p "$PROMPT_TOKENS" -n "$GEN" -r 3 >> "$OUT/moe_bench.txt" 2>&1
else
  echo "llama-bench did not build: $(tail -5 "$OUT/llama_build.log")" >> "$OUT/moe_bench.txt"
fi
cat "$OUT/moe_bench.txt"
