#!/usr/bin/env bash
# Configures and builds longhaul into build/ (or $LH_BUILD_DIR). Extra args go to cmake configure,
# e.g. scripts/build.sh -DLH_CUDA=OFF. Used by scripts/test.sh, the README and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${LH_BUILD_DIR:-build}
JOBS=${LH_JOBS:-$(nproc)}
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" "$@"
elif [ "$#" -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" "$@"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
