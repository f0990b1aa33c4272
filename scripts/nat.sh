#!/usr/bin/env bash
# Emulated sites behind NAT routers, for tests and demos: each site is a router namespace doing source NAT
# (masquerade, like a home router) for a LAN of host namespaces; the routers meet on a "public" bridge in the
# root namespace, where a coordinator listens. Hosts can open connections out (to the coordinator, to other
# routers' public addresses); nothing can open a connection in, and one site's hosts cannot reach another's.
#
#   scripts/nat.sh up SITES HOSTS_PER_SITE [RATE]
#                                 build SITES sites of HOSTS_PER_SITE hosts (calls `down` first). With RATE (tc
#                                 syntax or plain: 20mbit, 20M, 1G, 800k) each router's public link is limited
#                                 to RATE in each direction (tc tbf on both ends of its veth)
#   scripts/nat.sh down           remove everything with the prefix (namespaces, public bridge and veths, the
#                                 root namespace's unreachable route for the LAN range)
#   scripts/nat.sh host S H       print the namespace name of host H in site S
#   scripts/nat.sh addr S H       print that host's private address
#   scripts/nat.sh public         print the coordinator's address (the public bridge, in the root namespace)
#   scripts/nat.sh exec S H CMD...  run CMD inside host H of site S
#   scripts/nat.sh probe          exit 0 when this machine can build such sites (namespaces, veth, bridge,
#                                 nftables masquerade/reject, tc tbf); else say why on stderr and exit 1
#
# Topology (PUB=${LH_NAT_PUBLIC}, LAN=${LH_NAT_LAN}, P=${LH_NAT_PREFIX}):
#   root namespace: bridge ${P}pub = ${PUB}.254/24; veth ${P}p${s} on it for each site's router;
#                   route "unreachable ${LAN}.0.0/16", so the root namespace never routes private addresses
#                   (connect() there fails at once). Its forwarding setting and nftables ruleset are untouched.
#   router ${P}r${s}: "wan" = ${PUB}.$((s+1))/24 (peer of ${P}p${s}); bridge "lan" = ${LAN}.${s}.254/24;
#                   ip_forward on; no default route (only the public /24 is reachable, nothing leaks beyond it);
#                   nftables table "ip lhnat": masquerade out of "wan"; forward policy drop, except
#                   lan->lan (bridged), lan->wan, and wan->lan for ct state established,related; a LAN packet for
#                   ${LAN}.0.0/16 (another site's hosts) or anything else is rejected with icmp host-unreachable.
#   host ${P}s${s}h${h}: eth0 = ${LAN}.${s}.$((h+1))/24, default route via ${LAN}.${s}.254, lo up; its peer is
#                   "h${h}" inside the router namespace, a port of "lan".
# Only ${P}pub and ${P}p${s} are interface names in the root namespace (prefix at most 11 characters, so they
# fit the 15-character limit); all others live inside the namespaces.
# Defaults: LH_NAT_PREFIX=lhnat, LH_NAT_PUBLIC=10.216.0, LH_NAT_LAN=10.217 (private test ranges).
# Parallel instances need distinct values of all three.
set -euo pipefail

PREFIX="${LH_NAT_PREFIX:-lhnat}"
PUB="${LH_NAT_PUBLIC:-10.216.0}"
LAN="${LH_NAT_LAN:-10.217}"
BRIDGE="${PREFIX}pub"

die() { echo "nat.sh: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, nftables and tc)"; }

