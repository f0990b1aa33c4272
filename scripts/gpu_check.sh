#!/usr/bin/env bash
# One short run on a machine with a GPU: the `gpu` tests, CPU-vs-CUDA training and job checks, and
# `longhaul bench core|codecs|train` with the GPU. Used on lent GPU machines (device `run`); outputs land
# under ${OUT:-out}/ in at most 8 files. Budget about 6 minutes in all.
#
# Two ways to get the binaries:
# - LH_GPU_BUNDLE=FILE: a tarball from scripts/gpu_bundle.sh (built on a machine with the Debian
#   packages; the lent machines cannot fetch any). Nothing is built.
# - otherwise: setup.sh, then a CUDA build into build-gpu (needs the packages and about 5 minutes).
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

BUNDLE_DIR=/tmp/lh-gpu-bundle
if [ -n "${LH_GPU_BUNDLE:-}" ]; then
  rm -rf "$BUNDLE_DIR" && mkdir -p "$BUNDLE_DIR"
  tar -C "$BUNDLE_DIR" -xJf "$LH_GPU_BUNDLE" || { step_failed "unpack $LH_GPU_BUNDLE"; exit 1; }
  BIN_DIR=$BUNDLE_DIR/bin
  # cuBLAS from the CUDA toolkit there, or from the pip wheel its Python carries.
  CUBLAS_DIRS=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | tr '\n' ':')
  PIP_CUBLAS=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$BUNDLE_DIR/lib:${CUBLAS_DIRS}${PIP_CUBLAS}:${LD_LIBRARY_PATH:-}"
  export UCX_MODULE_DIR=$BUNDLE_DIR/lib/ucx
  log "bundle $LH_GPU_BUNDLE: $(ls "$BIN_DIR" | tr '\n' ' ')"
  ldd "$BIN_DIR/longhaul" | grep "not found" | tee -a "$LOG"
  : >"$OUT_DIR/ctest_gpu.log"
  for t in "$BIN_DIR"/*_gpu_tests; do
    echo "=== $(basename "$t")" >>"$OUT_DIR/ctest_gpu.log"
    timeout 120 "$t" >>"$OUT_DIR/ctest_gpu.log" 2>&1 || step_failed "$(basename "$t")"
  done
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$OUT_DIR/ctest_gpu.log" | tee -a "$LOG"
else
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
  GPU_TESTS=$(find tests -name 'test_*_gpu.cpp' | sed -E 's#^tests/([^/]+)/.*#\1_gpu_tests#' | sort -u)
  log "building longhaul and: $(echo $GPU_TESTS | tr '\n' ' ')"
  # shellcheck disable=SC2086
  if ! timeout 300 cmake --build "$BUILD_DIR" -j "$JOBS" --target longhaul $GPU_TESTS >>"$OUT_DIR/build.log" 2>&1; then
    step_failed "build (see build.log)"
    tail -40 "$OUT_DIR/build.log" | tee -a "$LOG"
    exit 1
  fi
  log "build done"
  BIN_DIR=$BUILD_DIR/bin
  # 3. GPU tests.
  (cd "$BUILD_DIR" && timeout 180 ctest -L gpu --output-on-failure --timeout 120 -j 4) >"$OUT_DIR/ctest_gpu.log" 2>&1 ||
    step_failed "ctest -L gpu (see ctest_gpu.log)"
  tail -5 "$OUT_DIR/ctest_gpu.log" | tee -a "$LOG"
fi

BIN="$BIN_DIR/longhaul"
"$BIN" --version | tee -a "$LOG"
JOBS_LOG="$OUT_DIR/jobs.log"
: >"$JOBS_LOG"

# 4. The same training on the CPU and the GPU: per-step losses side by side (float sums in another
#    order: close, not equal), and tokens/s.
# Per-step losses: a job's "steps" table (every step it prints), else train's "step N/M  loss X" lines.
losses() {
  if grep -qE '^step +loss$' "$1"; then
    sed -nE '/^step +loss$/,/^loss:/ s/^ +([0-9]+) +([0-9.]+)$/\1 \2/p' "$1"
  else
    sed -nE 's/^step ([0-9]+)\/[0-9]+ +loss ([0-9.]+).*/\1 \2/p' "$1"
  fi | sort -u -k1,1
}
compare() { # compare NAME CPU_LOG CUDA_LOG
  join <(losses "$2") <(losses "$3") | awk -v n="$1" -v want="$(losses "$2" | wc -l)" '
    { d = ($2 - $3); if (d < 0) d = -d; r = d / $2; if (r > m) m = r; k++ }
    END { if (k == 0 || k != want) { printf "%s: %d of %d steps have both losses\n", n, k, want; exit 1 }
          printf "%s: %d steps, max relative loss difference cpu vs cuda %.2e\n", n, k, m; exit (m > 0.02) }' | tee -a "$LOG"
  return "${PIPESTATUS[1]}"
}
job() { # job NAME ARGS...: run on cpu and cuda, compare
  local name=$1; shift
  for dev in cpu cuda; do
    echo "=== $name --device $dev: $*" >>"$JOBS_LOG"
    timeout 120 "$BIN" "$@" "${DATA_FLAG[@]}" --device "$dev" >"/tmp/$name.$dev.log" 2>&1 || step_failed "$name --device $dev (exit $?)"
    cat "/tmp/$name.$dev.log" >>"$JOBS_LOG"
  done
  compare "$name" "/tmp/$name.cpu.log" "/tmp/$name.cuda.log" || step_failed "$name: cpu and cuda losses differ"
  grep -hE "tokens/s: mean" "/tmp/$name.cpu.log" "/tmp/$name.cuda.log" | sed "s/^/  $name /" | tee -a "$LOG"
}
# The lent machines have no Debian fortunes: the bundle carries the same text as one file.
DATA_FLAG=()
[ -n "${LH_GPU_BUNDLE:-}" ] && [ -f "$BUNDLE_DIR/data/corpus.txt" ] && DATA_FLAG=(--data "$BUNDLE_DIR/data/corpus.txt")
job train train --model small --steps 20 --batch 8 --eval-every 10
job pp2_int8 launch --workers 2 --pp 2 --model small --steps 20 --compress-fwd int8 --compress-bwd int8 --metrics /tmp/pp2.jsonl
job dp2_none launch --workers 2 --dp 2 --model small --steps 20 --metrics /tmp/dp2n.jsonl
job dp2_powersgd launch --workers 2 --dp 2 --model small --steps 20 --compress-grad powersgd:rank=4 --metrics /tmp/dp2.jsonl
job tp2_int8 launch --workers 2 --tp 2 --model small --heads 4 --steps 20 --compress-tp int8 --metrics /tmp/tp2.jsonl

# 5. Benchmarks (LH_GPU_SKIP_BENCH=1 skips them, for a second try within the same lease).
if [ "${LH_GPU_SKIP_BENCH:-0}" = 1 ]; then
  log "done, status $status (benchmarks skipped)"
  exit $status
fi
timeout 90 "$BIN" bench core --json --device all >"$OUT_DIR/bench_core.jsonl" 2>>"$LOG" ||
  step_failed "bench core"
timeout 120 "$BIN" bench codecs --json --device all >"$OUT_DIR/bench_codecs.jsonl" 2>>"$LOG" ||
  step_failed "bench codecs"
for dev in cpu cuda; do
  timeout 90 "$BIN" bench train --json --device "$dev" --models small >>"$OUT_DIR/bench_train.jsonl" 2>>"$LOG" ||
    step_failed "bench train --device $dev"
done
log "done, status $status"
exit $status
