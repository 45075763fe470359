#!/usr/bin/env bash
# Builds the CUDA backend here (nvcc 13, sm_90a, C++ runtime linked statically) and gathers what a GPU job needs in
# .gpu/ (ignored by git): the CUDA test programs, cuda_bench, the cider CLI and the PyTorch peer script.
# Then, on the GPU host: tools/gpu/run_gpu_job.sh (the device tool carries .gpu/).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCIDER_CUDA=ON -DCIDER_PORTABLE=ON > /dev/null
targets=(cuda_bench cider_cli)
for t in tests/cuda/test_cuda_*.cpp; do targets+=("$(basename "${t%.cpp}")"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"
rm -rf .gpu && mkdir -p .gpu/bin
for t in "${targets[@]}"; do
  exe=$BUILD_DIR/$t; [ "$t" = cider_cli ] && exe=$BUILD_DIR/cider
  cp "$exe" .gpu/bin/
done
anchors=${GPU_ANCHORS:-../shared/tools/gpu_anchors.py}
[ -f "$anchors" ] && cp "$anchors" .gpu/ || echo "pack: $anchors not found: the job will run without the PyTorch peers"
# The device tool carries at most 64 MiB with the working tree: strip and compress the programs.
strip .gpu/bin/*
# xz -9e: its 64 MiB dictionary sees the code the binaries share (41 MB at the default level, 12 MB so).
XZ_OPT=-9e tar -C .gpu -cJf .gpu/bin.tar.xz bin && rm -rf .gpu/bin
du -sh .gpu
