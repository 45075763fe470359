#!/usr/bin/env bash
# End-to-end tests of `cider serve` (tests/serve/test_serve.py): real servers on ephemeral ports, driven by the
# official `openai` client and raw HTTP; and the chat page in Debian's headless Chromium (tests/serve/test_chat_page.py,
# ~5 s: it fails without `chromium` unless CIDER_SKIP_BROWSER=1; `-k chat_page` runs it alone). A venv in
# build/serve-venv (created once, reused) holds openai and pytest from PyPI. The binary is $CIDER_BIN (default
# build/cider; build it first: scripts/build.sh). Extra arguments go to pytest (e.g. -k stop, -x). About 45 s on 2
# cores, 20 of them the load test ($CIDER_SERVE_LOAD_SECONDS); the first run also creates the venv (~10 s).
# Debian 12 after scripts/setup.sh (python3-venv, chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
export CIDER_BIN=${CIDER_BIN:-build/cider}
[ -x "$CIDER_BIN" ] || { echo "test_serve: no cider binary at $CIDER_BIN (build it first: scripts/build.sh)"; exit 1; }
venv=build/serve-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check openai pytest
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/serve "$@"
