#!/usr/bin/env bash
# Installs every build and test dependency of gradmesh from Debian 12's packages.
# Idempotent and non-interactive: packages already present are left alone.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  prometheus-cpp-dev libssl-dev zlib1g-dev
  clang clang-format libclang-rt-14-dev python3 openssl curl
  python3-dev pybind11-dev python3-numpy python3-torch python3-matplotlib
  python3-pytest dataset-fashion-mnist
  python3-pip python3-venv python3-setuptools python3-wheel
  libgloo-dev libopenmpi-dev openmpi-bin iproute2 procps
  prometheus yamllint python3-yaml universal-ctags
)
# kubectl renders the Kustomize manifests; any recent one will do, and some
# machines carry one from another package that Debian's would conflict with.
if ! command -v kubectl >/dev/null; then packages+=(kubernetes-client); fi

# --build-only: just what configuring and compiling the binaries and the
# Python module needs (the container images' build stage). CMake's configure
# step also wants GTest, GMock and Google Benchmark, even without the tests.
if [[ ${1:-} == --build-only ]]; then
  packages=(
    build-essential cmake ninja-build pkg-config
    libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
    libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
    prometheus-cpp-dev libssl-dev zlib1g-dev
    python3 python3-dev pybind11-dev
  )
elif (($#)); then
  echo "usage: scripts/setup.sh [--build-only]" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
