#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds gradmesh and runs every test:
# the whole suite (unit, integration, e2e; gpu tests skip without a device),
# the block decoders' and the peer frame codec's fuzz targets for a bounded
# time, then the unit and integration tests again under AddressSanitizer +
# UndefinedBehaviorSanitizer (the integration tests' daemons included), and
# the transport, view tracker, step protocol, data plane and coordinator
# tests under ThreadSanitizer (with a TSan build of Debian's Abseil; the gRPC
# transport is left out: Debian's gRPC is not instrumented).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

bash scripts/setup.sh

echo "== build (RelWithDebInfo)"
bash scripts/build.sh build -DCMAKE_BUILD_TYPE=RelWithDebInfo
echo "== tests"
ctest --test-dir build --output-on-failure -j "$jobs"

# The decoders' fuzz target, for a bounded time, where clang's fuzzer runtime
# is installed (scripts/setup.sh installs it).
if command -v clang++ >/dev/null &&
    echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer - -o /tmp/gradmesh-fuzz-probe 2>/dev/null; then
  echo "== fuzz the block decoders (60 s) and the frame codec (60 s)"
  bash scripts/build.sh build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
      -DGRADMESH_FUZZ=ON -DGRADMESH_CUDA=OFF -- codec_fuzz frame_fuzz
  for target in codec_fuzz frame_fuzz; do
    ./build-fuzz/tests/$target -max_total_time=60 -seed=1 \
        -print_final_stats=1 2>&1 | tail -5
  done
else
  echo "== fuzz target skipped: clang's fuzzer runtime is not installed"
fi

echo "== build (address,undefined sanitizers)"
# -O1, as the sanitizers' authors advise, so that the sanitized tests take
# less of CI's time than at -O0; assertions stay on, frames are kept.
# Warnings are not errors here: GCC's flow warnings give false positives on
# instrumented code (the main build keeps -Werror).
# Each test binary is 4 ctest tests here (shards), not one per GoogleTest
# case: a sanitized process takes about 0.4 s to start and end, which per
# case was half the stage.
bash scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DGRADMESH_WERROR=OFF \
    -DGRADMESH_TEST_PER_CASE=OFF \
    -DGRADMESH_SANITIZE=address,undefined -DGRADMESH_CUDA=OFF \
    -DGRADMESH_BENCH=OFF -DGRADMESH_PYTHON=OFF
echo "== unit and integration tests under sanitizers"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L 'unit|integration' --output-on-failure \
    -j "$jobs"

echo "== transport, step protocol, data plane and coordinator tests under ThreadSanitizer"
bash scripts/tsan-abseil.sh build-tsan/absl
tsan_tests=(loopback_test view_tracker_test step_protocol_test data_plane_test
    coordinator_test)
bash scripts/build.sh build-tsan/build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGRADMESH_SANITIZE=thread -DGRADMESH_CUDA=OFF \
    -DCMAKE_PREFIX_PATH="$PWD/build-tsan/absl" -- "${tsan_tests[@]}"
# Each binary under a bound, as ctest bounds its tests: a hang fails by name.
for t in "${tsan_tests[@]}"; do
  TSAN_OPTIONS="suppressions=$PWD/tests/tsan/suppressions.txt halt_on_error=1" \
      timeout --kill-after=10 900 \
      "$(find build-tsan/build/tests -name "$t" -type f | head -1)" \
      --gtest_brief=1 || { echo "== $t failed or ran past 900 s"; exit 1; }
done
