#!/usr/bin/env bash
# The whole test suite from a fresh Debian machine: install packages, build (CUDA sources compiled
# when nvcc is present), run ctest. Used by the README and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd "${LH_BUILD_DIR:-build}"
ctest --output-on-failure -j "${LH_TEST_JOBS:-2}" --timeout 900 "$@"
