#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs on a GPU machine that cannot build
# gradmesh (no Debian packages, no network there): the CUDA tests, the CUDA
# benchmark and the cluster binaries, stripped, with every shared library
# they load except glibc's and the CUDA driver's, which that machine has (its
# glibc must be at least as new as this machine's: 2.36 on Debian 12).
#
#   scripts/gpu-bundle.sh [BUILD_DIR] [BUNDLE_DIR]     (build, .gpu)
#
# BUILD_DIR must be a CUDA build (nvcc found when it was configured; its
# default architectures 80 and 90 cover A100, H100 and H200). BUNDLE_DIR is
# replaced: it must not exist or be an earlier bundle. .gpu is ignored by
# git; carry it to the GPU machine and run `scripts/gpu-check.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bundle=${2:-.gpu}
if ! grep -q '^GRADMESH_CUDA:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "gpu-bundle: $build is not a CUDA build (configure it where nvcc is" \
       "found, e.g. scripts/build.sh $build)" >&2
  exit 1
fi
if [[ -e $bundle && ! -e $bundle/.gpu-bundle ]]; then
  echo "gpu-bundle: $bundle exists and is not a bundle; not replacing it" >&2
  exit 1
fi
paths=(tests/cuda_device_test tests/topk_cuda_test bench/topk_cuda_bench
       tools/gradmesh/gradmesh worker/daemon/gradmesh-worker
       server/gradmesh-coordinator)
ninja -C "$build" "${paths[@]##*/}"
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
touch "$bundle/.gpu-bundle"
for path in "${paths[@]}"; do
  strip -o "$bundle/bin/${path##*/}" "$build/$path"
done
libraries=$(ldd "$bundle"/bin/*)
if grep -q "not found" <<<"$libraries"; then
  echo "gpu-bundle: unresolved libraries:" >&2
  grep "not found" <<<"$libraries" | sort -u >&2
  exit 1
fi
glibc='lib(c|m|mvec|dl|pthread|rt|resolv|util|anl|nsl|nss_[a-z]+)'
awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$libraries" | sort -u |
    grep -Ev "/($glibc|libcuda|ld-linux[^/]*)\.so" |
    while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
echo "gpu-bundle: $(du -sh "$bundle" | cut -f1) in $bundle" \
     "($(ls "$bundle/bin" | wc -l) programs, $(ls "$bundle/lib" | wc -l) libraries)"
