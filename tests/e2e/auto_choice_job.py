"""Pushes one gradient of --n values through gradmesh for --steps steps with
`--algo=auto` (auto_choice_netns_test.py), then prints, on one line, the plan
this process ended on, the algorithm its last sum ran and the digest of that
sum:

    auto_choice_job.py --n=262144 --steps=40
    auto choice: algorithm=spardl dense_sizes=[] last=spardl \
        digest=... note=...
"""

import argparse
import hashlib

import numpy as np

import gradmesh


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    gradmesh.init(timeout=120)
    rng = np.random.default_rng(gradmesh.rank())
    pending = None
    for _ in range(args.steps):
        gradient = rng.standard_normal(args.n).astype(np.float32)
        pending = gradmesh.allreduce_async(gradient, name="gradient",
                                           op=gradmesh.Sum)
        result = gradmesh.synchronize(pending)
    plan = gradmesh.plan()
    digest = hashlib.sha256(np.ascontiguousarray(result).tobytes())
    print(f"auto choice: algorithm={plan.algorithm} "
          f"dense_sizes={list(plan.dense_sizes)} "
          f"last={pending.info.algorithm} digest={digest.hexdigest()[:16]} "
          f"note={plan.note}", flush=True)
    gradmesh.shutdown()


if __name__ == "__main__":
    main()
