"""A trainer killed mid-job, nobody taking its place: its worker notices the
client gone (its Attach stream ended), steps out of the group and unregisters
its buckets, and the other trainer's step goes on without it, long before the
step-join timeout.

    gradmesh run --workers=2 --algo=dense --client-grace-s=1 \\
        --step-join-timeout-s=60 -- python3 tests/python/client_gone.py

Each rank starts a second process in a job of its own ("trainers"); they
register a bucket and step together. Rank 1's second process then kills
itself (kill -9); rank 0's steps again, alone: the step must succeed within
15 s (the client grace, the step-out and the step run again on the new view;
the step-join timeout is 60 s), summed over one member.
"""

import os
import subprocess
import sys
import time

import numpy as np

import gradmesh

TRAINER = """
import os, signal, sys, time
import numpy as np
import gradmesh
gradmesh.init(timeout=60)
rank = gradmesh.rank()
ones = np.ones(1000, dtype=np.float32)
for _ in range(3):
    assert gradmesh.allreduce(ones, name="g", op=gradmesh.Sum)[0] == 2
print("stepped", flush=True)
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.readline()  # rank 0: until its parent says go
start = time.monotonic()
total = gradmesh.allreduce(ones, name="g", op=gradmesh.Sum)
print(f"alone {time.monotonic() - start:.1f} {total[0]:g} {gradmesh.size()}",
      flush=True)
"""


def main():
    gradmesh.init(timeout=60)
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, GRADMESH_JOB="trainers"))
    line = trainer.stdout.readline().strip()
    assert line == "stepped", line
    if gradmesh.rank() == 1:
        assert trainer.wait(timeout=30) == -9, trainer.returncode
        print("rank 1: its trainer killed itself", flush=True)
        return 0
    time.sleep(0.5)  # rank 1's trainer is gone by now
    trainer.stdin.write("go\n")
    trainer.stdin.flush()
    line = trainer.stdout.readline().split()
    assert trainer.wait(timeout=60) == 0, trainer.returncode
    took, total, size = float(line[1]), float(line[2]), int(line[3])
    print(f"rank 0: stepped alone in {took:.1f} s, sum {total:g}, "
          f"{size} member(s)", flush=True)
    assert took < 15, took
    assert total == 1 and size == 1, (total, size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
