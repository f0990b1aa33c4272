#!/usr/bin/env bash
# Emulated WAN links for whole jobs: N network namespaces on one bridge, each host's veth egress limited by tc tbf.
# Used by `launch --netns RATE`, `bench link` and tests/integration/test_transport_netns.cpp (root only).
#
#   scripts/wan.sh up N RATE      create namespaces ${LH_WAN_PREFIX}0..N-1, each with eth0 = ${LH_WAN_SUBNET}.(i+1)/24,
#                                 egress limited to RATE (tc syntax or plain: 20mbit, 20M, 1gbit, 800kbit)
#   scripts/wan.sh down           remove them (every namespace with the prefix, the bridge)
#   scripts/wan.sh addr I         print host I's address
#   scripts/wan.sh exec I CMD...  run CMD inside namespace I
#   scripts/wan.sh probe          exit 0 when this machine can build such links (namespace, veth, tbf);
#                                 else say why on stderr and exit 1 (tests skip on it: containers without
#                                 CAP_SYS_ADMIN, a chroot whose / is not a mount point)
# The bridge itself gets ${LH_WAN_SUBNET}.254, so a coordinator in the root namespace can listen there.
# Defaults: LH_WAN_PREFIX=lhwan, LH_WAN_SUBNET=10.213.0 (a private test range). netem is not needed.
set -euo pipefail

PREFIX="${LH_WAN_PREFIX:-lhwan}"
SUBNET="${LH_WAN_SUBNET:-10.213.0}"
BRIDGE="${PREFIX}br"

die() { echo "wan.sh: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces and tc)"; }

# rate_bps: "20M" / "20mbit" / "1.5G" / "800k" / "20000000" -> bits per second (integer).
source "$(dirname "${BASH_SOURCE[0]}")/net_rate.sh"

cmd_down() {
  need_root
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${PREFIX}h[0-9]+$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
}

cmd_up() {
  need_root
  local n="${1:-}" rate="${2:-}"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "usage: wan.sh up N RATE (N in 1..200)"
  [ -n "$rate" ] || die "usage: wan.sh up N RATE"
  local bps burst
  bps=$(rate_bps "$rate")
  [ "$bps" -ge 8000 ] || die "rate $rate is below 8 kbit/s"
  # tbf needs a bucket of at least one timer tick of traffic; 10 ms worth, at least 16 KB.
  burst=$(( bps / 8 / 100 )); [ "$burst" -ge 16384 ] || burst=16384
  cmd_down
  trap 'echo "wan.sh: setup failed; cleaning up" >&2; cmd_down' ERR
  ip link add "$BRIDGE" type bridge
  ip addr add "${SUBNET}.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for ((i = 0; i < n; i++)); do
    local ns="${PREFIX}${i}" host="${PREFIX}h${i}"
    ip netns add "$ns"
    ip link add "$host" type veth peer name eth0 netns "$ns"
    ip link set "$host" master "$BRIDGE"
    ip link set "$host" up
    ip -n "$ns" addr add "${SUBNET}.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${bps}bit" burst "$burst" latency 200ms
  done
  trap - ERR
  echo "wan.sh: $n hosts ${PREFIX}0..$((n - 1)) on ${SUBNET}.0/24 (bridge ${SUBNET}.254), egress ${bps} bit/s each"
}

# Builds and removes one namespace with a veth and a tbf qdisc, as `up` would, under a name of its own.
cmd_probe() {
  [ "$(id -u)" -eq 0 ] || { echo "wan.sh probe: needs root (network namespaces and tc)" >&2; return 1; }
  command -v ip >/dev/null 2>&1 || { echo "wan.sh probe: no \`ip\` (iproute2)" >&2; return 1; }
  local ns="lhprobe$$" host="lhprobe$$h" err
  if ! err=$(ip netns add "$ns" 2>&1); then
    echo "wan.sh probe: cannot create a network namespace: $err" >&2; return 1
  fi
  if ! err=$( { ip link add "$host" type veth peer name eth0 netns "$ns" &&
                ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate 1mbit burst 16384 latency 200ms; } 2>&1); then
    ip link del "$host" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    echo "wan.sh probe: cannot build a veth link with tc tbf: $err" >&2; return 1
  fi
  ip link del "$host" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}

case "${1:-}" in
  probe) cmd_probe ;;
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  addr) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "usage: wan.sh addr I"; echo "${SUBNET}.$(( $2 + 1 ))" ;;
  exec) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "usage: wan.sh exec I CMD..."; i="$2"; shift 2; exec ip netns exec "${PREFIX}${i}" "$@" ;;
  *) echo "usage: wan.sh up N RATE | down | addr I | exec I CMD... | probe" >&2; exit 2 ;;
esac
