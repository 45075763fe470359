#!/usr/bin/env bash
# All set-up, then the main job: text generation with the embedded default model (models/cider-tiny: a 7.3M
# parameter Llama trained by this project on Debian's Python documentation and fortunes), bf16 weights and the
# default K4/V3 IsoQuant KV cache. Extra arguments go to `cider generate` (e.g. -m MODEL, --weights w8a8).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=build bash scripts/build.sh
./build/cider generate --echo -p "${CIDER_PROMPT:-The Python interpreter}" --max-tokens 96 "$@"
