#!/usr/bin/env bash
# All set-up, then the whole test suite (GoogleTest through CTest, then the Python package through pytest). Fresh random inputs each run; the seed is
# printed by each test binary (replay with CIDER_TEST_SEED=<seed>).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=build bash scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
# `cider serve` end to end: the openai client and raw HTTP against build/cider, the chat page in headless Chromium
# (scripts/test_serve.sh).
bash scripts/test_serve.sh
# The Python package: wheel, fresh venv, pytest (scripts/test_python.sh).
bash scripts/test_python.sh
