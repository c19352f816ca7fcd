"""A training script as a torchrun user writes it, run by every process of a
job on several nodes (multinode_netns_test.py): torch.distributed's env://
rendezvous beside gradmesh, a few steps of a small model through
gradmesh.torch.DistributedOptimizer, then every rank's parameters compared
through torch.distributed (gloo).

    multinode_job.py [--fail-rank=R]   (rank R exits 3 after its first step)
    multinode_job.py [--kill-worker-rank=R]   (rank R kills its own worker
                                               after its first step)
"""

import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import gradmesh
import gradmesh.torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "python"))
from worker_gone import kill_own_worker  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--kill-worker-rank", type=int, default=-1)
    args = parser.parse_args()
    gradmesh.init(timeout=60)
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, ...
    r = gradmesh.rank()
    assert (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) == (
        r, gradmesh.size()), os.environ
    assert (dist.get_rank(), dist.get_world_size()) == (r, gradmesh.size())
    assert int(os.environ["LOCAL_RANK"]) == gradmesh.local_rank()
    torch.manual_seed(7)  # the same start everywhere
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    optimizer = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(), momentum_correction=True)
    data = torch.Generator().manual_seed(r)
    for step in range(5):
        x, y = torch.randn(8, 16, generator=data), torch.randn(8, 4,
                                                              generator=data)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if step == 0 and r == args.fail_rank:
            print(f"rank {r}: failing on purpose", flush=True)
            sys.exit(3)
        if step == 0 and r == args.kill_worker_rank:
            print(f"rank {r}: killing its worker", flush=True)
            kill_own_worker()  # its next step raises WorkerGoneError
    digest = hashlib.sha256(b"".join(
        p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    assert len(set(digests)) == 1, digests
    print(f"rank {r} of {gradmesh.size()} on {os.environ['MASTER_ADDR']}: "
          f"parameters {digest[:12]}, the same on every rank", flush=True)
    optimizer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
