#!/usr/bin/env bash
# The test command (README, .ci/run): install dependencies, build, run the CPU tests (among them
# python_package: pip install . and the Python package's tests), the GPU tests (they skip visibly
# without a GPU) and the analysis tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD=${MXLAB_BUILD_DIR:-build}
JOBS=${MXLAB_JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j "$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" -L 'cpu|gpu'
if [ -d analysis/tests ]; then
  MXLAB_BINARY="$PWD/$BUILD/mxlab" python3 -m pytest -q analysis/tests
fi
