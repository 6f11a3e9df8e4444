#!/usr/bin/env bash
# install-deps.sh - installs the Debian packages ferry needs to build, test and
# benchmark, only those missing. Needs root (or sudo) when something is missing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config      # toolchain
  clang libclang-rt-14-dev              # libFuzzer targets and sanitizer runtimes
  libcmocka-dev                         # C test framework driven by ctest
  libssl-dev                            # HMAC-SHA256 for the shared-secret handshake
  libcurl4-openssl-dev                  # http metadata client
  libjansson-dev                        # JSON for metadata descriptors
  libmicrohttpd-dev                     # embedded HTTP server: ferry metadata-server
  libhiredis-dev                        # redis metadata client (redis://)
  libfabric-dev libfabric-bin           # RDMA-class transport (verbs, efa; tcp and shm here); fi_info
  redis-server etcd-server etcd-client  # real stores the metadata tests start and stop
  python3 python3-dev python3-setuptools python3-pytest python3-numpy
  python3-pip python3-wheel python3-venv # the wheel, built offline and installed into a fresh venv
  python3-grpcio python3-zmq            # control planes of the examples/epd handoff tests
  python3-torch                         # tensors through ferry, nixl and the drop-in (CPU torch)
  iperf3 iproute2 procps                # baselines and network-namespace tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
