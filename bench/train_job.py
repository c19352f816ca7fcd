#!/usr/bin/env python3
"""One process of the time-to-accuracy benchmark (bench/train_bench.py):
Fashion-MNIST, one process per host, started by `gradmesh run` (which sets
torchrun's variables as well as gradmesh's), trained with one system:

  gradmesh  gradmesh.torch.DistributedOptimizer (the launcher's plan)
  ddp       DistributedDataParallel over Gloo, its default buckets
  fp16      DDP with PyTorch's fp16_compress_hook (half the bytes)
  powersgd  DDP with PyTorch's PowerSGD hook (rank 1), one bucket: with
            DDP's default buckets the hook's collectives run in different
            orders on different ranks under Gloo in torch 1.13 and the job
            fails or hangs, so the bucket is made as large as the model
            (bucket_cap_mb and dist._DEFAULT_FIRST_BUCKET_BYTES)
  powersgd4 the same at rank 4 (closer to the gradient, 4x the bytes)
  noop      DDP with a hook that sends nothing: the limit (compute alone)

Every system sees the same shards (rank r takes every size-th image of the
epoch's seeded permutation), the same initial parameters and the same
optimizer (SGD with momentum, or Adam). --evals-per-epoch times an epoch
every process stops at a barrier, rank 0 evaluates, and all go on after a
second barrier, so that no process trains while rank 0 evaluates. Rank 0
writes the run's curve to --out as JSON: the seconds of training so far
(data loading and evaluation left out), the test accuracy, and for gradmesh
its plan ("spardl d=2", "dense"), at each point, and the plan's note (why:
auto's trial figures) at the end, and the mean step split into forward and
backward (DDP's all-reduce waits at the end of backward), step() (gradmesh
waits for its buckets there) and, for gradmesh, the workers' own time per
step (summed over buckets: the selection and packing, and the time blocked
on peers) and bytes sent."""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "client", "python",
                                "examples"))
from fashion_mnist import DATA_DIR, Net, accuracy, load  # noqa: E402

SYSTEMS = ("gradmesh", "ddp", "fp16", "powersgd", "powersgd4", "noop")


class Cnn824k(nn.Module):
    """3x3 convolutions of 32 and 64 channels and a 3136x256 dense layer:
    824k parameters, 3.3 MB of gradient."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Mlp5m8(nn.Module):
    """784-2048-2048-10 with ReLU: 5.8M parameters, 23 MB of gradient."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 2048), nn.ReLU(),
            nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))

    def forward(self, x):
        return self.layers(x)


MODELS = {"cnn824k": Cnn824k, "mlp5m8": Mlp5m8, "main": Net}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--system", required=True, choices=SYSTEMS)
    parser.add_argument("--model", default="cnn824k", choices=sorted(MODELS))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--evals-per-epoch", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=None,
                        help="default: 0.02 for SGD, 0.001 for Adam")
    parser.add_argument("--momentum", type=float, default=0.9,
                        help="SGD's")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"],
                        help="SGD with --momentum, or Adam")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train-limit", type=int, default=0,
                        help="the first N training images only (0: all)")
    parser.add_argument("--test-limit", type=int, default=0)
    parser.add_argument("--data-dir", default=DATA_DIR)
    parser.add_argument("--num-buckets", type=int, default=0,
                        help="gradmesh's buckets (0: by size, as DDP)")
    parser.add_argument("--first-bucket-mb", type=float, default=None,
                        help="gradmesh's first bucket by size (1: DDP's; "
                        "default: the 25 MiB cap)")
    parser.add_argument("--momentum-masking",
                        action=argparse.BooleanOptionalAction, default=None,
                        help="gradmesh: DGC's momentum factor masking "
                        "(default: by the plan's density)")
    parser.add_argument("--exact-tensors-below", type=int, default=None,
                        help="gradmesh: parameters of fewer values summed "
                        "exactly, in buckets of their own (0: none; default: "
                        "the optimizer's, by the plan's density)")
    parser.add_argument("--out", default="", help="rank 0's JSON")
    args = parser.parse_args()
    if args.lr is None:
        args.lr = 0.001 if args.optimizer == "adam" else 0.02
    return args


