"""A trainer stalls or dies mid-epoch: the others go on, all finish together.

    gradmesh run --workers=3 --algo=dense --step-join-timeout-s=2 \\
        -- python3 tests/python/elastic_job.py stop
    gradmesh run --workers=3 --algo=dense --max-restarts=1 \\
        -- python3 tests/python/elastic_job.py crash|worker DIR
    gradmesh run --nnodes=2 --nproc_per_node=2 --min-nodes=1 ... \\
        -- python3 tests/python/elastic_job.py host DIR
    gradmesh run --nnodes=1:2 --nproc_per_node=2 ... \\
        -- python3 tests/python/elastic_job.py late DIR

A small regression trained with SGD and momentum under
gradmesh.torch.elastic.run, while the others still train (each batch takes
BATCH_S). In epoch 1, rank 2 stops itself (SIGSTOP, mode "stop") for STOP_S
seconds before a step: its worker steps out of the group after the
step-join timeout and the others train on; when rank 2 resumes, its next
call fails, every process restores the last commit, registers again and
takes the state of a survivor. Or rank 1 exits with status 1 (mode
"crash", once: a file in DIR records it): `gradmesh run` starts it again
3 s later, its worker rejoins as a new member when the new process
registers (here before the 10 s step-join timeout; after it, at the new
process's first call), the others reset, and the new process takes a
survivor's state. Or rank 1 kills its own worker (kill -9, mode "worker",
once) and then sleeps for a minute (a long evaluation, no call to its
worker): `gradmesh run` sees the worker gone, stops the process, starts the
worker again (a new incarnation under the same node id, so the same rank)
and then the process, which must start within 40 s of the kill and goes on
as in "crash". Or rank 2, on node 1 of two nodes (mode "host", from
tests/e2e/multinode_netns_test.py), creates DIR/ready-JOB and the test
kills node 1's launcher: node 0's two processes go on without node 1. Or
node 0 starts alone (mode "late", from the same test), rank 0 creates
DIR/ready-JOB in epoch 1, and the test starts node 1, which joins the
running job; node 0's processes train slowly (LATE_BATCH_S a batch) until
the group has 4 members, reset, and all four go on together.
Training goes on to EPOCHS epochs. At the end, every process checks that
the parameters are identical on all ranks (3; 2 in mode "host", 4 in mode
"late") and that the loss on a fixed batch went down 10x, and the survivors
that they were reset (not in mode "host": the steps go on with the members
left).
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
from worker_gone import kill_own_worker

EPOCHS = 6
BATCHES = 8
STOP_S = 5
BATCH_S = 0.25  # the survivors still train when rank 2 resumes
EVALUATION_S = 60  # mode "worker": rank 1's pause after killing its worker
RESTART_S = 40  # within which the launcher starts rank 1 again
LATE_BATCH_S = 1.0  # mode "late": node 0's batches until node 1 is in
RANKS = {"host": 2, "late": 4}  # at the end (else 3)


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


def main(mode, record_dir=None):
    gradmesh.init(timeout=60)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    x_test, y_test = batch(EPOCHS, 0, 0)
    first = torch.nn.functional.mse_loss(model(x_test), y_test).item()
    # The job's name is this run's, and the restarted process's too.
    job = os.environ["GRADMESH_JOB"]
    crashed = record_dir and os.path.join(record_dir, f"crashed-{job}")
    if mode == "worker" and os.path.exists(crashed):
        since = time.time() - os.path.getmtime(crashed)
        assert since < RESTART_S, f"started again {since:.1f} s after the kill"
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
                if epoch == 1 and index == 3 and not stopped:
                    stopped.append(True)
                    if mode == "stop" and gradmesh.rank() == 2:
                        stop_for(STOP_S)
                    if mode in ("crash", "worker") and gradmesh.rank() == 1 \
                            and not os.path.exists(crashed):
                        open(crashed, "w").close()
                        if mode == "crash":
                            os._exit(1)
                        kill_own_worker()
                        time.sleep(EVALUATION_S)  # killed meanwhile
                        sys.exit("still running a minute after the kill")
                    if (mode, gradmesh.rank()) in (("host", 2), ("late", 0)):
                        open(os.path.join(record_dir, f"ready-{job}"),
                             "w").close()
                late = mode == "late" and gradmesh.size() < 4 and epoch >= 1
                time.sleep(LATE_BATCH_S if late else BATCH_S)
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
    # Every rank is back (none was lost with its worker), node 1's gone
    # ("host"), or node 1 came ("late").
    ranks = RANKS.get(mode, 3)
    assert len(every) == ranks, f"{len(every)} ranks at the end, not {ranks}"
    assert np.array_equal(every, np.repeat(every[:1], len(every), 0)), \
        "the ranks' parameters differ"
    last = torch.nn.functional.mse_loss(model(x_test), y_test).item()
    assert last < 0.1 * first, (first, last)
    faulty = 2 if mode == "stop" else 1
    survivor = (gradmesh.rank() < 2 if mode == "late" else
                gradmesh.rank() != faulty or mode == "stop")
    if mode != "host" and survivor:
        assert resets, "never reset"
    print(f"rank {gradmesh.rank()}: {len(resets)} resets, {len(losses)} "
          f"steps here, test loss {first:.3f} -> {last:.4f}, identical on "
          f"{len(every)} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
