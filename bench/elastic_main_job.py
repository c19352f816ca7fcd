#!/usr/bin/env python3
"""The main job under gradmesh.torch.elastic, undisturbed and with a fault.

    python3 bench/elastic_main_job.py \\
        --gradmesh=build/tools/gradmesh/gradmesh \\
        --pythonpath=build/client/python --out=elastic-out

Runs client/python/examples/fashion_mnist.py --elastic on 4 workers
(SparDL, 1%) once per scenario (--scenarios): undisturbed; with rank 2's trainer stopped
(SIGSTOP) for --stop-seconds once rank 0 starts epoch 2; and with rank 1's
trainer killed (SIGKILL) at the start of epoch 2 and started again by
`gradmesh run --max-restarts=1`; and with rank 1's worker killed (SIGKILL)
at the start of epoch 2 and started again by `gradmesh run
--max-restarts=1`, then its trainer. The launcher is held stopped for
--restart-after seconds first, so that the restart comes as late as a
pod's would: past the heartbeat timeout, after the worker was evicted. Each
run must finish every epoch on its own, with all 4 ranks, with bitwise identical parameters on every rank; the table gives the
final test accuracy against the undisturbed run's and the wall time.
"""

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "client/python/examples/fashion_mnist.py")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gradmesh", required=True,
                        help="the gradmesh launcher binary")
    parser.add_argument("--pythonpath", required=True,
                        help="where the gradmesh package is importable")
    parser.add_argument("--python", default="/usr/bin/python3",
                        help="the trainers' Python (Debian's has torch)")
    parser.add_argument("--out", default="elastic-out")
    # Long enough that the others are still training when a trainer stopped
    # for 60 s at epoch 2 resumes.
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--stop-seconds", type=float, default=60)
    parser.add_argument("--train-limit", type=int, default=0)
    parser.add_argument("--restart-after", type=float, default=10,
                        help="worker: seconds from its kill to its restart")
    parser.add_argument("--scenarios",
                        default="undisturbed,stop,crash,worker")
    return parser.parse_args()


def trainer(job, rank):
    """The pid and environment of `job`'s trainer of rank `rank`."""
    want = {f"GRADMESH_JOB={job}".encode(), f"GRADMESH_RANK={rank}".encode()}
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(path, "rb") as f:
                env = set(f.read().split(b"\0"))
            with open(path.replace("environ", "cmdline"), "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if want <= env and b"fashion_mnist.py" in cmdline:
            return int(path.split("/")[2]), env
    return None, set()


def worker_pid(trainer_env):
    """The pid of the worker whose SDK socket a trainer's environment
    names (an exact argument of its command line), or None."""
    worker = [v for v in trainer_env if v.startswith(b"GRADMESH_WORKER=")]
    if not worker:
        return None
    argument = b"--sdk_socket=" + worker[0].split(b"=", 1)[1][len("unix:"):]
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                if argument in f.read().split(b"\0"):
                    return int(path.split("/")[2])
        except OSError:
            continue
    return None


def stop_for(pid, seconds, what):
    """SIGSTOP `pid` now and SIGCONT it `seconds` later, in the background."""
    os.kill(pid, signal.SIGSTOP)
    print(f"  {what} (pid {pid}) stopped for {seconds} s", flush=True)

    def resume():
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)
        print(f"  {what} resumed", flush=True)

    threading.Thread(target=resume, daemon=True).start()


def run(args, scenario):
    job = f"elastic-{scenario}-{os.getpid()}"
    out = os.path.join(args.out, f"{scenario}.json")
    command = [args.gradmesh, "run", "--workers=4", "--algo=spardl",
               "--density=0.01", f"--job={job}"]
    if scenario in ("crash", "worker"):
        command.append("--max-restarts=1")
    command += ["--", args.python, SCRIPT, f"--epochs={args.epochs}",
                "--elastic", f"--out={out}", f"--label={scenario}"]
    if args.train_limit:
        command.append(f"--train-limit={args.train_limit}")
    base, _ = os.path.splitext(out)
    for stale in glob.glob(f"{base}.rank*.sha256"):
        os.remove(stale)
    env = dict(os.environ, PYTHONPATH=args.pythonpath)
    start = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    fault = threading.Event()
    log = []
    for line in process.stdout:
        log.append(line)
        sys.stdout.write(f"  {scenario}: {line}")
        if "epoch 2/" in line and not fault.is_set():
            fault.set()
            inject(scenario, job, args, process.pid)
    code = process.wait()
    seconds = time.monotonic() - start
    with open(os.path.join(args.out, f"{scenario}.log"), "w") as f:
        f.writelines(log)
    if code != 0:
        sys.exit(f"{scenario}: gradmesh run exited {code}")
    with open(out) as f:
        record = json.load(f)
    hashes = []
    for path in glob.glob(f"{base}.rank*.sha256"):
        with open(path) as f:
            hashes.append(f.read().strip())
    return {"scenario": scenario, "seconds": seconds,
            "accuracy": record["test_accuracy"][-1],
            "epochs": len(record["epochs"]),
            # All 4 ranks at the end (none lost with its worker), equal.
            "identical": len(hashes) == 4 and len(set(hashes)) == 1
            and not any("lost with their workers" in l for l in log),
            "resets": sum("gradmesh.elastic: reset" in l for l in log)}


def inject(scenario, job, args, launcher):
    """The scenario's fault; what comes after it runs in the background.
    `launcher`: the pid of `gradmesh run`."""
    if scenario == "stop":
        stop_for(trainer(job, 2)[0], args.stop_seconds, "stop: rank 2")
    elif scenario == "crash":
        pid = trainer(job, 1)[0]
        os.kill(pid, signal.SIGKILL)
        print(f"  crash: rank 1 (pid {pid}) killed", flush=True)
    elif scenario == "worker":
        pid, env = trainer(job, 1)
        worker = worker_pid(env)
        if pid is None or worker is None:
            sys.exit("worker: rank 1's trainer or worker not found")
        stop_for(launcher, args.restart_after, "worker: gradmesh run")
        os.kill(worker, signal.SIGKILL)
        print(f"  worker: rank 1's worker (pid {worker}) killed", flush=True)


def main():
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = [run(args, s) for s in args.scenarios.split(",")]
    base = next((r for r in results if r["scenario"] == "undisturbed"), None)
    print(f"{'scenario':12} {'epochs':>6} {'accuracy':>9} "
          f"{'vs undisturbed':>15} {'identical':>9} {'resets':>6} "
          f"{'seconds':>8}")
    for r in results:
        delta = ("" if base is None else
                 f"{100 * (r['accuracy'] - base['accuracy']):+.2f} pt")
        print(f"{r['scenario']:12} {r['epochs']:6d} "
              f"{100 * r['accuracy']:8.2f}% {delta:>15} "
              f"{str(r['identical']):>9} {r['resets']:6d} "
              f"{r['seconds']:8.1f}")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=2)
    bad = [r["scenario"] for r in results
           if not r["identical"] or r["epochs"] != args.epochs or (
               base is not None
               and abs(r["accuracy"] - base["accuracy"]) > 0.01)]
    if bad:
        sys.exit(f"not every epoch, not within 1 point of undisturbed, or "
                 f"ranks differ: {bad}")


if __name__ == "__main__":
    main()
