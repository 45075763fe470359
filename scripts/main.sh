#!/usr/bin/env bash
# All set-up, then the main job: the cider demo (until the engine lands, a report of each KV-cache configuration:
# bytes per token and attention error on random data with outlier channels).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=build bash scripts/build.sh
./build/cider demo "$@"
