#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds gradmesh and runs the main job on
# an embedded local cluster: `gradmesh local` starts a coordinator and 4
# worker processes on 127.0.0.1, lets the coordinator tune SparDL's d, drives
# 30 iterations of seeded gradients through the workers (each one checked),
# and shuts everything down. Extra arguments go to `gradmesh local`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -- \
    gradmesh gradmesh-worker gradmesh-coordinator
./build-release/tools/gradmesh/gradmesh local --algo=spardl --workers=4 \
    --density=0.01 --n=1000000 --iterations=30 --autotune-window=4 \
    --work-dir=out/local "$@"
