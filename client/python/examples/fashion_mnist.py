#!/usr/bin/env python3
"""Trains a small CNN on Fashion-MNIST through gradmesh, one process per worker.

Run it under the launcher, which starts the cluster and picks the algorithm:

    gradmesh run --workers=4 --algo=spardl --density=0.01 -- \\
        python3 client/python/examples/fashion_mnist.py --epochs=3 --out=run.json

Every process trains on its shard of the training set (a seeded permutation,
the same for every run with the same --seed), wraps SGD with momentum 0.9
(DGC's momentum correction; or --optimizer=adam, with Adam's moments kept
per process before the selection) in
gradmesh.torch.DistributedOptimizer and starts from rank 0's parameters.
Rank 0 prints a progress line per tenth of an epoch and the test accuracy
after each epoch. With --out, rank 0 writes the run's figures as JSON (test
accuracy per epoch, seconds, steps, bytes per step, tensors missing) and
every rank writes the SHA-256 of its final parameters beside it, so that a
caller can check that all ranks hold bitwise identical models.

The data come from Debian's dataset-fashion-mnist package (no downloads).
--device=cuda trains on the GPU (a PyTorch with CUDA; Debian's python3-torch
is a CPU build): the gradients go to the worker through host memory, one copy
each way per step.
"""

