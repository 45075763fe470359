#!/usr/bin/env bash
# All set-up, then the main job: text generation with the embedded default model (models/cider-tiny: a 7.3M
# parameter Llama trained by this project on Debian's Python documentation and fortunes), bf16 weights and the
# default KV cache (K8/V4, group 64, Hadamard rotation: docs/quality.md). Extra arguments go to `cider generate` (e.g. -m MODEL, --weights w8a8).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=build bash scripts/build.sh
./build/cider generate --echo -p "${CIDER_PROMPT:-The Python interpreter}" --max-tokens 96 "$@"
