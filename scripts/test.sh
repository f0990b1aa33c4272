#!/usr/bin/env bash
# The whole test suite from a fresh Debian machine: install packages, build (CUDA sources compiled
# when nvcc is present), run the sanitizer check and ctest. Used by the README and .ci/run.
#
#   bash scripts/test.sh [--fresh-root] [ctest args...]
# --fresh-root (CI, root only) then also runs the README's two commands, as written, in a throw-away
# minimal Debian root (scripts/fresh_root_check.sh): a package missing from setup.sh fails there.
# $LH_TEST_ARGS: more ctest arguments, after the ones given (the fresh root sets "-L fresh": only the tests
# labelled `fresh`, which touch every dependency once; the labels are listed in tests/CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
FRESH_ROOT=0
if [ "${1:-}" = "--fresh-root" ]; then FRESH_ROOT=1; shift; fi
bash scripts/setup.sh
bash scripts/build.sh
# Spinning OpenMP threads make a shared 2-core machine several times slower.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
bash scripts/sanitize_check.sh  # packet corruption test under ASan+UBSan (own CPU build dir)
# shellcheck disable=SC2086  # LH_TEST_ARGS is a list of words
(cd "${LH_BUILD_DIR:-build}" && ctest --output-on-failure -j "${LH_TEST_JOBS:-2}" --timeout 900 "$@" ${LH_TEST_ARGS:-})
if [ "$FRESH_ROOT" = 1 ]; then bash scripts/fresh_root_check.sh; fi
