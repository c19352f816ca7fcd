#!/usr/bin/python3
"""Time to accuracy: one training job on P emulated hosts, with gradmesh,
DDP, PowerSGD and DDP sending nothing (the limit), on each link.

Every host is a network namespace on a bridge whose veth tbf shapes to the
link's rate ("unshaped": not shaped; "loopback": one host, no namespaces, no
root). On each host `gradmesh run --nnodes=P --node-rank=I` starts a worker
and one copy of bench/train_job.py, as a torchrun user would launch it; the
DDP systems use torch's env:// rendezvous that the launcher sets up and
leave the workers idle.

  sudo bench/train_bench.py --build=build                       # 3 links
  sudo bench/train_bench.py --links=100mbit --systems=gradmesh,ddp
  bench/train_bench.py --links=loopback --workers=2 --train-limit=2000 \\
      --test-limit=500 --out=/tmp/smoke                          # CI

Writes OUT/results.json, OUT/results.md and OUT/results.png, one progress
line per run, and every launcher's output in OUT/runs/LINK-SYSTEM.hostI.log
(written as it comes). Removes the namespaces (gmt*) and bridge (gmtbr0) it
makes on exit, Ctrl-C included.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
from netns_hosts import Hosts, run_then_clean_up  # noqa: E402

JOB = os.path.join(HERE, "train_job.py")
RATES = {"100mbit": "100mbit", "1gbit": "1gbit", "unshaped": None}
SYSTEMS = ("gradmesh", "ddp", "fp16", "powersgd", "powersgd4", "noop")


def log(message):
    print(f"train_bench: {message}", flush=True)


def csv(text):
    return [x for x in text.split(",") if x]


MODELS = ("cnn824k", "mlp5m8", "main")


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="the build tree (gradmesh and the Python binding)")
    p.add_argument("--python", default=sys.executable,
                   help="the Python that trains (default: this one)")
    p.add_argument("--out", default="train-bench-out")
    p.add_argument("--links", type=csv, default=["100mbit", "1gbit",
                                                 "unshaped"],
                   help="100mbit, 1gbit, unshaped, loopback")
    p.add_argument("--systems", type=csv, default=list(SYSTEMS),
                   help=", ".join(SYSTEMS))
    p.add_argument("--workers", type=int, default=4, help="hosts, P")
    p.add_argument("--model", default="cnn824k", choices=MODELS)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"],
                   help="every system's: SGD with momentum 0.9, or Adam")
    p.add_argument("--lr", type=float, default=None,
                   help="the learning rate (default: 0.02 for SGD, 0.001 "
                   "for Adam)")
    p.add_argument("--algo", default="spardl", help="gradmesh's plan")
    p.add_argument("--density", type=float, default=0.01,
                   help="gradmesh's plan")
    p.add_argument("--teams", default="",
                   help="gradmesh's SparDL d (default: the launcher's, "
                   "autotuned)")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="gradmesh's plan: the first steps summed exactly")
    p.add_argument("--exact-below", type=int, default=None,
                   help="gradmesh's plan: buckets of fewer values are summed "
                   "exactly (default: the launcher's)")
    p.add_argument("--num-buckets", type=int, default=0,
                   help="gradmesh's buckets (0: by size, as DDP)")
    p.add_argument("--first-bucket-mb", type=float, default=None,
                   help="gradmesh's first bucket by size (1: DDP's)")
    p.add_argument("--momentum-masking",
                   action=argparse.BooleanOptionalAction, default=None,
                   help="gradmesh's optimizer: DGC's momentum factor "
                   "masking (default: by the plan's density)")
    p.add_argument("--exact-tensors-below", type=int, default=None,
                   help="gradmesh's optimizer: parameters of fewer values "
                   "summed exactly, in buckets of their own (0: none; "
                   "default: the optimizer's, by the plan's density)")
    p.add_argument("--train-limit", type=int, default=0,
                   help="the first N training images only (0: all)")
    p.add_argument("--test-limit", type=int, default=0,
                   help="the first N test images only (0: all)")
    p.add_argument("--target", type=float, default=85.0,
                   help="test accuracy (%%) whose time to reach is reported")
    p.add_argument("--evals-per-epoch", type=int, default=8)
    p.add_argument("--seed", type=int, default=1,
                   help="the initial parameters and the shards' order")
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds one run may take before it is killed")
    args = p.parse_args()
    for link in args.links:
        if link not in RATES and link != "loopback":
            p.error(f"unknown link '{link}'")
    for system in args.systems:
        if system not in SYSTEMS:
            p.error(f"unknown system '{system}'")
    if not 1 <= args.workers <= 250:
        p.error("--workers must lie in [1, 250]")
    if args.train_limit and args.train_limit < 32 * args.workers:
        p.error("--train-limit must leave each process a batch of 32")
    if any(l != "loopback" for l in args.links) and os.geteuid() != 0:
        p.error("emulated hosts need root (or --links=loopback)")
    return args


def stop_group(process, grace=10.0):
    """SIGTERM to a launcher's process group (it stops its copies and
    daemons), SIGKILL after `grace` seconds."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Bench:
    def __init__(self, args):
        self.args = args
        self.gradmesh = os.path.join(args.build, "tools", "gradmesh",
                                     "gradmesh")
        self.hosts = Hosts(args.workers, prefix="gmt", subnet="10.78.0",
                           bridge="gmtbr0", veth="gmtv")
        self.runs = []
        self.live = []
        self.port = 7900

    def launchers(self, link, system, out):
        """The launcher commands, one per host."""
        job = ["--", self.args.python, JOB, f"--system={system}",
               f"--model={self.args.model}", f"--epochs={self.args.epochs}",
               f"--train-limit={self.args.train_limit}",
               f"--test-limit={self.args.test_limit}",
               f"--evals-per-epoch={self.args.evals_per_epoch}",
               f"--num-buckets={self.args.num_buckets}",
               f"--seed={self.args.seed}", f"--out={out}",
               f"--optimizer={self.args.optimizer}"]
        if self.args.lr is not None:
            job.append(f"--lr={self.args.lr}")
        if self.args.first_bucket_mb is not None:
            job.append(f"--first-bucket-mb={self.args.first_bucket_mb}")
        if self.args.momentum_masking is not None:
            job.append("--momentum-masking" if self.args.momentum_masking
                       else "--no-momentum-masking")
        if self.args.exact_tensors_below is not None:
            job.append(
                f"--exact-tensors-below={self.args.exact_tensors_below}")
        plan = [f"--algo={self.args.algo}", f"--density={self.args.density}",
                "--timeout-s=120"]
        if self.args.teams:
            plan.append(f"--teams={self.args.teams}")
        if self.args.warmup_steps:
            plan.append(f"--warmup-steps={self.args.warmup_steps}")
        if self.args.exact_below is not None:
            plan.append(f"--exact-below={self.args.exact_below}")
        if link == "loopback":
            return [[self.gradmesh, "run", f"--workers={self.args.workers}",
                     *plan, *job]]
        self.port += 10  # a fresh port each run: no TIME_WAIT in the way
        return [["ip", "netns", "exec", ns, self.gradmesh, "run",
                 f"--nnodes={self.args.workers}", f"--node-rank={i}",
                 "--nproc-per-node=1",
                 f"--coordinator={self.hosts.ips[0]}:{self.port}", *plan,
                 *job] for i, ns in enumerate(self.hosts.names)]

    def env(self, link):
        paths = [os.path.join(self.args.build, "client", "python")]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        return dict(os.environ, PYTHONPATH=os.pathsep.join(paths),
                    GLOO_SOCKET_IFNAME="lo" if link == "loopback" else "eth0")

    def wait(self):
        """Waits for every launcher until the timeout; once one fails, the
        others get 30 s before they are stopped. Returns the failed hosts."""
        deadline = time.monotonic() + self.args.timeout
        failed = []
        while any(p.poll() is None for p in self.live):
            failed = [i for i, p in enumerate(self.live)
                      if p.poll() not in (None, 0)]
            if failed:
                deadline = min(deadline, time.monotonic() + 30)
            if time.monotonic() > deadline:
                for p in self.live:
                    if p.poll() is None:
                        stop_group(p)
                break
            time.sleep(0.5)
        return [i for i, p in enumerate(self.live) if p.returncode != 0]

    def run(self, link, system):
        base = os.path.join(self.args.out, "runs", f"{link}-{system}")
        out = base + ".json"
        if os.path.exists(out):
            os.remove(out)
        logs = []
        self.live = []
        for host, command in enumerate(self.launchers(link, system, out)):
            logs.append(f"{base}.host{host}.log")
            with open(logs[-1], "w") as log_file:
                self.live.append(subprocess.Popen(
                    command, env=self.env(link), stdout=log_file,
                    stderr=subprocess.STDOUT, start_new_session=True))
        failed = self.wait()
        self.live = []
        case = {"link": link, "system": system}
        if failed or not os.path.exists(out):
            host = failed[0] if failed else 0
            with open(logs[host]) as f:
                case["error"] = f"host {host}: " + f.read()[-2000:]
            log(f"{link} {system}: FAILED ({logs[host]})\n{case['error']}")
        else:
            with open(out) as f:
                case.update(json.load(f))
            log(f"{link} {system}: {case['seconds'][-1]:.1f} s, "
                f"{100 * case['test_accuracy'][-1]:.2f}%")
        self.runs.append(case)
        self.write()

    def main(self):
        os.makedirs(os.path.join(self.args.out, "runs"), exist_ok=True)
        if any(l != "loopback" for l in self.args.links):
            self.hosts.create()
        for link in self.args.links:
            if link != "loopback":
                self.hosts.shape(RATES[link])
            for system in self.args.systems:
                self.run(link, system)
        return 1 if any("error" in r for r in self.runs) else 0

    def stop(self):
        for p in self.live:
            stop_group(p)
        if any(l != "loopback" for l in self.args.links):
            self.hosts.remove_all()

    def write(self):
        data = {"config": vars(self.args), "runs": self.runs}
        with open(os.path.join(self.args.out, "results.json"), "w") as f:
            json.dump(data, f, indent=2)
        with open(os.path.join(self.args.out, "results.md"), "w") as f:
            f.write(markdown(self.runs, self.args.target))
        plot(self.runs, os.path.join(self.args.out, "results.png"),
             self.args.target)


