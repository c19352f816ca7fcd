#!/usr/bin/env python3
"""`gradmesh run --algo=auto` on two emulated hosts (network namespaces on a
bridge), once with the links shaped slow and once unshaped: the coordinator
tries SparDL and the dense ring on the real steps and keeps the dense ring
for the bucket unless SparDL made the step shorter by the margin (the steps
here are all-reduce, little else).

    sudo auto_choice_netns_test.py --gradmesh=BUILD/tools/gradmesh/gradmesh \\
        --pythonpath=BUILD/client/python

One bucket of 262,144 values (1 MiB), --sparse_margin=10. The margin puts
the crossover between the two links: on this kind of host the dense ring's
trial is about 3x slower than SparDL's unshaped (the gRPC ring is
throughput-bound) and over 30x slower at 10 Mbit/s. Checks that
  - at 10 Mbit/s the plan is SparDL and the bucket's last sum ran SparDL;
  - unshaped the plan is the dense ring and the last sum ran it;
  - both processes end on the same plan and the same sum.
Exits 0 when all hold, 1 with the reason otherwise, 77 (skipped) when not
root. Removes what it creates (namespaces gma*, bridge gmabr0).
"""

import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from netns_hosts import Hosts, finish  # noqa: E402

SKIPPED = 77
JOB = os.path.join(HERE, "auto_choice_job.py")
N = 262144
CHOICE = re.compile(r"auto choice: algorithm=(\S+) dense_sizes=(\[.*?\]) "
                    r"last=(\S+) digest=(\S+) note=(.*)")


def log(message):
    print(f"auto_choice_netns_test: {message}", flush=True)


def launch(args, hosts, node, port):
    command = [
        "ip", "netns", "exec", hosts.names[node], args.gradmesh, "run",
        "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
        f"--coordinator={hosts.ips[0]}:{port}", "--algo=auto",
        "--autotune_window=3", "--sparse_margin=10", "--timeout_s=60", "--",
        "/usr/bin/python3", JOB, f"--n={N}", "--steps=40"]
    env = dict(os.environ, PYTHONPATH=args.pythonpath)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def run_job(args, hosts, port):
    """Both nodes' (exit status, output, parsed choice or None)."""
    later = launch(args, hosts, 1, port)  # before node 0: it waits for it
    results = finish([launch(args, hosts, 0, port), later], 300)
    return [(code, out, match.groups() if match else None)
            for code, out in results
            for match in [CHOICE.search(out)]]


def check(condition, what, results):
    if condition:
        log(f"ok: {what}")
        return
    for node, (code, out, _) in enumerate(results):
        print(f"--- node {node}: exit {code}\n{out}", flush=True)
    raise SystemExit(f"auto_choice_netns_test: FAIL: {what}")


def chooses(args, hosts, link, port, algorithm):
    hosts.shape(None if link == "unshaped" else link)
    start = time.monotonic()
    results = run_job(args, hosts, port)
    choices = [choice for _, _, choice in results]
    check(all(code == 0 for code, _, _ in results) and None not in choices,
          f"{link}: both nodes ran the job", results)
    check(choices[0][:4] == choices[1][:4],
          f"{link}: both nodes end on the same plan and the same sum",
          results)
    plan, dense_sizes, last, _, note = choices[0]
    check(plan == algorithm and last == algorithm and dense_sizes == "[]",
          f"{link}: {algorithm} chosen and run in "
          f"{time.monotonic() - start:.0f} s ({note})", results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gradmesh", required=True)
    parser.add_argument("--pythonpath", required=True)
    args = parser.parse_args()
    if os.geteuid() != 0:
        log("skipped: needs root for network namespaces")
        return SKIPPED
    hosts = Hosts(2, prefix="gma", subnet="10.80.0", bridge="gmabr0",
                  veth="gmav")
    try:
        hosts.create()
        chooses(args, hosts, "10mbit", 7900, "spardl")
        chooses(args, hosts, "unshaped", 7910, "dense")
    finally:
        hosts.remove_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
