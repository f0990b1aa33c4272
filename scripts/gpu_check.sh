#!/usr/bin/env bash
# One short run on a machine with a GPU: setup, CUDA build into build-gpu, `ctest -L gpu`, then
# `longhaul bench core --json` (and `bench codecs --json` when that command exists). Used on lent GPU
# machines (device `run`); outputs land under ${OUT:-out}/ in at most 5 files (gpu_check.log, build.log,
# ctest_gpu.log, bench_core.jsonl, bench_codecs.jsonl). Budget about 8 minutes in all.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-out}
BUILD_DIR=${LH_GPU_BUILD_DIR:-build-gpu}
JOBS=${LH_JOBS:-$(nproc)}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
: >"$LOG"
: >"$OUT_DIR/build.log"
START=$(date +%s)
status=0
log() { echo "[gpu_check +$(($(date +%s) - START))s] $*" | tee -a "$LOG"; }
step_failed() { log "FAILED: $*"; status=1; }

log "host $(hostname), $(nproc) cores"
nvidia-smi >>"$LOG" 2>&1 || log "nvidia-smi not available"
# Build only for this GPU's architecture when it is known (half the nvcc time); else the pinned set.
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
ARCH_FLAG=()
[ -n "$ARCH" ] && ARCH_FLAG=(-DCMAKE_CUDA_ARCHITECTURES="$ARCH")
log "CUDA architecture: ${ARCH:-pinned default}"

# 1. Packages. A lent machine may have no network: a failed setup is logged and the build is tried
#    anyway (it fails clearly at configure if something is really missing).
if [ "${LH_SKIP_SETUP:-0}" != 1 ]; then
  timeout 180 bash scripts/setup.sh >>"$OUT_DIR/build.log" 2>&1 || log "setup.sh failed or timed out (see build.log); trying the build anyway"
fi

# 2. CUDA build: the longhaul binary and every *_gpu test executable.
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
if ! timeout 120 cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DLH_CUDA=ON "${ARCH_FLAG[@]}" >>"$OUT_DIR/build.log" 2>&1; then
  step_failed "configure (see build.log)"
  exit 1
fi
GPU_TESTS=$(find tests -name 'test_*_gpu.cpp' | sed -E 's#^tests/([^/]+)/(test_[A-Za-z0-9_]+)\.cpp$#\1_\2#' | sort)
log "building longhaul and: $(echo $GPU_TESTS | tr '\n' ' ')"
# shellcheck disable=SC2086
if ! timeout 300 cmake --build "$BUILD_DIR" -j "$JOBS" --target longhaul $GPU_TESTS >>"$OUT_DIR/build.log" 2>&1; then
  step_failed "build (see build.log)"
  tail -40 "$OUT_DIR/build.log" | tee -a "$LOG"
  exit 1
fi
log "build done"

# 3. GPU tests.
(cd "$BUILD_DIR" && timeout 180 ctest -L gpu --output-on-failure --timeout 120 -j 4) >"$OUT_DIR/ctest_gpu.log" 2>&1 ||
  step_failed "ctest -L gpu (see ctest_gpu.log)"
tail -5 "$OUT_DIR/ctest_gpu.log" | tee -a "$LOG"

# 4. Benchmarks.
BIN="$BUILD_DIR/bin/longhaul"
"$BIN" --version | tee -a "$LOG"
timeout 120 "$BIN" bench core --json --device all >"$OUT_DIR/bench_core.jsonl" 2>>"$LOG" ||
  step_failed "bench core"
if "$BIN" bench codecs --help >/dev/null 2>&1; then
  timeout 120 "$BIN" bench codecs --json --device all >"$OUT_DIR/bench_codecs.jsonl" 2>>"$LOG" ||
    step_failed "bench codecs"
else
  log "longhaul bench codecs not available in this tree: skipped"
fi
log "done, status $status"
exit $status