def time_to(run, target):
    """The checkpoints around the first test accuracy at or above `target`
    (%): (seconds at the one before, seconds at it), or None if never."""
    before = 0.0
    for seconds, acc in zip(run["seconds"], run["test_accuracy"]):
        if 100 * acc >= target:
            return before, seconds
        before = seconds
    return None


def markdown(runs, target):
    lines = [f"| link | system | training s | s a step | test accuracy | "
             f"reached {target:g}% between (s) | epoch time vs DDP | plan |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    ddp = {r["link"]: r["seconds"][-1] for r in runs
           if r["system"] == "ddp" and "error" not in r}
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['link']} | {r['system']} | failed |"
                         " | | | | |")
            continue
        seconds = r["seconds"][-1]
        steps = r["steps_per_epoch"] * r["epochs"][-1]
        reached = time_to(r, target)
        when = ("not reached" if reached is None else
                f"{reached[0]:.1f} and {reached[1]:.1f}")
        versus = (f"{seconds / ddp[r['link']]:.2f}x" if r["link"] in ddp
                  else "")
        # Older runs recorded SparDL's d alone.
        recorded = r.get("plan") or [f"d={t}" for t in r.get("teams", [])
                                     if t is not None]
        plans = ", ".join(dict.fromkeys(str(p) for p in recorded
                                        if p is not None))
        lines.append(f"| {r['link']} | {r['system']} | {seconds:.1f} | "
                     f"{seconds / steps:.3f} | "
                     f"{100 * r['test_accuracy'][-1]:.2f}% | {when} | "
                     f"{versus} | {plans} |")
    return "\n".join(lines) + "\n\n" + breakdown(runs)


