#!/usr/bin/env bash
# The main job. Sets up a fresh Debian 12 machine, builds gradmesh and its
# Python binding (installed for /usr/bin/python3), then trains a CNN on
# Fashion-MNIST through `gradmesh run` with 4 training processes: once with
# SparDL at 1% density, once with dense all-reduce, same seed and data split.
# Writes out/main/summary.json and out/main/accuracy.png (test accuracy
# against time and against epoch).
#
#   scripts/run-main.sh [--algo=spardl] [--density=0.01] [--teams=auto|d]
#                       [--workers=4] [--epochs=5] [--fusion=per_tensor]
#                       [--out=out/main] [-- more fashion_mnist.py flags]
#
# --algo, --density and --teams pick the first run (any algorithm of
# `gradmesh run --help`); the second is always dense.
set -euo pipefail
cd "$(dirname "$0")/.."

algo=spardl density=0.01 teams="" workers=4 epochs=5 fusion=per_tensor
out=out/main
extra=()
while (($#)); do
  case $1 in
    --algo=*) algo=${1#*=} ;;
    --density=*) density=${1#*=} ;;
    --teams=*) teams=${1#*=} ;;
    --workers=*) workers=${1#*=} ;;
    --epochs=*) epochs=${1#*=} ;;
    --fusion=*) fusion=${1#*=} ;;
    --out=*) out=${1#*=} ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-main: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

bash scripts/setup.sh
bash scripts/build.sh build-release -DCMAKE_BUILD_TYPE=Release -- \
    gradmesh gradmesh-worker gradmesh-coordinator gradmesh_python
bash scripts/install-python.sh build-release

mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.sha256 "$out"/*.png
train=(/usr/bin/python3 client/python/examples/fashion_mnist.py
       "--epochs=$epochs" "--fusion=$fusion" "${extra[@]}")
run() {  # run LABEL ALGO DENSITY [gradmesh run flags...]
  local label=$1 run_algo=$2 run_density=$3
  shift 3
  echo "== $label: $run_algo at density $run_density, $workers workers, $epochs epochs"
  ./build-release/tools/gradmesh/gradmesh run --workers="$workers" \
      --algo="$run_algo" --density="$run_density" "$@" -- \
      "${train[@]}" --label="$label" --out="$out/$label.json"
}
teams_flag=()
if [[ -n $teams ]]; then teams_flag=(--teams="$teams"); fi
start=$(date +%s)
run "$algo" "$algo" "$density" "${teams_flag[@]}"
runs=("$out/$algo.json")
if [[ $algo != dense ]]; then
  run dense dense 1
  runs+=("$out/dense.json")
fi
/usr/bin/python3 client/python/examples/main_report.py "$out" "${runs[@]}"
echo "== training took $(($(date +%s) - start)) s; figures in $out/"
