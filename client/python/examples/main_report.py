#!/usr/bin/env python3
"""Merges the main job's runs into summary.json and a PNG of test accuracy.

    main_report.py OUT_DIR RUN.json [RUN.json ...]

Each RUN.json is what fashion_mnist.py --out wrote (rank 0), with
RUN.rank<r>.sha256 beside it from every rank. Writes OUT_DIR/summary.json
(per run: algorithm, density, d, test accuracy per epoch, seconds, steps,
bytes sent per step, tensor-missing rate, whether all ranks' parameters are
bitwise identical) and OUT_DIR/accuracy.png (test accuracy against time and
against epoch). Exits 1 when a run's ranks disagree.
"""

import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        run = json.load(f)
    base, _ = os.path.splitext(path)
    hashes = []
    for rank_file in sorted(glob.glob(f"{base}.rank*.sha256")):
        with open(rank_file) as f:
            hashes.append(f.read().strip())
    run["ranks_reporting"] = len(hashes)
    run["ranks_identical"] = (len(hashes) == run["workers"] and
                              len(set(hashes)) == 1)
    run["tensor_missing_rate"] = (run["tensors_missing"] /
                                  max(1, run["tensors"]))
    run["total_seconds"] = run["seconds"][-1] if run["seconds"] else 0.0
    return run


def plot(runs, path):
    fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run in runs:
        accuracy = [100 * a for a in run["test_accuracy"]]
        name = f"{run['algorithm']}, density {run['density']:g}"
        if run["label"] != run["algorithm"]:
            name = f"{run['label']} ({name})"
        by_time.plot(run["seconds"], accuracy, marker="o", label=name)
        by_epoch.plot(run["epochs"], accuracy, marker="o", label=name)
    by_time.set_xlabel("seconds since the start of training")
    by_epoch.set_xlabel("epoch")
    for axes in (by_time, by_epoch):
        axes.set_ylabel("test accuracy (%)")
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right", fontsize=8)
    workers = runs[0]["workers"] if runs else 0
    fig.suptitle(f"Fashion-MNIST CNN through gradmesh, {workers} workers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out_dir, paths = sys.argv[1], sys.argv[2:]
    runs = [load(p) for p in paths]
    os.makedirs(out_dir, exist_ok=True)
    keys = ["label", "algorithm", "density", "teams", "workers", "fusion",
            "epochs", "test_accuracy", "seconds", "total_seconds", "steps",
            "bytes_sent_per_step", "tensor_missing_rate", "ranks_identical"]
    summary = {"runs": [{k: run[k] for k in keys} for run in runs]}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    plot(runs, os.path.join(out_dir, "accuracy.png"))
    print(f"{'run':<14}{'accuracy':>10}{'seconds':>10}{'steps':>8}"
          f"{'bytes/step':>12}{'missing':>9}  identical")
    for run in runs:
        print(f"{run['label']:<14}{100 * run['test_accuracy'][-1]:>9.2f}%"
              f"{run['total_seconds']:>10.1f}{run['steps']:>8}"
              f"{run['bytes_sent_per_step']:>12.0f}"
              f"{100 * run['tensor_missing_rate']:>8.1f}%  "
              f"{'yes' if run['ranks_identical'] else 'NO'}")
    print(f"wrote {os.path.join(out_dir, 'summary.json')} and "
          f"{os.path.join(out_dir, 'accuracy.png')}")
    if not all(run["ranks_identical"] for run in runs):
        sys.exit("main_report: the ranks of a run hold different parameters")


if __name__ == "__main__":
    main()
