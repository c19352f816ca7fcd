"""A steady trainer for the monitoring test: all-reduces until told to stop.

    gradmesh run --workers=3 -- python3 tests/deploy/workload.py DIR

Each copy writes DIR/rank{r}.worker (its worker's address) and, after its
first steps, DIR/rank{r}.ready; it stops when DIR/stop appears, after 240 s,
or when its worker is gone (exit 3: `gradmesh run` counts it lost, not
failed). The copies agree on when to stop (an exact all-reduce of each one's
wish), so that none runs a step the others have left.
"""

import os
import sys
import time

import numpy as np

import gradmesh


def main(directory):
    gradmesh.init(timeout=60)
    rank = gradmesh.rank()
    with open(os.path.join(directory, f"rank{rank}.worker"), "w") as f:
        f.write(os.environ["GRADMESH_WORKER"])
    rng = np.random.default_rng(rank)
    step = 0
    deadline = time.monotonic() + 240  # the test's whole budget
    while True:
        gradient = rng.standard_normal(200_000).astype(np.float32)
        wish = (os.path.exists(os.path.join(directory, "stop"))
                or time.monotonic() > deadline)
        try:
            gradmesh.allreduce(gradient, name="grad")
            stop = gradmesh.allreduce(np.array([float(wish)], np.float32),
                                      name="stop", op=gradmesh.Sum,
                                      exact=True)
            if stop[0] > 0:
                return 0
        except gradmesh.WorkerGoneError:
            return 3
        except gradmesh.GradmeshError as e:  # a step cut by the kill
            print(f"step {step}: {e}", flush=True)
        step += 1
        if step == 5:
            open(os.path.join(directory, f"rank{rank}.ready"), "w").close()
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
