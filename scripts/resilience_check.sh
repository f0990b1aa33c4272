#!/usr/bin/env bash
# The resilience cases at full length (CI runs them short): a flood of 100000 malformed control messages from a
# client that never reads, against the same job without it; a SIGKILLed worker rolled back to its checkpoint (both
# grids); resume past a corrupted checkpoint; a SIGKILLed coordinator restarted with --resume; workers joining a
# minute apart and one paused 2 s; connections reset mid-run; a stalled link named; an --elastic job losing a
# replica. Used by people and the resilience issue's closing note.
#
#   scripts/resilience_check.sh [BUILD_DIR]      (default: build)
# Environment: FLOOD (100000 messages), JOIN_GAP (60: seconds between the two workers' joins).
set -euo pipefail

BUILD="${1:-build}"
TESTS="$BUILD/bin/integration_tests"
[ -x "$TESTS" ] || { echo "resilience_check.sh: no $TESTS (build first: bash scripts/build.sh)" >&2; exit 1; }
export LH_BIN="$BUILD/bin/longhaul" OMP_WAIT_POLICY=PASSIVE LH_FLOOD_MESSAGES="${FLOOD:-100000}" \
  LH_JOIN_GAP_S="${JOIN_GAP:-60}"
"$TESTS" --gtest_filter='*Flood*:*RecoveredWorker*:*ResumeFallsBack*:*ACoordinatorKilled*:*WorkersJoiningApart*:*ConnectionsAreReset*:*StalledLink*:*ElasticJob*' |
  grep -E '^\[ *(RUN|OK|FAILED|PASSED) *\]|^flood of|^recovery:|Failure'
