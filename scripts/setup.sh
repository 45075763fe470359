#!/usr/bin/env bash
# Installs what cider needs to build and test on Debian 12 (run as root; skips packages already present).
# chromium and a font: the chat page's headless-browser test (tests/serve/test_chat_page.py).
set -euo pipefail
packages=(cmake g++ make pkg-config libgtest-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libpcre2-dev python3 python3-venv python3-dev
          chromium fonts-dejavu-core)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "cider setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
