#!/usr/bin/env bash
# The installable package: installs the build in ${BUILD_DIR:-build} into a temporary prefix, builds the out-of-tree
# examples (examples/generate: C++ facade, static library; examples/c_api: C API, shared library) against it with
# find_package(cider), and runs each on the embedded model cider-tiny: each must exit 0 and print a continuation.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" > /dev/null
prompt="Once upon a time"
for ex in generate c_api; do
  cmake -S "examples/$ex" -B "$tmp/$ex" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" > /dev/null
  cmake --build "$tmp/$ex" -j "$(nproc)" > /dev/null
done
for exe in "$tmp/generate/generate" "$tmp/c_api/generate_c"; do
  out=$("$exe" models/cider-tiny "$prompt" 16)
  if [ "${#out}" -le "${#prompt}" ] || [ "${out#"$prompt"}" = "$out" ]; then
    echo "error: $(basename "$exe") printed no continuation of \"$prompt\": \"$out\"" >&2
    exit 1
  fi
  echo "$(basename "$exe"): $out"
done
