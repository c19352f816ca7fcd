#!/usr/bin/env python3
"""`gradmesh run` on two emulated hosts (network namespaces on a bridge), as
a torchrun user launches a job on two nodes:

    ip netns exec gmn0 gradmesh run --nnodes=2 --node_rank=0 \\
        --nproc_per_node=2 --coordinator=10.79.0.1:7800 -- python3 job.py
    ip netns exec gmn1 gradmesh run --nnodes=2 --node_rank=1 ... (the same)

    sudo multinode_netns_test.py --gradmesh=BUILD/tools/gradmesh/gradmesh \\
        --pythonpath=BUILD/client/python

Checks that
  - the job trains (SparDL, peer traffic across the bridge) and every rank
    ends with the same parameters, with torch.distributed's env://
    rendezvous (MASTER_ADDR on node 0) working beside gradmesh;
  - a copy failing on node 1 ends both launchers with its status;
  - with --min-np=4, a copy lost with its worker on node 1 leaves 3 of
    4 and ends both launchers with status 1, saying so;
  - with --min-nodes=1, node 1's launcher killed mid-training (its host
    lost) leaves the job: node 0's processes (under gradmesh.torch.elastic)
    train on to the end with identical parameters, and node 0 exits 0,
    saying that node 1 is lost; the same with node 1's launcher sent
    SIGTERM (its host drained), which exits 130, mid-training or while
    node 0 waits for its workers to start;
  - with --nnodes=1:2, node 0 starts the job alone after the last call, and
    node 1, started once node 0 trains, joins the running job: all four
    processes (under gradmesh.torch.elastic) end with the same parameters;
  - node 0 alone names the node that never came, within the start timeout,
    and another node alone says that node 0 never answered.
Exits 0 when all hold, 1 with the reason otherwise, 77 (skipped) when not
root. Removes what it creates (namespaces gmn*, bridge gmnbr0).
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from netns_hosts import Hosts, finish  # noqa: E402

SKIPPED = 77
JOB = os.path.join(HERE, "multinode_job.py")
ELASTIC_JOB = os.path.join(ROOT, "tests", "python", "elastic_job.py")


def log(message):
    print(f"multinode_netns_test: {message}", flush=True)


def launch(args, hosts, node, extra=(), job_args=(), nodes=2, port=7800,
           job=JOB):
    """Node `node`'s launcher, started in its namespace."""
    command = [
        "ip", "netns", "exec", hosts.names[node], args.gradmesh, "run",
        f"--nnodes={nodes}", f"--node_rank={node}", "--nproc_per_node=2",
        f"--coordinator={hosts.ips[0]}:{port}", "--algo=spardl",
        "--density=0.05", "--timeout_s=30", *extra, "--",
        "/usr/bin/python3", job, *job_args]
    # gloo finds its interface from the host name, which resolves to
    # loopback in these namespaces: name it, as on such hosts with torchrun.
    env = dict(os.environ, PYTHONPATH=args.pythonpath,
               GLOO_SOCKET_IFNAME="eth0")
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def check(condition, what, results):
    if condition:
        log(f"ok: {what}")
        return
    for node, (code, out) in enumerate(results):
        print(f"--- node {node}: exit {code}\n{out}", flush=True)
    raise SystemExit(f"multinode_netns_test: FAIL: {what}")


def trains(args, hosts):
    later = launch(args, hosts, 1)  # before node 0: it waits for it
    results = finish([launch(args, hosts, 0), later], 240)
    same = [line for _, out in results for line in out.splitlines()
            if "the same on every rank" in line]
    check(all(code == 0 for code, _ in results) and len(same) == 4,
          "two nodes of two processes train to the same parameters", results)
    check(all(f"on {hosts.ips[0]}" in line for line in same),
          "MASTER_ADDR is node 0's address", results)


def one_failure_ends_both(args, hosts):
    start = time.monotonic()
    later = launch(args, hosts, 1, port=7810, job_args=["--fail-rank=3"])
    results = finish([launch(args, hosts, 0, port=7810,
                             job_args=["--fail-rank=3"]), later], 120)
    check([code for code, _ in results] == [3, 3],
          f"rank 3 failing on node 1 ends both launchers with its status 3 "
          f"(in {time.monotonic() - start:.0f} s)", results)


