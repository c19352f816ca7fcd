#!/usr/bin/env python3
"""Runs `gradmesh replay` for every algorithm on the same generated gradients
and prints one Markdown table: rounds, bytes received per rank (mean and max),
result size and wall time per iteration.

  bench/compare_algorithms.py --gradmesh build-release/tools/gradmesh/gradmesh \
      --workers 14 --n 4000000 --density 0.01 --iterations 5 \
      [--encoding auto --values fp16]
"""
import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

ALGORITHMS = [
    ("spardl", {}), ("spardl", {"teams": 2}), ("spardl", {"teams": 7}),
    ("dense", {}), ("topka", {}), ("gaussiank", {}), ("topkdsa", {}),
    ("gtopk", {}), ("oktopk", {}),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gradmesh", default="build-release/tools/gradmesh/gradmesh")
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--n", type=int, default=4_000_000)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--encoding", default="coo")
    parser.add_argument("--values", default="fp32")
    args = parser.parse_args()

    print(f"P = {args.workers}, n = {args.n}, density = {args.density}, "
          f"{args.iterations} iterations, generated gradients (seed 1), "
          f"encoding {args.encoding}, values {args.values}\n")
    print("| algorithm | rounds | bytes received per rank, mean | max |"
          " as plain COO, mean | result values | wall s / iteration |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm, extra in ALGORITHMS:
            teams = extra.get("teams", 1)
            if args.workers % teams:
                continue
            out = Path(tmp) / f"{algorithm}-{teams}"
            start = time.monotonic()
            subprocess.run(
                [args.gradmesh, "replay", f"--algo={algorithm}",
                 f"--workers={args.workers}", f"--teams={teams}",
                 f"--density={args.density}", f"--n={args.n}",
                 f"--iterations={args.iterations}", f"--output-dir={out}",
                 f"--encoding={args.encoding}", f"--values={args.values}"],
                check=True, stdout=subprocess.DEVNULL)
            wall = (time.monotonic() - start) / args.iterations
            stats = json.loads((out / "stats.json").read_text())
            rows = [it for rank in stats["ranks"] for it in rank["iterations"]]
            received = [it["bytes_received"] for it in rows]
            coo = [it["coo_bytes_received"] for it in rows]
            rounds = max(it["rounds"] for it in rows)
            values = sum(it["result_nonzeros"] for it in rows) / len(rows)
            name = algorithm if teams == 1 else f"{algorithm} d={teams}"
            print(f"| {name} | {rounds} | {sum(received) / len(received):,.0f} |"
                  f" {max(received):,} | {sum(coo) / len(coo):,.0f} |"
                  f" {values:,.0f} | {wall:.2f} |")


if __name__ == "__main__":
    main()
