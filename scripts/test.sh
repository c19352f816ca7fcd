#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds gradmesh and runs every test:
# the whole suite (unit, integration, e2e; gpu tests skip without a device),
# then the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/setup.sh

echo "== build (RelWithDebInfo)"
bash scripts/build.sh build -DCMAKE_BUILD_TYPE=RelWithDebInfo
echo "== tests"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== build (address,undefined sanitizers; unit tests only)"
bash scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug \
    -DGRADMESH_SANITIZE=address,undefined -DGRADMESH_CUDA=OFF
echo "== unit tests under sanitizers"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L unit --output-on-failure -j "$jobs"
