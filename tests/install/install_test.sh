#!/usr/bin/env bash
# The SDK as installed: `cmake --install` of the build tree into a temporary
# prefix, then a separate project that finds it with find_package(gradmesh),
# builds against libgradmesh.so and runs.
set -euo pipefail
build=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >/dev/null
[[ -f "$work/prefix/include/gradmesh/client.h" ]] || fail "no public header"
ls "$work/prefix"/lib*/libgradmesh.so* >/dev/null || fail "no libgradmesh.so"
cmake -S "$source_dir/consumer" -B "$work/build" -G Ninja \
    -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
ninja -C "$work/build" >/dev/null || fail "the consumer does not build"
libdir=$(dirname "$(ls "$work/prefix"/lib*/libgradmesh.so | head -1)")
rc=0
out=$(env -u GRADMESH_WORKER LD_LIBRARY_PATH="$libdir" \
    "$work/build/consumer" 2>&1) || rc=$?
[[ $rc -eq 1 ]] || fail "consumer exited $rc: $out"
grep -q "INVALID_ARGUMENT: no worker" <<<"$out" || fail "consumer said: $out"
echo "install_test: passed"
