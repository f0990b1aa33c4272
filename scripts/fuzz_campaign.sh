#!/usr/bin/env bash
# A libFuzzer campaign over the packet decoders (fuzz_decode) and every control message type's decoder
# (fuzz_control): builds them with clang, libFuzzer, ASan and UBSan (CPU only, its own build dir), writes the seed
# corpora and runs each target for LH_FUZZ_SECONDS (default 120). CI runs the same targets as bounded replays under
# ASan+UBSan (scripts/sanitize_check.sh); this is the longer, coverage-guided search. Exits non-zero on a finding
# (the crashing input is left in the corpus directory's parent, as libFuzzer writes it).
set -euo pipefail
cd "$(dirname "$0")/.."
CXX_BIN=${LH_FUZZ_CXX:-$(command -v clang++ || true)}
CC_BIN=${LH_FUZZ_CC:-$(command -v clang || true)}
if [[ -z "$CXX_BIN" || -z "$CC_BIN" ]]; then
  echo "fuzz_campaign: needs clang (apt-get install clang)" >&2
  exit 2
fi
BUILD_DIR=${LH_FUZZ_BUILD_DIR:-build-fuzz}
SECONDS_EACH=${LH_FUZZ_SECONDS:-120}
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_CXX_COMPILER="$CXX_BIN" -DCMAKE_C_COMPILER="$CC_BIN" \
  -DLH_SANITIZE=ON -DLH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j "${LH_JOBS:-2}" --target fuzz_decode fuzz_decode_seeds fuzz_control fuzz_control_seeds
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
WORK=$BUILD_DIR/campaign
rm -f "$WORK"/crash-* "$WORK"/leak-* "$WORK"/timeout-* "$WORK"/oom-*
for target in fuzz_control fuzz_decode; do
  corpus=$WORK/$target
  mkdir -p "$corpus"
  "$BUILD_DIR/bin/${target}_seeds" --write-corpus "$corpus" >/dev/null
  echo "fuzz_campaign: $target for ${SECONDS_EACH} s from $(ls "$corpus" | wc -l) inputs"
  (cd "$WORK" && "../bin/$target" -max_total_time="$SECONDS_EACH" -print_final_stats=1 "$target" 2>&1) |
    grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::new_units_added|==[0-9]+==ERROR|SUMMARY)" || true
  found=$(find "$WORK" -maxdepth 1 \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \))
  if [[ -n "$found" ]]; then
    echo "fuzz_campaign: $target found a problem; replay it with $BUILD_DIR/bin/$target FILE: $found" >&2
    exit 1
  fi
done
echo "fuzz_campaign: fuzz_control and fuzz_decode ran ${SECONDS_EACH} s each under libFuzzer+ASan+UBSan, no finding"
