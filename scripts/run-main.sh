#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds gradmesh and runs the main job:
# for now `gradmesh replay`, SparDL on 8 in-process workers in 2 teams over
# generated gradients. Extra arguments go to `gradmesh replay`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -- gradmesh
./build-release/tools/gradmesh/gradmesh replay --algo=spardl --workers=8 --teams=2 \
    --density=0.01 --n=4000000 --iterations=5 --output-dir=out/replay \
    --overwrite "$@"
