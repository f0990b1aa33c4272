#!/usr/bin/env bash
# Installs every Debian package longhaul needs to build, test and run.
# Used by scripts/test.sh, CI and newcomers; non-interactive and idempotent.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-dev libucx-dev ucx-utils libzmq3-dev libsodium-dev cppzmq-dev libcereal-dev
  libspdlog-dev libfmt-dev libcli11-dev libxxhash-dev libzstd-dev nlohmann-json3-dev libyaml-cpp-dev
  libthrust-dev libcub-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  clang libclang-rt-14-dev libomp-dev
  fortunes fortunes-min
  gnuplot-nox iproute2 nftables procps jq
  libcivetweb-dev
  python3-prometheus-client chromium
  slurm-wlm munge openssh-server openssh-client
  python3-torch libtorch-dev pybind11-dev python3-dev python3-pytest
)
# libcivetweb-dev: the coordinator's --http page and /metrics. For the tests: python3-prometheus-client's parser reads
# /metrics as Prometheus would (the prometheus package would bring a server that starts at boot), and headless
# chromium runs the live page's script. slurm-wlm, munge and openssh-server: the launchers' tests start their own
# one-node Slurm cluster and sshd in the foreground (tests/integration/test_slurm.cpp, test_launchers.cpp); the
# packages' own services are never started (policy-rc.d below). python3-torch, libtorch-dev (the same build),
# pybind11-dev, python3-dev and python3-pytest: the Python package (python/, docs/torch.md) and its tests.

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup.sh: must run as root or with sudo available" >&2; exit 1; fi
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup.sh: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi
echo "setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Installing slurm-wlm, munge or openssh-server would start their services (slurmctld, slurmd, munged, sshd) on a
# machine that runs an init system: a policy-rc.d that refuses every start (exit 101) holds them back while apt runs,
# and is removed after, unless one was there already.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  own_policy=1
fi
cleanup() { if [ "$own_policy" = 1 ]; then $SUDO rm -f "$policy"; fi; }
trap cleanup EXIT
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
