#!/usr/bin/env bash
# A one-node Slurm cluster with all of its state in one directory, to try scripts/slurm/longhaul.sbatch on one
# machine; used by tests/integration/test_slurm.cpp and described in docs/launching.md.
#
#   sudo scripts/slurm/minicluster.sh up DIR     # munged, slurmctld and slurmd, then: export SLURM_CONF=DIR/slurm.conf
#   sudo scripts/slurm/minicluster.sh down DIR   # stops exactly the daemons `up DIR` started
#
# Needs root (slurmd starts jobs as their users) and the slurm-wlm and munge packages (scripts/setup.sh installs
# them). The system's own munge and Slurm services are neither used nor touched: this cluster has its own munge key
# and socket, its own free ports, and its pid, log, state and spool files under DIR, so it runs beside them, in a
# chroot, and twice in a row. The node is this host (`hostname -s`) at 127.0.0.1 with 4 CPUs whatever the hardware
# has (SlurmdParameters=config_overrides), so a 4-task job fits on a 2-core machine.
set -euo pipefail

usage() {
  echo "usage: $0 up|down DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
action=$1
[ -n "$2" ] || usage
if [ "$action" = up ]; then mkdir -p "$2"; fi
[ -d "$2" ] || { echo "minicluster: $2 is not a directory" >&2; exit 1; }
dir=$(cd "$2" && pwd)

die() {
  echo "minicluster: $*" >&2
  exit 1
}

# The daemons this script started, by the pids it recorded (not by name: other Slurm daemons may run here).
daemons=(slurmd slurmctld munged)
pid_of() {
  local f="$dir/$1.started-pid"
  [ -s "$f" ] || return 1
  local pid
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # A pid the kernel gave to something else since: only the daemon's own name counts.
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] || return 1
  echo "$pid"
}

# A TCP port no socket of this host uses (any state, any address), found in /proc/net/tcp{,6}; python and ss need
# not be installed (a chroot).
used_ports() {
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk 'NR > 0 && $2 ~ /:/ { split($2, a, ":"); print a[2] }'
}
free_port() {
  local taken p hex
  taken=" $(used_ports | tr '\n' ' ') $* "
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 30000))
    hex=$(printf '%04X' "$p")
    [[ $taken == *" $hex "* || $taken == *" $p "* ]] && continue
    echo "$p"
    return 0
  done
  die "no free TCP port found"
}

log_tails() {
  local f
  for f in munged.log slurmctld.log slurmd.log munged.stderr slurmctld.stderr slurmd.stderr; do
    [ -s "$dir/$f" ] || continue
    echo "--- $dir/$f (last 15 lines)" >&2
    tail -n 15 "$dir/$f" >&2
  done
}

down() {
  local name pid pids=()
  if pid_of slurmctld >/dev/null && [ -f "$dir/slurm.conf" ]; then
    # Jobs still running would leave their slurmstepd and tasks behind the daemons: cancel them first.
    SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --full --quiet --user root 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(SLURM_CONF="$dir/slurm.conf" timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for name in "${daemons[@]}"; do
    if pid=$(pid_of "$name"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid:$name")
    fi
  done
  local entry
  for entry in "${pids[@]}"; do
    pid=${entry%%:*}
    name=${entry#*:}
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "minicluster: $name (pid $pid) did not stop on SIGTERM within 10 s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
  done
  rm -f "$dir"/*.started-pid
}

# `cmd...` in the background, detached from the caller's terminal and pipes, its pid recorded as NAME's.
start_daemon() {
  local name=$1
  shift
  setsid "$@" </dev/null >"$dir/$name.stderr" 2>&1 &
  local pid=$!
  echo "$pid" >"$dir/$name.started-pid"
  # Until the exec, the pid is a shell's: pid_of would not know it yet.
  for _ in $(seq 100); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] && return 0
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.05
  done
}

up() {
  [ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs each job as its user)"
  local tool
  for tool in munged slurmctld slurmd scontrol sinfo setsid; do
    command -v "$tool" >/dev/null || die "$tool is not installed (scripts/setup.sh installs slurm-wlm and munge)"
  done
  local name
  for name in "${daemons[@]}"; do
    if pid_of "$name" >/dev/null; then die "$name of an earlier 'up $dir' still runs: run '$0 down $dir' first"; fi
  done
  chmod 755 "$dir"  # others may submit jobs: their srun needs the munge socket inside
  rm -rf "$dir/state" "$dir/spool" "$dir"/*.log "$dir"/*.stderr "$dir"/*.pid "$dir/munge.sock"*
  mkdir -p "$dir/state" "$dir/spool"

  # munge: its own key and socket, so the credentials of this cluster are its own.
  if [ ! -s "$dir/munge.key" ]; then
    (umask 077 && dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none)
  fi
  chmod 600 "$dir/munge.key"
  # --force: munged refuses to run as root, and to use a directory it finds too open, without it.
  start_daemon munged munged -F --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge.seed"
  for _ in $(seq 100); do
    [ -S "$dir/munge.sock" ] && break
    pid_of munged >/dev/null || break
    sleep 0.1
  done
  if [ ! -S "$dir/munge.sock" ]; then
    log_tails
    down
    die "munged did not create its socket $dir/munge.sock"
  fi

  local node ctld_port slurmd_port
  node=$(hostname -s)
  ctld_port=$(free_port)
  slurmd_port=$(free_port "$ctld_port")
  cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm/minicluster.sh: a one-node cluster under $dir.
ClusterName=minicluster
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
# Steps and jobs end promptly, and a job that ends is soon gone from squeue.
KillWait=5
MinJobAge=10
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=mini Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$dir/slurm.conf"
  # -c: no state of an earlier cluster in DIR (jobs, the node's reason) carries over.
  start_daemon slurmctld slurmctld -D -c -f "$dir/slurm.conf"
  start_daemon slurmd slurmd -D -N "$node" -f "$dir/slurm.conf"

  local state="" deadline=$((SECONDS + ${MINICLUSTER_TIMEOUT:-60}))
  while [ $SECONDS -lt $deadline ]; do
    for name in "${daemons[@]}"; do
      if ! pid_of "$name" >/dev/null; then
        log_tails
        down
        die "$name exited while the cluster came up (its log is above)"
      fi
    done
    state=$(timeout 5 scontrol show node "$node" 2>/dev/null | sed -n 's/.*State=\([^ ]*\).*/\1/p' | head -n 1) || true
    [ "$state" = IDLE ] && break
    sleep 0.2
  done
  if [ "$state" != IDLE ]; then
    log_tails
    echo "--- scontrol show node $node" >&2
    timeout 5 scontrol show node "$node" >&2 || true
    down
    die "node $node is not idle after ${MINICLUSTER_TIMEOUT:-60} s (state '${state:-unknown}')"
  fi
  echo "export SLURM_CONF=$dir/slurm.conf"
}

case "$action" in
  up) up ;;
  down) down ;;
  *) usage ;;
esac
