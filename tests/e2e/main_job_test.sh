#!/usr/bin/env bash
# The main job, shortened to 2 epochs: the Fashion-MNIST CNN trained through
# `gradmesh run` with 4 processes, SparDL at 1% density and dense all-reduce,
# same seed and data split. Passes when SparDL's final test accuracy is within
# 3 points of dense's and every run's 4 processes hold bitwise identical
# parameters (main_report.py checks the hashes).
#   main_job_test.sh GRADMESH_BINARY PYTHON_PACKAGE_DIR SOURCE_DIR
set -euo pipefail
gradmesh=$1 package_dir=$2 source_dir=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export PYTHONPATH=$package_dir
# --device=cuda with a PyTorch that cannot use CUDA: one clear line, exit 1.
if ! /usr/bin/python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  rc=0
  err=$(/usr/bin/python3 "$source_dir/client/python/examples/fashion_mnist.py" \
        --device=cuda 2>&1) || rc=$?
  [[ $rc -eq 1 && $err == *"fashion_mnist: --device=cuda: PyTorch "* ]] ||
      { echo "FAIL: --device=cuda without CUDA: rc $rc: $err"; exit 1; }
fi
for algo in spardl dense; do
  "$gradmesh" run --workers=4 --algo="$algo" --density=0.01 -- \
      /usr/bin/python3 "$source_dir/client/python/examples/fashion_mnist.py" \
      --epochs=2 --label="$algo" --out="$out/$algo.json" >"$out/$algo.log" 2>&1 ||
      { tail -30 "$out/$algo.log"; echo "FAIL: the $algo run failed"; exit 1; }
  grep -E "test accuracy|bytes sent|exited" "$out/$algo.log"
done
/usr/bin/python3 "$source_dir/client/python/examples/main_report.py" "$out" \
    "$out/spardl.json" "$out/dense.json"
/usr/bin/python3 - "$out/summary.json" <<'PY'
import json, sys
runs = {r["label"]: r for r in json.load(open(sys.argv[1]))["runs"]}
sparse, dense = (100 * runs[k]["test_accuracy"][-1] for k in ("spardl", "dense"))
print(f"spardl {sparse:.2f}% vs dense {dense:.2f}%: gap {dense - sparse:.2f} points")
assert all(len(r["test_accuracy"]) == 2 for r in runs.values()), "2 epochs each"
assert all(r["ranks_identical"] for r in runs.values()), "ranks differ"
assert dense - sparse <= 3.0, "SparDL is more than 3 points below dense"
print("PASS")
PY