def noop_hook(state, bucket):
    """Sends nothing: each process steps on its own gradient."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def wrap(system, model, args):
    """The model to train and the optimizer to step, for `system`."""
    if system == "gradmesh":
        import gradmesh.torch
        gradmesh.broadcast_parameters(model.state_dict(), root_rank=0)
        return model, gradmesh.torch.DistributedOptimizer(
            inner_optimizer(model, args),
            named_parameters=model.named_parameters(),
            momentum_correction=args.optimizer == "adam" or args.momentum > 0,
            momentum_masking=args.momentum_masking,
            num_buckets=args.num_buckets or None,
            first_bucket_mb=args.first_bucket_mb,
            exact_tensors_below=args.exact_tensors_below)
    if system.startswith("powersgd"):
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1024)
        from torch.distributed.algorithms.ddp_comm_hooks import (
            powerSGD_hook as powersgd)
        state = powersgd.PowerSGDState(process_group=None,
                                       matrix_approximation_rank=(
                                           4 if system == "powersgd4" else 1),
                                       start_powerSGD_iter=10)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    else:
        ddp = nn.parallel.DistributedDataParallel(model)
        if system == "noop":
            ddp.register_comm_hook(None, noop_hook)
        elif system == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import (
                default_hooks)
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    return ddp, inner_optimizer(ddp, args)


def inner_optimizer(model, args):
    """SGD with args.momentum, or Adam, at args.lr."""
    if args.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=args.lr)
    return torch.optim.SGD(model.parameters(), lr=args.lr,
                           momentum=args.momentum)


def start(system):
    """Joins the job; returns (rank, size)."""
    if system == "gradmesh":
        import gradmesh
        gradmesh.init()
        return gradmesh.rank(), gradmesh.size()
    dist.init_process_group("gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def sync(system):
    """Every process waits for every other."""
    if system == "gradmesh":
        import gradmesh
        gradmesh.barrier()
    else:
        dist.barrier()


def plan_of(system):
    """gradmesh's current plan ("spardl d=2", "dense"), else None."""
    if system != "gradmesh":
        return None
    import gradmesh
    plan = gradmesh.plan()
    if plan.algorithm != "spardl":
        return plan.algorithm
    dense = " (dense sizes)" if plan.dense_sizes else ""
    return f"spardl d={plan.teams}{dense}"


class StepTimes:
    """Sums of this process's step phases, for the mean step, past the
    first WARM_UP steps (DDP's first step runs one bucket and rebuilds
    them; connections and buffers warm up)."""

    WARM_UP = 10

    def __init__(self):
        self.seen = 0
        self.steps = 0
        self.buckets = 0
        self.sums = dict.fromkeys(("forward_backward_s", "step_s",
                                   "worker_s", "worker_wait_s",
                                   "bytes_sent", "nonzeros"), 0.0)

    def add(self, forward_backward, step, infos):
        self.seen += 1
        if self.seen <= self.WARM_UP:
            return
        self.steps += 1
        self.sums["forward_backward_s"] += forward_backward
        self.sums["step_s"] += step
        self.buckets = max(self.buckets, len(infos))
        for info in infos:  # gradmesh's buckets of this step
            self.sums["worker_s"] += info.seconds
            self.sums["worker_wait_s"] += info.wait_seconds
            self.sums["bytes_sent"] += info.bytes_sent
            if info.algorithm != "dense":  # a dense sum holds every value
                self.sums["nonzeros"] += info.nonzeros

    def mean(self):
        mean = {k: v / max(1, self.steps) for k, v in self.sums.items()}
        return dict(mean, buckets=self.buckets)


def finish(system):
    sync(system)
    if system != "gradmesh":
        dist.destroy_process_group()


def main():
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rank, size = start(args.system)
    train_x, train_y = load(args.data_dir, "train", args.train_limit)
    test_x, test_y = load(args.data_dir, "test", args.test_limit)
    net = MODELS[args.model]()
    model, optimizer = wrap(args.system, net, args)
    shard = len(train_x) // size
    steps = shard // args.batch_size
    generator = torch.Generator().manual_seed(args.seed)
    record = {"system": args.system, "model": args.model, "workers": size,
              "parameters": sum(p.numel() for p in net.parameters()),
              "steps_per_epoch": steps, "batch_size": args.batch_size,
              "epochs": [], "seconds": [], "test_accuracy": [], "plan": []}
    evals = max(1, args.evals_per_epoch)
    points = {round(steps * i / evals) for i in range(1, evals + 1)}
    trained = 0.0
    times = StepTimes()
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(train_x), generator=generator)
        mine = order[rank::size][:steps * args.batch_size]
        begin = time.monotonic()
        for step in range(steps):
            batch = mine[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad()
            t0 = time.perf_counter()
            F.cross_entropy(model(train_x[batch]), train_y[batch]).backward()
            t1 = time.perf_counter()
            optimizer.step()
            times.add(t1 - t0, time.perf_counter() - t1,
                      getattr(optimizer, "last_infos", []))
            if step + 1 not in points:
                continue
            sync(args.system)
            trained += time.monotonic() - begin
            if rank == 0:
                acc = accuracy(net, test_x, test_y)
                record["seconds"].append(trained)
                record["test_accuracy"].append(acc)
                record["epochs"].append(epoch - 1 + (step + 1) / steps)
                record["plan"].append(plan_of(args.system))
                print(f"{args.system}: epoch {epoch} step {step + 1}: "
                      f"{100 * acc:.2f}% after {trained:.1f}s of training",
                      flush=True)
            sync(args.system)
            begin = time.monotonic()
    if rank == 0 and args.out:
        record["mean_step"] = times.mean()
        if args.system == "gradmesh":
            import gradmesh
            record["note"] = gradmesh.plan().note  # why the plan is so
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2)
    finish(args.system)


if __name__ == "__main__":
    main()
