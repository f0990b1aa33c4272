#!/usr/bin/env bash
# Runs the README's two newcomer commands, exactly as the README writes them, in a throw-away minimal
# Debian root (debootstrap, no CUDA, nothing installed by hand). Used by `scripts/test.sh --fresh-root`,
# which is what .ci/run calls: it catches a package missing from setup.sh that CI's own machine hides.
#
# Needs root (debootstrap, chroot, mounts) and a reachable Debian mirror: the host's own apt source,
# or $LH_FRESH_ROOT_MIRROR. $LH_FRESH_ROOT_SUITE (default bookworm = Debian 12), $LH_FRESH_ROOT_DIR
# (default: a fresh folder under /var/tmp, removed at the end unless $LH_FRESH_ROOT_KEEP=1).
# Inside the root the test command's ctest runs only the tests labelled `fresh` (a few minutes that touch every
# dependency once; tests/CMakeLists.txt lists them): LH_TEST_ARGS="-L fresh", which scripts/test.sh appends to
# ctest; $LH_FRESH_ROOT_TEST_ARGS replaces it ("" runs the whole suite there too). The host's own run of
# `scripts/test.sh --fresh-root` still runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)

say() { echo "fresh-root: $*"; }
die() { echo "fresh-root: error: $*" >&2; exit 1; }

if [ "${LH_IN_FRESH_ROOT:-0}" = 1 ]; then say "already inside a fresh root; nothing to do"; exit 0; fi
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mounts); run as root or skip this check"

# The two commands, read from the README so the check can never drift from what a newcomer types:
# the first fenced block after the heading "## Two commands on a fresh Debian machine" runs the
# main job, the second runs the tests.
readme_blocks() {
  awk '/^## Two commands on a fresh Debian machine/ {in_sec=1; next}
       in_sec && /^## / {exit}
       in_sec && /^```/ {fence = !fence; if (!fence) n++; next}
       in_sec && fence {print n+0 "\t" $0}' README.md
}
RUN_CMD=$(readme_blocks | awk -F'\t' '$1 == 0 {print $2}')
TEST_CMD=$(readme_blocks | awk -F'\t' '$1 == 1 {print $2}')
[ -n "$RUN_CMD" ] || die "README.md: no run command under '## Two commands on a fresh Debian machine'"
[ -n "$TEST_CMD" ] || die "README.md: no test command under '## Two commands on a fresh Debian machine'"
say "run command:  $RUN_CMD"
say "test command: $TEST_CMD (ctest: ${LH_FRESH_ROOT_TEST_ARGS--L fresh})"

# The mirror this machine's apt already uses (deb822 .sources or one-line sources.list), never a
# host name written here.
host_mirror() {
  local m=""
  if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
    m=$(awk 'tolower($1) == "uris:" {print $2}' /etc/apt/sources.list.d/*.sources | grep -v -- '-security' | head -n1)
  fi
  if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
    m=$(sed -e 's/\[[^]]*\]//' /etc/apt/sources.list | awk '$1 == "deb" {print $2}' | grep -v -- '-security' | head -n1)
  fi
  echo "$m"
}
MIRROR=${LH_FRESH_ROOT_MIRROR:-$(host_mirror)}
[ -n "$MIRROR" ] || die "no Debian mirror found in /etc/apt; set LH_FRESH_ROOT_MIRROR"
SUITE=${LH_FRESH_ROOT_SUITE:-bookworm}

if ! command -v debootstrap >/dev/null 2>&1; then
  say "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null
fi
command -v unshare >/dev/null 2>&1 || die "unshare (util-linux) is missing"

ROOT=${LH_FRESH_ROOT_DIR:-$(mktemp -d /var/tmp/lh-fresh-root.XXXXXX)}
# mktemp makes the folder 0700; as the root's '/' that would keep every user but root out of the whole tree (apt's
# _apt, the package scripts that run as munge or sshd), which a real Debian root never does.
chmod 755 "$ROOT"
cleanup() {
  # Mounts live in a private mount namespace (unshare below) and vanish with it; --one-file-system
  # keeps rm inside the root even if one had leaked.
  if [ "${LH_FRESH_ROOT_KEEP:-0}" != 1 ]; then rm -rf --one-file-system "$ROOT" "$ROOT.debootstrap.log"; fi
}
trap cleanup EXIT

start=$(date +%s)
if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
  say "debootstrap --variant=minbase $SUITE into $ROOT"
  debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 ||
    { tail -n 30 "$ROOT.debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  rm -f "$ROOT.debootstrap.log"
fi
say "minimal root ready after $(($(date +%s) - start)) s"

# The project as a fresh clone would have it: tracked and untracked-but-not-ignored files.
mkdir -p "$ROOT/root/longhaul"
git -C "$SRC" ls-files -z -co --exclude-standard |
  tar -C "$SRC" --null --ignore-failed-read -T - -cf - | tar -C "$ROOT/root/longhaul" -xf -
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
cp /etc/hosts "$ROOT/etc/hosts" 2>/dev/null || true

cat >"$ROOT/root/fresh_root_run.sh" <<EOF
set -euo pipefail
cd /root/longhaul
echo "fresh-root: \$ $RUN_CMD"
t0=\$(date +%s)
( $RUN_CMD ) || { echo "fresh-root: the run command failed" >&2; exit 1; }
echo "fresh-root: run command passed in \$((\$(date +%s) - t0)) s"
echo "fresh-root: \$ $TEST_CMD"
t0=\$(date +%s)
( $TEST_CMD ) || { echo "fresh-root: the test command failed" >&2; exit 1; }
echo "fresh-root: test command passed in \$((\$(date +%s) - t0)) s"
EOF

# A private mount namespace: /proc, /sys, /dev (with /dev/shm, which UCX uses) for the chroot, all
# gone when it exits. The environment is emptied so nothing of this machine's leaks in.
unshare --mount --propagation private bash -c '
  set -e
  R=$1
  mount -t proc proc "$R/proc"
  mount --rbind /sys "$R/sys"
  mount --rbind /dev "$R/dev"
  exec chroot "$R" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 LH_IN_FRESH_ROOT=1 LH_TEST_ARGS="$2" bash /root/fresh_root_run.sh
' fresh-root "$ROOT" "${LH_FRESH_ROOT_TEST_ARGS--L fresh}" || die "the README's commands failed in a minimal $SUITE root (output above)"
say "the README's two commands passed in a minimal $SUITE root in $(($(date +%s) - start)) s"