def too_few_end_both(args, hosts):
    start = time.monotonic()
    extra, job = ["--min-np=4"], ["--kill-worker-rank=3"]
    later = launch(args, hosts, 1, port=7840, extra=extra, job_args=job)
    results = finish([launch(args, hosts, 0, port=7840, extra=extra,
                             job_args=job), later], 90)
    says = "3 of the job's 4 processes are left"
    check([code for code, _ in results] == [1, 1] and
          all(says in out for _, out in results),
          f"rank 3 lost with its worker under --min-np=4 ends both "
          f"launchers with status 1, saying why (in "
          f"{time.monotonic() - start:.0f} s)", results)


def a_host_lost(args, hosts, drained=False):
    """Node 1's launcher killed (or, `drained`, sent SIGTERM) once rank 2 is
    in epoch 1: node 0 goes on."""
    start = time.monotonic()
    port = 7880 if drained else 7850
    with tempfile.TemporaryDirectory() as marks:
        extra, job = ["--min-nodes=1"], ["host", marks]
        later = launch(args, hosts, 1, port=port, extra=extra, job_args=job,
                       job=ELASTIC_JOB)
        zero = launch(args, hosts, 0, port=port, extra=extra, job_args=job,
                      job=ELASTIC_JOB)
        deadline = time.monotonic() + 90

        def ready():
            return any(n.startswith("ready-") for n in os.listdir(marks))

        while (not ready() and later.poll() is None and
               time.monotonic() < deadline):
            time.sleep(0.1)
        in_training = ready() and later.poll() is None
        if drained:  # it stops its processes and workers, and leaves
            later.send_signal(signal.SIGTERM)
        else:  # its processes and workers end with it
            later.kill()
        results = finish([zero, later], 180)
    how = "sent SIGTERM" if drained else "killed"
    check(in_training, f"node 1 is {how} while its processes train", results)
    code, out = results[0]
    identical = [line for line in out.splitlines()
                 if "identical on 2 ranks" in line]
    gone = ("node 1 left (its launcher was stopped)" if drained else
            "node 1's launcher is gone")
    check(code == 0 and len(identical) == 2 and
          f"{gone}; its 2 processes count as lost" in out and
          (not drained or results[1][0] == 130),
          f"with --min-nodes=1, node 1 {how} mid-training leaves node 0's "
          f"processes training to the end, identical (in "
          f"{time.monotonic() - start:.0f} s)", results)


