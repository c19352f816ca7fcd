"""A trainer whose worker is gone stops; the others go on without it.

    gradmesh run --workers=3 --algo=dense -- python3 tests/python/worker_gone.py DIR

Rank 1 kills its own worker (kill -9) after a first step: its next step must
raise WorkerGoneError within seconds (not wait out the timeout), after which
it records that in DIR and exits 3. The others run 20 more steps on the
survivors (the sum of ones is the number of members), then check that rank 1
recorded a clean stop. `gradmesh run` exits 0: rank 1 is lost with its
worker, not failed.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np

import gradmesh

STEPS = 20


def kill_own_worker():
    socket = os.environ["GRADMESH_WORKER"][len("unix:"):]
    out = subprocess.run(["pgrep", "-f", "--", "--sdk_socket=" + socket],
                         check=True, capture_output=True, text=True).stdout
    os.kill(int(out.split()[0]), signal.SIGKILL)


def main(record_dir):
    gradmesh.init(timeout=60)
    record = os.path.join(record_dir, "rank1")
    if gradmesh.rank() == 0 and os.path.exists(record):  # a previous run's
        os.remove(record)
    ones = np.ones(1000, dtype=np.float32)
    assert gradmesh.allreduce(ones, name="g", op=gradmesh.Sum)[0] == 3
    if gradmesh.rank() == 1:
        kill_own_worker()
        start = time.monotonic()
        try:
            for _ in range(STEPS):
                gradmesh.allreduce(ones, name="g", op=gradmesh.Sum)
        except gradmesh.WorkerGoneError as e:
            took = time.monotonic() - start
            print(f"worker gone after {took:.2f} s: {e.code}", flush=True)
            if took < 5 and e.code == "UNAVAILABLE":
                with open(record, "w") as f:
                    f.write(f"{took:.2f}\n")
            return 3
        print("no WorkerGoneError", flush=True)
        return 1
    for _ in range(STEPS):
        total = gradmesh.allreduce(ones, name="g", op=gradmesh.Sum)
    assert gradmesh.size() == 2, gradmesh.size()
    assert total[0] == 2, total[0]
    for _ in range(100):
        if os.path.exists(record):
            print(f"rank 1 stopped cleanly; {STEPS} steps on 2", flush=True)
            return 0
        time.sleep(0.1)
    print("rank 1 did not record a clean stop", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
