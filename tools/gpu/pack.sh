#!/usr/bin/env bash
# Builds the CUDA backend here (nvcc 13, sm_90a, C++ runtime linked statically) and packs what a GPU job needs into
# .gpu/pack.tar.xz: the CUDA test programs, cuda_bench and the cider CLI (bin/), and .gpu/REVISION (the test data
# comes with the working tree). .gpu/ is not
# tracked; the device tool carries it with the working tree (name it in `carry` where it is ignored). Then, on the GPU
# host: tools/gpu/run_gpu_job.sh PHASE... (docs/cuda/gpu_job.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
# No -lineinfo (CIDER_CUDA_LINEINFO): a third of the kernels' bytes, so the pack and the tree fit the device tool's 64 MiB.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCIDER_CUDA=ON -DCIDER_PORTABLE=ON -DCIDER_CUDA_LINEINFO=OFF > /dev/null
targets=(cuda_bench cider_cli)
for t in tests/cuda/test_cuda_*.cpp; do targets+=("$(basename "${t%.cpp}")"); done
# PACK_ONLY="test_cuda_model cuda_bench …": only those (the device tool carries at most 64 MiB with the tree).
if [ -n "${PACK_ONLY:-}" ]; then read -r -a targets <<< "$PACK_ONLY"; fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"
rm -rf .gpu && mkdir -p .gpu/bin
for t in "${targets[@]}"; do
  exe=$BUILD_DIR/$t; [ "$t" = cider_cli ] && exe=$BUILD_DIR/cider
  cp "$exe" .gpu/bin/
done
# The test data (models/cider-tiny, tests/data/hf_fixtures) is not packed: the device tool carries the working tree,
# and the test programs find it by walking up from .gpu/bin to the repository root (tests/support/test_support.h).
# `cider serve` links Debian's cpp-httplib (and its brotli / OpenSSL), which the GPU host lacks: carried in lib/
# (LD_LIBRARY_PATH=.gpu/lib on the host).
mkdir -p .gpu/lib
for lib in $(ldd "$BUILD_DIR/cider" | awk '/httplib|brotli|libssl|libcrypto/ {print $3}'); do cp -L "$lib" .gpu/lib/; done
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || rev="$rev+uncommitted changes"
echo "$rev, packed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)" > .gpu/REVISION
# The device tool carries at most 64 MiB with the working tree: strip and compress the programs.
strip .gpu/bin/*
# xz -9e: its 64 MiB dictionary sees the code the binaries share (41 MB at the default level, 12 MB so).
XZ_OPT="-9e -T0" tar -C .gpu -cJf .gpu/pack.tar.xz bin lib && rm -rf .gpu/bin .gpu/lib
du -sh .gpu
