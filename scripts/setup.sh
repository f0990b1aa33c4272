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
)
# libcivetweb-dev: the coordinator's --http page and /metrics. For the tests: python3-prometheus-client's parser reads
# /metrics as Prometheus would (the prometheus package would bring a server that starts at boot), and headless
# chromium runs the live page's script.

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
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