[[ "$PREFIX" =~ ^[a-z][a-z0-9]{0,10}$ ]] || die "LH_NAT_PREFIX '$PREFIX' must be 1-11 lowercase letters/digits, starting with a letter"
[[ "$PUB" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "LH_NAT_PUBLIC '$PUB' must be three octets, e.g. 10.216.0"
[[ "$LAN" =~ ^[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "LH_NAT_LAN '$LAN' must be two octets, e.g. 10.217"

# rate_bps: "20M" / "20mbit" / "1.5G" / "800k" / "20000000" -> bits per second (integer).
source "$(dirname "${BASH_SOURCE[0]}")/net_rate.sh"

# The router's nftables ruleset. $1: the LAN range every site's subnet is in (e.g. 10.217.0.0/16).
router_rules() {
  cat <<EOF
table ip lhnat {
  chain forward {
    type filter hook forward priority filter; policy drop;
    ct state invalid drop
    iifname "lan" oifname "lan" accept
    iifname "wan" oifname "lan" ct state established,related accept
    iifname "lan" ip daddr $1 reject with icmp type host-unreachable
    iifname "lan" oifname "wan" accept
    iifname "lan" reject with icmp type host-unreachable
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "wan" masquerade
  }
}
EOF
}

# Sets a sysctl inside namespace $1 (path relative to /proc/sys); $4 = "must" to fail when it cannot.
ns_sysctl() {
  ip netns exec "$1" sh -c "echo $3 > /proc/sys/$2" 2>/dev/null && return 0
  [ "${4:-}" = must ] || return 0
  echo "nat.sh: cannot set $2 in $1" >&2; return 1
}

cmd_down() {
  need_root
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${PREFIX}(r[0-9]+|s[0-9]+h[0-9]+)$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${PREFIX}p[0-9]+$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
  ip route del unreachable "${LAN}.0.0/16" 2>/dev/null || true
}

cmd_up() {
  need_root
  local sites="${1:-}" hosts="${2:-}" rate="${3:-}"
  [[ "$sites" =~ ^[0-9]+$ ]] && [ "$sites" -ge 1 ] && [ "$sites" -le 200 ] &&
    [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] ||
    die "usage: nat.sh up SITES HOSTS_PER_SITE [RATE] (SITES, HOSTS_PER_SITE in 1..200)"
  command -v nft >/dev/null 2>&1 || die "needs nft (nftables)"
  local bps="" burst=""
  if [ -n "$rate" ]; then
    bps=$(rate_bps "$rate")
    [ "$bps" -ge 8000 ] || die "rate $rate is below 8 kbit/s"
    # tbf needs a bucket of at least one timer tick of traffic; 10 ms worth, at least 16 KB.
    burst=$(( bps / 8 / 100 )); [ "$burst" -ge 16384 ] || burst=16384
  fi
  cmd_down
  trap 'echo "nat.sh: setup failed; cleaning up" >&2; cmd_down' ERR
  ip link add "$BRIDGE" type bridge
  ip addr add "${PUB}.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Private addresses are never routed out of the root namespace (not even to its default gateway).
  ip route add unreachable "${LAN}.0.0/16" 2>/dev/null || true
  for ((s = 0; s < sites; s++)); do
    local r="${PREFIX}r${s}" peer="${PREFIX}p${s}"
    ip netns add "$r"
    ip link add "$peer" type veth peer name wan netns "$r"
    ip link set "$peer" master "$BRIDGE"
    ip link set "$peer" up
    ip -n "$r" link set lo up
    ip -n "$r" addr add "${PUB}.$((s + 1))/24" dev wan
    ip -n "$r" link set wan up
    ip -n "$r" link add lan type bridge
    ip -n "$r" addr add "${LAN}.${s}.254/24" dev lan
    ip -n "$r" link set lan up
    ns_sysctl "$r" net/ipv4/ip_forward 1 must
    ns_sysctl "$r" net/bridge/bridge-nf-call-iptables 0   # LAN traffic stays plain bridging where possible
    router_rules "${LAN}.0.0/16" | ip netns exec "$r" nft -f -
    if [ -n "$bps" ]; then
      ip netns exec "$r" tc qdisc add dev wan root tbf rate "${bps}bit" burst "$burst" latency 200ms
      tc qdisc add dev "$peer" root tbf rate "${bps}bit" burst "$burst" latency 200ms
    fi
    for ((h = 0; h < hosts; h++)); do
      local ns="${PREFIX}s${s}h${h}"
      ip netns add "$ns"
      ip -n "$r" link add "h${h}" type veth peer name eth0 netns "$ns"
      ip -n "$r" link set "h${h}" master lan
      ip -n "$r" link set "h${h}" up
      ip -n "$ns" link set lo up
      ip -n "$ns" addr add "${LAN}.${s}.$((h + 1))/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" route add default via "${LAN}.${s}.254"
    done
  done
  trap - ERR
  echo "nat.sh: $sites sites x $hosts hosts (${PREFIX}s<S>h<H> = ${LAN}.<S>.<H+1>) behind routers ${PREFIX}r0..$((sites - 1))" \
       "(${PUB}.1..$sites); public ${PUB}.254${bps:+, each router link ${bps} bit/s per direction}"
}

# Builds and removes one site as `up` would (router with masquerade/reject rules and tbf, one host on its LAN
# bridge), with the public side in a namespace of its own instead of the root one, under names of its own,
# and checks that the host reaches the public side through the NAT.
cmd_probe() {
  [ "$(id -u)" -eq 0 ] || { echo "nat.sh probe: needs root (network namespaces, nftables and tc)" >&2; return 1; }
  command -v ip >/dev/null 2>&1 || { echo "nat.sh probe: no \`ip\` (iproute2)" >&2; return 1; }
  command -v nft >/dev/null 2>&1 || { echo "nat.sh probe: no \`nft\` (nftables)" >&2; return 1; }
  command -v tc >/dev/null 2>&1 || { echo "nat.sh probe: no \`tc\` (iproute2)" >&2; return 1; }
  local p="lhnprobe$$p" r="lhnprobe$$r" h="lhnprobe$$h" err
  probe_clean() { ip netns del "$h" 2>/dev/null || true; ip netns del "$r" 2>/dev/null || true; ip netns del "$p" 2>/dev/null || true; }
  if ! err=$(ip netns add "$p" 2>&1); then
    echo "nat.sh probe: cannot create a network namespace: $err" >&2; return 1
  fi
  if ! err=$( { ip netns add "$r" && ip netns add "$h" &&
                ip -n "$p" link add pub type bridge && ip -n "$p" addr add 198.51.100.254/24 dev pub &&
                ip -n "$p" link set pub up &&
                ip -n "$r" link add wan type veth peer name w0 netns "$p" && ip -n "$p" link set w0 master pub &&
                ip -n "$p" link set w0 up && ip -n "$r" addr add 198.51.100.1/24 dev wan && ip -n "$r" link set wan up &&
                ip -n "$r" link add lan type bridge && ip -n "$r" addr add 203.0.113.254/24 dev lan &&
                ip -n "$r" link set lan up &&
                ip -n "$r" link add h0 type veth peer name eth0 netns "$h" && ip -n "$r" link set h0 master lan &&
                ip -n "$r" link set h0 up && ip -n "$h" addr add 203.0.113.1/24 dev eth0 &&
                ip -n "$h" link set eth0 up && ip -n "$h" route add default via 203.0.113.254; } 2>&1); then
    probe_clean; echo "nat.sh probe: cannot build namespaces joined by veths and bridges: $err" >&2; return 1
  fi
  if ! err=$(ip netns exec "$r" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward' 2>&1); then
    probe_clean; echo "nat.sh probe: cannot turn on ip_forward in a namespace: $err" >&2; return 1
  fi
  if ! err=$(router_rules 203.0.113.0/24 | ip netns exec "$r" nft -f - 2>&1); then
    probe_clean; echo "nat.sh probe: cannot load nftables masquerade/reject rules in a namespace: $err" >&2; return 1
  fi
  if ! err=$(ip netns exec "$r" tc qdisc add dev wan root tbf rate 1mbit burst 16384 latency 200ms 2>&1); then
    probe_clean; echo "nat.sh probe: cannot add a tc tbf qdisc: $err" >&2; return 1
  fi
  # A TCP connect from the host to a closed port on the public side must come back "refused": the RST only
  # finds its way home through the router's masquerade (the public side has no route to the LAN).
  err=$(ip netns exec "$h" timeout 5 bash -c 'exec 3<>/dev/tcp/198.51.100.254/9' 2>&1 || true)
  if [[ "$err" != *refused* ]]; then
    probe_clean; echo "nat.sh probe: a host cannot reach the public side through the NAT router: ${err:-timed out}" >&2
    return 1
  fi
  probe_clean
}

usage() {
  echo "usage: nat.sh up SITES HOSTS_PER_SITE [RATE] | down | host S H | addr S H | public | exec S H CMD... | probe" >&2
  exit 2
}

case "${1:-}" in
  probe) cmd_probe ;;
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  host) [[ "${2:-}" =~ ^[0-9]+$ && "${3:-}" =~ ^[0-9]+$ ]] || die "usage: nat.sh host S H"; echo "${PREFIX}s$2h$3" ;;
  addr) [[ "${2:-}" =~ ^[0-9]+$ && "${3:-}" =~ ^[0-9]+$ ]] || die "usage: nat.sh addr S H"; echo "${LAN}.$2.$(( $3 + 1 ))" ;;
  public) echo "${PUB}.254" ;;
  exec) [[ "${2:-}" =~ ^[0-9]+$ && "${3:-}" =~ ^[0-9]+$ ]] || die "usage: nat.sh exec S H CMD..."
        s="$2"; h="$3"; shift 3; [ $# -ge 1 ] || die "usage: nat.sh exec S H CMD..."
        exec ip netns exec "${PREFIX}s${s}h${h}" "$@" ;;
  *) usage ;;
esac
