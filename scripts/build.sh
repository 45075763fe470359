#!/usr/bin/env bash
# Configures and builds cider in ${BUILD_DIR:-build} (Release, warnings as errors). Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" > /dev/null
cmake --build "$build_dir" -j "$(nproc)"
