#!/usr/bin/env bash
# Builds the randomized packet-corruption test and the control-message fuzz replay (every message type's decoder,
# a bounded count) with AddressSanitizer + UBSan (CPU only, its own build dir) and runs them; exits non-zero on any
# finding. Used by scripts/test.sh and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${LH_SANITIZE_BUILD_DIR:-build-sanitize}
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DLH_SANITIZE=ON -DLH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j "${LH_JOBS:-2}" --target compress_tests fuzz_control
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
"$BUILD_DIR/bin/compress_tests" --gtest_brief=1 --gtest_filter='*Corruption*'  # tests/compress/test_corruption.cpp
LH_FUZZ_MUTATIONS=${LH_FUZZ_MUTATIONS:-2000} "$BUILD_DIR/bin/fuzz_control"  # every control message type's decoder
echo "sanitize_check: the corruption tests and fuzz_control clean under ASan+UBSan"
