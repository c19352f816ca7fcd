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
line per run, and every launcher's output in OUT/runs/LINK-SYSTEM.log. Removes the namespaces (gmt*) and bridge (gmtbr0) it makes on
exit, Ctrl-C included.
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
from netns_hosts import Hosts  # noqa: E402

JOB = os.path.join(HERE, "train_job.py")
RATES = {"100mbit": "100mbit", "1gbit": "1gbit", "unshaped": None}
SYSTEMS = ("gradmesh", "ddp", "powersgd", "noop")


def log(message):
    print(f"train_bench: {message}", flush=True)


def csv(text):
    return [x for x in text.split(",") if x]


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default="train-bench-out")
    p.add_argument("--links", type=csv, default=["100mbit", "1gbit",
                                                 "unshaped"],
                   help="100mbit, 1gbit, unshaped, loopback")
    p.add_argument("--systems", type=csv, default=list(SYSTEMS))
    p.add_argument("--workers", type=int, default=4, help="hosts, P")
    p.add_argument("--model", default="cnn824k",
                   help="cnn824k, mlp5m8 or main")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--algo", default="spardl", help="gradmesh's plan")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--target", type=float, default=85.0,
                   help="test accuracy (%%) whose time to reach is reported")
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds one run may take before it is killed")
    args = p.parse_args()
    for link in args.links:
        if link not in RATES and link != "loopback":
            p.error(f"unknown link '{link}'")
    for system in args.systems:
        if system not in SYSTEMS:
            p.error(f"unknown system '{system}'")
    if any(l != "loopback" for l in args.links) and os.geteuid() != 0:
        p.error("emulated hosts need root (or --links=loopback)")
    return args


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
        job = ["--", "/usr/bin/python3", JOB, f"--system={system}",
               f"--model={self.args.model}", f"--epochs={self.args.epochs}",
               f"--train-limit={self.args.train_limit}",
               f"--test-limit={self.args.test_limit}",
               f"--evals-per-epoch={self.args.evals_per_epoch}",
               f"--out={out}"]
        plan = [f"--algo={self.args.algo}", f"--density={self.args.density}",
                "--timeout-s=120"]
        if link == "loopback":
            return [[self.gradmesh, "run", f"--workers={self.args.workers}",
                     *plan, *job]]
        self.port += 10  # a fresh port each run: no TIME_WAIT in the way
        return [["ip", "netns", "exec", ns, self.gradmesh, "run",
                 f"--nnodes={self.args.workers}", f"--node-rank={i}",
                 "--nproc-per-node=1",
                 f"--coordinator={self.hosts.ips[0]}:{self.port}", *plan,
                 *job] for i, ns in enumerate(self.hosts.names)]

    def run(self, link, system):
        out = os.path.join(self.args.out, "runs", f"{link}-{system}.json")
        if os.path.exists(out):
            os.remove(out)
        env = dict(os.environ,
                   PYTHONPATH=os.path.join(self.args.build, "client",
                                           "python"),
                   GLOO_SOCKET_IFNAME="lo" if link == "loopback" else "eth0")
        started = time.monotonic()
        self.live = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True)
                     for c in self.launchers(link, system, out)]
        outputs, failed = [], False
        for p in self.live:
            left = self.args.timeout - (time.monotonic() - started)
            try:
                text, _ = p.communicate(timeout=max(1, left))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                text, _ = p.communicate()
                text += "\n(killed at the timeout)"
            outputs.append(text)
            failed |= p.returncode != 0
        self.live = []
        with open(out.replace(".json", ".log"), "w") as f:
            for node, text in enumerate(outputs):
                f.write(f"--- host {node}\n{text}")
        case = {"link": link, "system": system}
        if failed or not os.path.exists(out):
            case["error"] = outputs[0][-2000:]
            log(f"{link} {system}: FAILED\n{case['error']}")
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
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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
    """Seconds of training until the test accuracy first reached
    `target` (%), or None."""
    for seconds, acc in zip(run["seconds"], run["test_accuracy"]):
        if 100 * acc >= target:
            return seconds
    return None


def markdown(runs, target):
    lines = [f"| link | system | training s | s a step | test accuracy | "
             f"time to {target:g}% | time vs DDP |",
             "|---|---|---:|---:|---:|---:|---:|"]
    ddp = {r["link"]: r["seconds"][-1] for r in runs
           if r["system"] == "ddp" and "error" not in r}
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['link']} | {r['system']} | failed | | | | |")
            continue
        seconds = r["seconds"][-1]
        steps = r["steps_per_epoch"] * r["epochs"][-1]
        reached = time_to(r, target)
        versus = (f"{seconds / ddp[r['link']]:.2f}x" if r["link"] in ddp
                  else "")
        lines.append(f"| {r['link']} | {r['system']} | {seconds:.1f} | "
                     f"{seconds / steps:.3f} | "
                     f"{100 * r['test_accuracy'][-1]:.2f}% | "
                     f"{'not reached' if reached is None else f'{reached:.1f}'}"
                     f" | {versus} |")
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

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        return bench.main()
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        bench.stop()
        bench.write()


if __name__ == "__main__":
    sys.exit(main())
