#!/usr/bin/env bash
# Configures and builds gradmesh with Ninja.
#   scripts/build.sh [BUILD_DIR] [extra cmake args...] [-- ninja targets...]
# BUILD_DIR defaults to build/. Re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true
cmake_args=()
targets=()
while (($#)); do
  if [[ $1 == "--" ]]; then shift; targets=("$@"); break; fi
  cmake_args+=("$1"); shift
done
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}" >/dev/null
ninja -C "$build_dir" "${targets[@]}"
