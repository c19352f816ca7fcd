#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs on a GPU machine that cannot build
# gradmesh (no Debian packages, no network there): the CUDA tests, the CUDA
# benchmark and the cluster binaries, stripped, with every shared library
# they load except glibc's and the CUDA driver's, which that machine has.
#
#   scripts/gpu-bundle.sh [BUILD_DIR] [BUNDLE_DIR]     (build, .gpu)
#
# BUILD_DIR must be a CUDA build (nvcc found when it was configured; its
# default architectures 80 and 90 cover A100, H100 and H200). The bundle is
# ignored by git; carry it to the GPU machine and run
# `scripts/gpu-check.sh BUNDLE_DIR` there.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bundle=${2:-.gpu}
if ! grep -q '^GRADMESH_CUDA:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "gpu-bundle: $build is not a CUDA build (configure it where nvcc is" \
       "found, e.g. scripts/build.sh $build)" >&2
  exit 1
fi
targets=(cuda_device_test topk_cuda_test topk_cuda_bench gradmesh
         gradmesh-worker gradmesh-coordinator)
ninja -C "$build" "${targets[@]}"
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for target in "${targets[@]}"; do
  path=$(find "$build" -type f -name "$target" -perm -u+x | head -1)
  [[ -n $path ]] || { echo "gpu-bundle: no $target in $build" >&2; exit 1; }
  strip -o "$bundle/bin/$target" "$path"
done
ldd "$bundle"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libcuda|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
echo "gpu-bundle: $(du -sh "$bundle" | cut -f1) in $bundle" \
     "($(ls "$bundle/bin" | wc -l) programs, $(ls "$bundle/lib" | wc -l) libraries)"
