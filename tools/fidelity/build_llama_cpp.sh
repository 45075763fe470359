#!/usr/bin/env bash
# Fetches llama.cpp's source as shipped inside the llama-cpp-python sdist on PyPI and builds only its
# tools (CPU, native; default llama-perplexity, or $TARGETS, e.g. "llama-server llama-bench") OUTSIDE the repository,
# for side-by-side measurements. Nothing from llama.cpp is stored in this repository.
# Usage: [TARGETS="llama-perplexity llama-server"] tools/fidelity/build_llama_cpp.sh [WORKDIR=/tmp/fid-llama] [JOBS=2]
set -euo pipefail
WORK=${1:-/tmp/fid-llama}
JOBS=${2:-2}
mkdir -p "$WORK"
cd "$WORK"
if ! ls llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
  pip download --no-binary :all: --no-deps llama-cpp-python -d .
fi
SDIST=$(ls llama_cpp_python-*.tar.gz | sort -V | tail -1)
DIR=${SDIST%.tar.gz}
[ -d "$DIR" ] || tar xzf "$SDIST"
SRC="$WORK/$DIR/vendor/llama.cpp"
echo "llama.cpp source: $SRC"
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF
TARGETS=${TARGETS:-llama-perplexity}
# shellcheck disable=SC2086
cmake --build "$WORK/build" -j"$JOBS" --target $TARGETS
for t in $TARGETS; do ls -la "$WORK/build/bin/$t"; done
