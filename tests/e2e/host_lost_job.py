"""A job that loses a host mid-training (multinode_netns_test.py): run by
every process of `gradmesh run --nnodes=2 --nproc_per_node=2
--min-nodes=1`, a small regression under gradmesh.torch.elastic.run.

    host_lost_job.py DIR

In epoch 1, rank 2 (on node 1) creates DIR/ready-JOB, the test kills node
1's launcher (its processes and workers end with it), and node 0's two
processes train on without node 1 to the last epoch (their steps go on with
the members left; a step that fails meanwhile resets them to the last
commit). At the end they check that their parameters are identical and
that the loss on a fixed batch went down 10x.
"""

import os
import sys
import time

import numpy as np
import torch

import gradmesh
import gradmesh.torch
from gradmesh.torch import elastic

EPOCHS = 6
BATCHES = 8
BATCH_S = 0.2  # node 0 still trains when node 1 is gone


def batch(epoch, index, rank):
    """This rank's batch: y = x @ w_true + noise, seeded by position."""
    g = torch.Generator().manual_seed(1000 * epoch + 10 * index + rank)
    x = torch.randn(32, 16, generator=g)
    w_true = torch.arange(16, dtype=torch.float32).reshape(16, 1) / 16
    return x, x @ w_true + 0.01 * torch.randn(32, 1, generator=g)


def main(marker_dir):
    gradmesh.init(timeout=60)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    x_test, y_test = batch(EPOCHS, 0, 0)
    first = torch.nn.functional.mse_loss(model(x_test), y_test).item()
    optimizer = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters())
    state = elastic.TorchState(model, optimizer, epoch=0, batch=0)
    rank = gradmesh.rank()
    resets = []

    def log(line):
        resets.append(line)
        print(f"rank {rank}: {line}", flush=True)

    @elastic.run(state, log=log)
    def train(state):
        for epoch in range(state.epoch, EPOCHS):
            for index in range(state.batch, BATCHES):
                if epoch == 1 and index == 3 and rank == 2:
                    ready = os.path.join(
                        marker_dir, f"ready-{os.environ['GRADMESH_JOB']}")
                    open(ready, "w").close()
                time.sleep(BATCH_S)
                x, y = batch(epoch, index, rank)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                state.batch = index + 1
            state.epoch, state.batch = epoch + 1, 0
            state.commit()

    train()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = gradmesh.allgather(flat.numpy().reshape(1, -1), name="check")
    assert np.array_equal(every, np.repeat(every[:1], len(every), 0)), \
        "the ranks' parameters differ"
    last = torch.nn.functional.mse_loss(model(x_test), y_test).item()
    assert last < 0.1 * first, (first, last)
    print(f"rank {rank}: {len(resets)} resets, test loss {first:.3f} -> "
          f"{last:.4f}, identical on {len(every)} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