def ring_bytes(run):
    """Bytes a process sends per step in a dense ring all-reduce of the
    model's float32 gradient (DDP over Gloo), halved by fp16's hook; None
    for the others."""
    halves = {"ddp": 1, "fp16": 2}.get(run["system"])
    if halves is None:
        return None
    p = run["workers"]
    return 2 * (p - 1) / p * 4 * run["parameters"] / halves


def breakdown(runs):
    """The mean step of each run, in ms: forward and backward, step(),
    their sum less the limit's (the communication left exposed), and
    gradmesh's workers' own time (summed over buckets; it overlaps
    backward): selection and the rest of the worker's work, and the time
    blocked on peers. Bytes: gradmesh's as counted, DDP's and fp16's from
    the ring's formula. Sparse sums' values: the entries of gradmesh's
    sparse sums a step (its buckets summed densely left out), over the
    model's parameters: the plan's density where every bucket is sparse."""
    lines = ["| link | system | buckets | forward+backward ms | step() ms | "
             "exposed communication ms (over noop) | workers: own work ms | "
             "workers: blocked on peers ms | bytes sent per step | "
             "sparse sums' values / parameters |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    done = [r for r in runs if "error" not in r and "mean_step" in r]
    limit = {r["link"]: r["mean_step"] for r in done if r["system"] == "noop"}

    def total(m):
        return m["forward_backward_s"] + m["step_s"]

    def ms(seconds):
        return f"{1e3 * seconds:.1f}"

    for r in done:
        m = r["mean_step"]
        exposed = (ms(total(m) - total(limit[r["link"]]))
                   if r["link"] in limit else "")
        own = wait = density = ""
        sent = ring_bytes(r)
        if r["system"] == "gradmesh":
            own, wait = ms(m["worker_s"] - m["worker_wait_s"]), ms(
                m["worker_wait_s"])
            sent = m["bytes_sent"]
            if "nonzeros" in m:  # results of an older bench lack it
                density = f"{100 * m['nonzeros'] / r['parameters']:.2f}%"
        lines.append(
            f"| {r['link']} | {r['system']} | {m['buckets'] or ''} | "
            f"{ms(m['forward_backward_s'])} | {ms(m['step_s'])} | "
            f"{exposed} | {own} | {wait} | "
            f"{'' if sent is None else f'{sent / 1e6:.3f} MB'}"
            f"{' (ring model)' if r['system'] != 'gradmesh' and sent else ''}"
            f" | {density} |")
    return "\n".join(lines) + "\n"


def plot(runs, path, target):
    """Test accuracy over seconds of training, a panel per link."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    done = [r for r in runs if "error" not in r]
    if not done:
        return False
    links = list(dict.fromkeys(r["link"] for r in done))
    fig, axes = plt.subplots(1, len(links), figsize=(4.5 * len(links), 3.6),
                             squeeze=False)
    for ax, link in zip(axes[0], links):
        for r in done:
            if r["link"] != link:
                continue
            colour = f"C{SYSTEMS.index(r['system'])}"
            ax.plot(r["seconds"], [100 * a for a in r["test_accuracy"]],
                    marker="o", color=colour, label=r["system"])
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(f"{link}, {done[0]['model']}, P = {done[0]['workers']}")
        ax.set_xlabel("seconds of training")
        ax.set_ylabel("test accuracy (%)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def main():
    args = parse_args()
    bench = Bench(args)
    if not os.access(bench.gradmesh, os.X_OK):
        sys.exit(f"{bench.gradmesh} is missing: build the project first")

    def clean_up():
        bench.stop()
        bench.write()

    return run_then_clean_up(bench.main, clean_up)


if __name__ == "__main__":
    sys.exit(main())