def a_node_comes_late(args, hosts):
    """--nnodes=1:2: node 0 starts alone; node 1 joins once it trains."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as marks:
        extra, job = ["--last_call_s=1"], ["late", marks]
        zero = launch(args, hosts, 0, nodes="1:2", port=7860, extra=extra,
                      job_args=job, job=ELASTIC_JOB)
        deadline = time.monotonic() + 90
        while (not os.listdir(marks) and zero.poll() is None and
               time.monotonic() < deadline):
            time.sleep(0.1)
        started_alone = bool(os.listdir(marks)) and zero.poll() is None
        later = launch(args, hosts, 1, nodes="1:2", port=7860, extra=extra,
                       job_args=job, job=ELASTIC_JOB)
        results = finish([zero, later], 180)
    check(started_alone, "node 0 trains alone (--nnodes=1:2)", results)
    identical = [line for _, out in results for line in out.splitlines()
                 if "identical on 4 ranks" in line]
    check(all(code == 0 for code, _ in results) and len(identical) == 4 and
          "node 1 joined the running job" in results[0][1],
          f"node 1, started once node 0 trains, joins the running job: four "
          f"processes end identical (in {time.monotonic() - start:.0f} s)",
          results)


def a_signal_while_starting(args, hosts, node=0):
    """SIGTERM to node `node` while the first view waits for node 1's
    workers (which never reach the coordinator). Node 0: both launchers
    stop at once. Node 1, under --min-nodes=1 (a host drained while the job
    starts): it leaves, and node 0's processes start at once without it."""
    drained = node == 1
    with tempfile.TemporaryDirectory() as bin_dir:
        build = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(args.gradmesh))))
        os.symlink(os.path.join(build, "server", "gradmesh-coordinator"),
                   os.path.join(bin_dir, "gradmesh-coordinator"))
        worker = os.path.join(bin_dir, "gradmesh-worker")
        with open(worker, "w") as f:  # the real one, sent nowhere
            f.write("#!/bin/bash\nexec "
                    f"{build}/worker/daemon/gradmesh-worker "
                    '"${@/#--coordinator=*/--coordinator=127.0.0.1:9}"\n')
        os.chmod(worker, 0o755)
        port = 7890 if drained else 7870
        # A start timeout the drained node's leaving must beat by far.
        extra = ["--min-nodes=1", "--start_timeout_s=60"] if drained else []
        later = launch(args, hosts, 1, port=port,
                       extra=[f"--bin_dir={bin_dir}", *extra])
        zero = launch(args, hosts, 0, port=port, extra=extra)
        # Node 1 starts its workers once node 0 sent it the job: node 0
        # then waits for a view of 4.
        lines, linked = [], threading.Event()

        def read_node_1():
            for line in later.stdout:
                lines.append(line)
                if "starting 2 workers" in line:
                    linked.set()

        reader = threading.Thread(target=read_node_1)
        reader.start()
        linked.wait(60)
        start = time.monotonic()
        (later if drained else zero).send_signal(signal.SIGTERM)
        results = finish([zero], 90 if drained else 60)
        try:
            code = later.wait(60)
        except subprocess.TimeoutExpired:
            later.kill()
            code = later.wait()
            lines.append("(killed: still running at the deadline)")
        elapsed = time.monotonic() - start
        reader.join()
        results.append((code, "".join(lines)))
    check(linked.is_set(), "node 1 links and starts its workers", results)
    if not drained:
        check(results[0][0] == 130 and results[1][0] != 0 and elapsed < 10
              and "interrupted while starting" in results[0][1],
              f"SIGTERM to node 0 while it waits for node 1's workers stops "
              f"both launchers in {elapsed:.1f} s", results)
        return
    same = [line for line in results[0][1].splitlines()
            if "the same on every rank" in line]
    check(results[0][0] == 0 and len(same) == 2 and results[1][0] == 130 and
          "did not form a view" not in results[0][1] and elapsed < 30,
          f"with --min-nodes=1, node 1 sent SIGTERM while node 0 waits for "
          f"its workers leaves, and node 0's processes train without it "
          f"(node 0 done {elapsed:.1f} s after the signal; its start timeout "
          f"is 60 s)", results)


def alone(args, hosts, node, port, says, what):
    """Node `node` launched alone fails within the start timeout with an
    error that `says` so."""
    start = time.monotonic()
    results = finish([launch(args, hosts, node, port=port,
                             extra=["--start_timeout_s=5"])], 60)
    elapsed = time.monotonic() - start
    code, out = results[0]
    check(code == 1 and says in out and elapsed < 30,
          f"{what} in {elapsed:.0f} s", results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gradmesh", required=True)
    parser.add_argument("--pythonpath", required=True)
    args = parser.parse_args()
    if os.geteuid() != 0:
        log("skipped: needs root for network namespaces")
        return SKIPPED
    hosts = Hosts(2, prefix="gmn", subnet="10.79.0", bridge="gmnbr0",
                  veth="gmnv")
    try:
        hosts.create()
        trains(args, hosts)
        one_failure_ends_both(args, hosts)
        too_few_end_both(args, hosts)
        a_host_lost(args, hosts)
        a_host_lost(args, hosts, drained=True)
        a_node_comes_late(args, hosts)
        a_signal_while_starting(args, hosts)
        a_signal_while_starting(args, hosts, node=1)
        alone(args, hosts, 0, 7820, "node 1 of 2 did not join",
              "node 0 alone fails naming node 1")
        alone(args, hosts, 1, 7830, "node 0's launcher did not answer",
              "node 1 without node 0 fails saying so")
    finally:
        hosts.remove_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
