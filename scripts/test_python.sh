#!/usr/bin/env bash
# The Python package: builds the wheel (`python -m build`: scikit-build-core + nanobind from PyPI, the library and
# the extension compiled once), installs it into a fresh venv, checks that it imports outside the source tree, and
# runs tests/python/test_package.py with pytest against the CLI in ${BUILD_DIR:-build} (scripts/test.sh builds it).
# Everything lands in build-py/ (git-ignored). Run as root on Debian 12 after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=build-py
cli=${CIDER_CLI:-$root/${BUILD_DIR:-build}/cider}
[ -x "$cli" ] || { echo "test_python: no cider CLI at $cli (build it first: scripts/build.sh)"; exit 1; }
python=${PYTHON:-python3}
rm -rf "$out"
mkdir -p "$out"
"$python" -m venv "$out/tools"
"$out/tools/bin/pip" install -q --disable-pip-version-check build
start=$(date +%s)
"$out/tools/bin/python" -m build --wheel --outdir "$out/dist" . > "$out/build.log" 2>&1 || { tail -n 60 "$out/build.log"; exit 1; }
wheel=$(ls "$out"/dist/cider-*.whl)
echo "test_python: built $(basename "$wheel") in $(( $(date +%s) - start )) s"
"$python" -m venv "$out/venv"
"$out/venv/bin/pip" install -q --disable-pip-version-check "$wheel" pytest ml_dtypes
# Imported from outside the repository: the installed wheel, not python/cider.
(cd /tmp && "$root/$out/venv/bin/python" -c "import cider; print('test_python: import cider', cider.__version__, 'from', cider.__file__)")
cd "$out"
CIDER_CLI="$cli" "$root/$out/venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$root/tests/python/test_package.py"