import argparse
import gzip
import hashlib
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import gradmesh
import gradmesh.torch
from gradmesh.torch import elastic

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32,
                        help="per process (default: %(default)s)")
    # SGD with momentum, corrected as in Deep Gradient Compression under a
    # sparse plan (docs/benchmarks.md: without the correction SparDL at 1%
    # ends 1.4 points below dense after 5 epochs, with it 0.4).
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"],
                        help="adam ignores --momentum (default: sgd)")
    parser.add_argument("--momentum-correction",
                        action=argparse.BooleanOptionalAction, default=True,
                        help="the optimizer's momentum_correction: DGC's "
                        "for SGD momentum > 0, local moments for Adam")
    parser.add_argument("--momentum-masking",
                        action=argparse.BooleanOptionalAction, default=None,
                        help="with SGD's correction: DGC's momentum factor "
                        "masking (default: by the plan's density)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train-limit", type=int, default=0,
                        help="use only the first N training images (0: all)")
    parser.add_argument("--test-limit", type=int, default=0,
                        help="evaluate on the first N test images (0: all)")
    parser.add_argument("--num-buckets", type=int, default=None,
                        help="fusion buckets M (default: by size)")
    parser.add_argument("--exact-tensors-below", type=int, default=None,
                        help="parameters of fewer values summed exactly, in "
                        "a bucket of their own (0: none; default: the "
                        "optimizer's, by the plan's density)")
    parser.add_argument("--fusion", default="per_tensor",
                        choices=["per_tensor", "after_fusion"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where the model trains (default: %(default)s)")
    parser.add_argument("--data-dir", default=DATA_DIR)
    parser.add_argument("--out", default="",
                        help="write the run's figures here (JSON, rank 0) "
                             "and each rank's parameter hash beside it")
    parser.add_argument("--label", default="",
                        help="the run's name in --out (default: the plan)")
    parser.add_argument("--elastic", action="store_true",
                        help="train under gradmesh.torch.elastic: a stalled "
                        "or restarted process costs a return to the last "
                        "epoch's end, not the job (each epoch's order then "
                        "comes from --seed and the epoch)")
    return parser.parse_args()


def read_idx(path):
    """An IDX file (gzip) as a numpy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
             for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8,
                         offset=4 + 4 * dims).reshape(shape)


def load(data_dir, kind, limit):
    prefix = "train" if kind == "train" else "t10k"
    images = os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz")
    labels = os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz")
    for path in (images, labels):
        if not os.path.exists(path):
            sys.exit(f"fashion_mnist: {path} is missing; install Debian's "
                     "dataset-fashion-mnist (scripts/setup.sh does)")
    x = read_idx(images).astype(np.float32) / 255.0
    y = read_idx(labels).astype(np.int64)
    if limit:
        x, y = x[:limit], y[:limit]
    x = (x - 0.2860) / 0.3530  # the training set's mean and deviation
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


class Net(nn.Module):
    """Two 5x5 convolutions and two dense layers (about 80k parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def accuracy(model, x, y):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum()
    model.train()
    return float(correct) / len(x)


def progress(epoch, epochs, done, total, loss, seconds):
    width = 20
    filled = width * done // total
    bar = "#" * filled + "." * (width - filled)
    print(f"epoch {epoch}/{epochs} [{bar}] {100 * done // total:3d}% "
          f"loss {loss:.3f} {seconds:5.1f}s", flush=True)


def parameter_hash(model):
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def training_device(name):
    """torch.device(name), or exit with why CUDA cannot be used."""
    if name == "cuda" and not torch.cuda.is_available():
        why = ("has no CUDA support (a CPU build, like Debian's python3-torch)"
               if torch.version.cuda is None else "sees no CUDA device")
        sys.exit(f"fashion_mnist: --device=cuda: PyTorch {torch.__version__} "
                 f"{why}")
    return torch.device(name)


def main():
    args = parse_args()
    device = training_device(args.device)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gradmesh.init()
    rank, size = gradmesh.rank(), gradmesh.size()
    plan = gradmesh.plan()
    label = args.label or plan.algorithm

    train_x, train_y = load(args.data_dir, "train", args.train_limit)
    test_x, test_y = load(args.data_dir, "test", args.test_limit)
    train_x, train_y = train_x.to(device), train_y.to(device)
    test_x, test_y = test_x.to(device), test_y.to(device)
    model = Net().to(device)
    if not args.elastic:  # elastic.run starts with rank 0's (a new process
        # in a running job must register first, as the others do)
        gradmesh.broadcast_parameters(model.state_dict(), root_rank=0)
    inner = (torch.optim.Adam(model.parameters(), lr=args.lr)
             if args.optimizer == "adam" else
             torch.optim.SGD(model.parameters(), lr=args.lr,
                             momentum=args.momentum))
    optimizer = gradmesh.torch.DistributedOptimizer(
        inner,
        named_parameters=model.named_parameters(),
        num_buckets=args.num_buckets, fusion=args.fusion,
        momentum_correction=(args.momentum_correction and (
            args.optimizer == "adam" or args.momentum > 0)),
        momentum_masking=args.momentum_masking,
        exact_tensors_below=args.exact_tensors_below)

    # The same shards in every run with this seed: rank r takes every
    # size-th image of the epoch's permutation, starting at r.
    shard = len(train_x) // size
    steps_per_epoch = shard // args.batch_size
    generator = torch.Generator().manual_seed(args.seed)
    if rank == 0:
        print(f"{label}: {size} workers, plan {plan.algorithm} density "
              f"{plan.density:g} d={plan.teams}, {steps_per_epoch} steps of "
              f"{args.batch_size} per epoch on {device}", flush=True)

    record = {"label": label, "algorithm": plan.algorithm,
              "density": plan.density, "teams": plan.teams,
              "workers": size, "fusion": args.fusion,
              "device": str(device),
              "epochs": [], "test_accuracy": [], "seconds": [],
              "steps": 0, "bytes_sent_per_step": 0.0,
              "tensors": 0, "tensors_missing": 0}
    totals = {"bytes_sent": 0}
    start = time.monotonic()

    def train_epoch(epoch, order):
        mine = order[rank::size][:steps_per_epoch * args.batch_size]
        running = 0.0
        for step in range(steps_per_epoch):
            batch = mine[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
            loss.backward()
            optimizer.step()
            for info in optimizer.last_infos:
                totals["bytes_sent"] += info.bytes_sent
                record["tensors"] += info.tensors
                record["tensors_missing"] += info.tensors_missing
            record["steps"] += 1
            running = (0.9 * running + 0.1 * loss.item() if step else
                       loss.item())
            tenth = max(1, steps_per_epoch // 10)
            if rank == 0 and ((step + 1) % tenth == 0 or
                              step + 1 == steps_per_epoch):
                progress(epoch, args.epochs, step + 1, steps_per_epoch,
                         running, time.monotonic() - start)
        # Elastic: every process records (whichever is rank 0 at the end
        # writes), and an epoch done again after a reset replaces its row.
        if args.elastic or rank == 0:
            acc = accuracy(model, test_x, test_y)
            if epoch in record["epochs"]:  # done again after a reset
                del record["test_accuracy"][record["epochs"].index(epoch):]
                del record["seconds"][record["epochs"].index(epoch):]
                del record["epochs"][record["epochs"].index(epoch):]
            record["epochs"].append(epoch)
            record["test_accuracy"].append(acc)
            record["seconds"].append(time.monotonic() - start)
            if gradmesh.rank() == 0:
                print(f"{label}: epoch {epoch} test accuracy "
                      f"{100 * acc:.2f}% after "
                      f"{time.monotonic() - start:.1f}s", flush=True)

    if args.elastic:
        state = elastic.TorchState(model, optimizer, epoch=1)

        @elastic.run(state)
        def train(state):
            while state.epoch <= args.epochs:
                epoch_seed = torch.Generator().manual_seed(
                    args.seed * 100003 + state.epoch)
                train_epoch(state.epoch,
                            torch.randperm(len(train_x), generator=epoch_seed))
                state.epoch += 1
                state.commit()

        train()
    else:
        for epoch in range(1, args.epochs + 1):
            train_epoch(epoch,
                        torch.randperm(len(train_x), generator=generator))

    rank = gradmesh.rank()  # an elastic job's may have changed
    record["bytes_sent_per_step"] = totals["bytes_sent"] / max(
        1, record["steps"])
    record["parameter_sha256"] = parameter_hash(model)
    if rank == 0:
        missing = record["tensors_missing"] / max(1, record["tensors"])
        print(f"{label}: {record['bytes_sent_per_step']:.0f} bytes sent per "
              f"step by rank 0's worker, tensor-missing rate "
              f"{100 * missing:.1f}%", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        base, _ = os.path.splitext(args.out)
        with open(f"{base}.rank{rank}.sha256", "w") as f:
            f.write(record["parameter_sha256"] + "\n")
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump(record, f, indent=2)
    gradmesh.barrier()


if __name__ == "__main__":
    main()
