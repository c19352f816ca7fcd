"""A trainer stopped mid-epoch: the others go on, and all finish together.

    GRADMESH_WORKER_STEP_JOIN_TIMEOUT_S=2 gradmesh run --workers=3 \\
        --algo=dense -- python3 tests/python/elastic_job.py

A small regression trained with SGD and momentum under
gradmesh.torch.elastic.run. In epoch 1, rank 2 stops itself (SIGSTOP) for
STOP_S seconds before a step, while the others still train (each batch
takes BATCH_S). Its worker steps out of the group after the step-join
timeout and the others train on; when rank 2 resumes, its next call fails,
every process restores the last commit, registers again and takes the
state of a survivor, and training goes on to EPOCHS epochs. At the end,
every process checks that the parameters are identical on all ranks, that
the loss went down, and rank 2 that it was reset.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch

import gradmesh
import gradmesh.torch
from gradmesh.torch import elastic

EPOCHS = 6
BATCHES = 8
STOP_S = 5
BATCH_S = 0.25  # the survivors still train when rank 2 resumes


def batch(epoch, index, rank):
    """This rank's batch: y = x @ w_true + noise, seeded by position."""
    g = torch.Generator().manual_seed(1000 * epoch + 10 * index + rank)
    x = torch.randn(32, 16, generator=g)
    w_true = torch.arange(16, dtype=torch.float32).reshape(16, 1) / 16
    return x, x @ w_true + 0.01 * torch.randn(32, 1, generator=g)


def stop_for(seconds):
    """SIGSTOP this process; a child sends SIGCONT after `seconds`."""
    subprocess.Popen(["sh", "-c",
                      f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)


def main():
    gradmesh.init(timeout=60)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = gradmesh.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters())
    state = elastic.TorchState(model, optimizer, epoch=0, batch=0)
    stopped = []
    resets = []
    losses = []

    def log(line):
        resets.append(line)
        print(f"rank {gradmesh.rank()}: {line}", flush=True)

    @elastic.run(state, log=log)
    def train(state):
        for epoch in range(state.epoch, EPOCHS):
            for index in range(state.batch, BATCHES):
                if epoch == 1 and index == 3 and gradmesh.rank() == 2 \
                        and not stopped:
                    stopped.append(True)
                    stop_for(STOP_S)
                time.sleep(BATCH_S)
                x, y = batch(epoch, index, gradmesh.rank())
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                state.batch = index + 1
            state.epoch, state.batch = epoch + 1, 0
            state.commit()

    train()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = gradmesh.allgather(flat.numpy().reshape(1, -1), name="check")
    assert np.array_equal(every, np.repeat(every[:1], len(every), 0)), \
        "the ranks' parameters differ"
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])
    if gradmesh.rank() == 2:
        assert stopped and resets, "rank 2 was never reset"
    print(f"rank {gradmesh.rank()}: {len(resets)} resets, loss "
          f"{losses[0]:.3f} -> {losses[-1]:.4f}, identical on "
          f"{gradmesh.size()} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
