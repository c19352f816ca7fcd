#!/usr/bin/env bash
# The GPU checks, all in one run, on a machine with an NVIDIA device and the
# bundle of scripts/gpu-bundle.sh (no build tools needed there):
#   1. the GPU tests (the gtest binaries that `ctest -L gpu` runs): parity of
#      the CUDA top-k with the CPU's on random, tied, all-zero, denormal and
#      segmented inputs of 1 to 100M values;
#   2. bench/topk_cuda_bench: the CUDA top-k against a full CUB radix sort
#      and the device's read time, same run;
#   3. bench/topk_torch_bench.py: torch.topk on the same sizes, where the
#      machine's python3 has PyTorch;
#   4. end to end: `gradmesh local` with 4 workers sharing the GPU, every
#      selection on it (--topk=cuda), against the same seeded run on the CPU
#      (SparDL with d = 2, and gTopk): every result digest must be equal.
#
#   scripts/gpu-check.sh [BUNDLE_DIR]      (.gpu)
#
# Logs and tables go to $OUT (or out/gpu-check), replacing an earlier run's.
# Exits 1 if any part failed, after running them all; 2 at once where there
# is no device or no bundle.
set -uo pipefail
bundle=$(realpath "${1:-.gpu}")
cd "$(dirname "$0")/.."
out=${OUT:-out/gpu-check}
if [[ ! -x $bundle/bin/gradmesh ]]; then
  echo "gpu-check: no bundle in $bundle (scripts/gpu-bundle.sh)" >&2
  exit 2
fi
mkdir -p "$out"
rm -f "$out"/{device.txt,gpu-tests.log,topk-bench.md,torch-bench.md} \
    "$out"/local-* "$out/summary.txt"
# The bundle's libraries for its programs only (python3 keeps its own).
lib=$bundle/lib
run() { LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
bin=$bundle/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()

{
  date -u
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
      --format=csv
} >"$out/device.txt" 2>&1
cat "$out/device.txt"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA device here (nvidia-smi fails); run it on a" \
       "GPU machine" >&2
  exit 2
fi

echo "== GPU tests"
for test in cuda_device_test topk_cuda_test; do
  run "$bin/$test" 2>&1 | tee -a "$out/gpu-tests.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || failed+=("$test")
done
grep -q "SKIPPED" "$out/gpu-tests.log" && failed+=("GPU tests skipped")

echo "== CUDA top-k against CUB's sort and the read bandwidth"
run "$bin/topk_cuda_bench" 2>&1 | tee "$out/topk-bench.md"
[[ ${PIPESTATUS[0]} -eq 0 ]] || failed+=(topk_cuda_bench)

echo "== torch.topk"
if python3 -c "import torch" 2>/dev/null; then
  python3 bench/topk_torch_bench.py 2>&1 | tee "$out/torch-bench.md"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || failed+=(topk_torch_bench)
else
  echo "python3 has no PyTorch here: skipped" | tee "$out/torch-bench.md"
fi

echo "== 4 workers sharing the GPU against the CPU, same seed"
for algo in spardl gtopk; do
  for topk in cpu cuda; do
    name=local-$algo-$topk
    run "$bin/gradmesh" local --bin-dir="$bin" --workers=4 --algo="$algo" \
        --teams=2 --n=25000000 --density=0.01 --iterations=10 \
        --topk="$topk" --work-dir="$work/$name" --json="$out/$name.json" \
        >"$out/$name.log" 2>&1 || failed+=("local $algo --topk=$topk")
    tail -3 "$out/$name.log"
  done
  [[ -s $out/local-$algo-cpu.json && -s $out/local-$algo-cuda.json ]] ||
      continue
  python3 - "$out/local-$algo-cpu.json" "$out/local-$algo-cuda.json" <<'PY' ||
import json, sys
runs = [json.load(open(path)) for path in sys.argv[1:]]
digests = [{it["iteration"]: [w["result_digest"] for w in it["workers"]]
            for it in run["iterations"]} for run in runs]
assert digests[0] and digests[0] == digests[1], "results differ"
count = sum(len(d) for d in digests[0].values())
print(f"{count} results identical on the CPU and on the GPU")
PY
      failed+=("$algo: GPU results differ from the CPU's")
done

if ((${#failed[@]})); then
  printf 'gpu-check: FAILED: %s\n' "${failed[@]}" | tee "$out/summary.txt"
  exit 1
fi
echo "gpu-check: all passed" | tee "$out/summary.txt"
