#!/usr/bin/python3
"""Soak: a long `gradmesh local` run, watching the processes' memory and files.

Runs a coordinator and P workers for many small iterations and samples, every
--interval seconds, each process's resident memory (VmRSS) and open file
descriptors from /proc. A leak shows as growth between the sample after the
warm-up (the first tenth of the run) and the last one. Writes a table, JSON
and a PNG (out/soak/ by default) and exits 1 if an iteration failed or the
run did not finish.

  bench/soak.py --iterations=10000 --workers=4 --n=20000
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build-release"),
                   help="build directory holding tools/gradmesh/gradmesh")
    p.add_argument("--iterations", type=int, default=10000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--n", type=int, default=20000, help="values per worker")
    p.add_argument("--algo", default="spardl")
    p.add_argument("--interval", type=float, default=2.0,
                   help="seconds between samples")
    p.add_argument("--out", default=os.path.join(ROOT, "out", "soak"))
    p.add_argument("--timeout", type=float, default=3600,
                   help="seconds before the run counts as hung and is killed")
    args = p.parse_args()
    if args.iterations < 10 or args.workers < 1 or args.n < 1:
        p.error("--iterations must be at least 10, --workers and --n positive")
    if args.interval <= 0:
        p.error("--interval must be positive")
    return args


def sample(pid):
    """(resident KiB, open descriptors) of `pid`, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, AttributeError):
        return None


def processes(work_dir):
    """{name: pid} of the cluster's processes (found by their work dir)."""
    out = subprocess.run(["pgrep", "-a", "-f", work_dir], capture_output=True,
                         text=True).stdout
    found = {}
    for line in out.splitlines():
        pid, command = line.split(" ", 1)
        if "gradmesh-coordinator" in command:
            found["coordinator"] = int(pid)
        m = re.search(r"--node_id=(worker-\d+)", command)
        if m:
            found[m.group(1)] = int(pid)
    return found


def main():
    args = parse_args()
    binary = os.path.join(args.build, "tools/gradmesh/gradmesh")
    if not os.access(binary, os.X_OK):
        sys.exit(f"soak: {binary} is missing; build it first "
                 "(bash scripts/build.sh build-release "
                 "-DCMAKE_BUILD_TYPE=Release)")
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gradmesh-soak-")
    log_path = os.path.join(args.out, "local.log")
    command = [binary, "local", f"--workers={args.workers}", f"--n={args.n}",
               f"--iterations={args.iterations}", f"--algo={args.algo}",
               f"--work-dir={work}"]
    print("soak:", " ".join(command), flush=True)
    samples = []  # (seconds, iteration, {name: (rss, fds)})
    start = time.time()
    progress = {"iteration": 0, "failed": 0}

    def follow(stream, log):
        for line in stream:
            log.write(line)
            m = re.match(r"iter\s+(\d+)\s+(FAILED)?", line)
            if m:
                progress["iteration"] = int(m.group(1)) + 1
                progress["failed"] += m.group(2) is not None

    with open(log_path, "w") as log:
        run = subprocess.Popen(command, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        reader = threading.Thread(target=follow, args=(run.stdout, log))
        reader.start()
        while run.poll() is None:
            now = time.time()
            if now - start > args.timeout:
                print(f"soak: no end after {args.timeout:.0f} s; killing it")
                run.kill()
                break
            stats = {name: sample(pid)
                     for name, pid in processes(work).items()}
            stats = {k: v for k, v in stats.items() if v is not None}
            if stats and (not samples or stats.keys() == samples[0][2].keys()):
                samples.append((now - start, progress["iteration"], stats))
                print(f"soak: {progress['iteration']}/{args.iterations} "
                      f"iterations, {now - start:.0f} s", flush=True)
            time.sleep(args.interval)
        reader.join()
    code = run.returncode
    iteration, failed = progress["iteration"], progress["failed"]
    report(args, samples, iteration, failed, code, time.time() - start)
    if code != 0 or failed or iteration < args.iterations:
        sys.exit(1)


def report(args, samples, iterations, failed, code, seconds):
    # After the warm-up: the first sample past a tenth of the iterations.
    warm = next((s for s in samples if s[1] >= args.iterations // 10),
                samples[0] if samples else None)
    # The last sample taken mid-run (the driver unregisters at the end).
    full = [s for s in samples if len(s[2]) == len(warm[2]) and
            s[1] < args.iterations] if warm else []
    end = full[-1] if full else None
    rows = []
    if warm and end:
        for name in sorted(warm[2]):
            (rss0, fd0), (rss1, fd1) = warm[2][name], end[2][name]
            peak = max(s[2][name][0] for s in full)
            rows.append({"process": name, "rss_kib_after_warmup": rss0,
                         "rss_kib_end": rss1, "rss_kib_peak": peak,
                         "fds_after_warmup": fd0, "fds_end": fd1,
                         "fds_peak": max(s[2][name][1] for s in full)})
    result = {"iterations": iterations, "failed_iterations": failed,
              "exit_code": code, "seconds": round(seconds, 1),
              "workers": args.workers, "n": args.n, "algorithm": args.algo,
              "warmup_iteration": warm[1] if warm else None,
              "end_iteration": end[1] if end else None, "processes": rows,
              "samples": [{"seconds": round(t, 1), "iteration": i,
                           "processes": {k: {"rss_kib": v[0], "fds": v[1]}
                                         for k, v in p.items()}}
                          for t, i, p in samples]}
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [f"{iterations} iterations ({failed} failed), {args.workers} "
             f"workers, n = {args.n}, {args.algo}, {seconds:.0f} s; exit "
             f"code {code}", "",
             "| process | RSS after warm-up (MiB) | RSS at end (MiB) | peak "
             "(MiB) | fds after warm-up | fds at end |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['process']} | {r['rss_kib_after_warmup'] / 1024:.1f} "
                     f"| {r['rss_kib_end'] / 1024:.1f} | "
                     f"{r['rss_kib_peak'] / 1024:.1f} | {r['fds_after_warmup']} "
                     f"| {r['fds_end']} |")
    if warm and end:
        lines.append("")
        lines.append(f"warm-up sample at iteration {warm[1]}, last at "
                     f"{end[1]}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "soak.md"), "w") as f:
        f.write(text)
    print(text)
    plot(args, samples)


def plot(args, samples):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("soak: matplotlib missing, no PNG")
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    names = sorted({k for _, _, p in samples for k in p})
    for name in names:
        xs = [i for _, i, p in samples if name in p]
        top.plot(xs, [p[name][0] / 1024 for _, _, p in samples if name in p],
                 label=name)
        bottom.plot(xs, [p[name][1] for _, _, p in samples if name in p],
                    label=name)
    top.set_ylabel("resident memory (MiB)")
    bottom.set_ylabel("open file descriptors")
    bottom.set_xlabel("iteration")
    top.legend(fontsize=7, ncol=3)
    top.set_title(f"soak: {args.workers} workers, n = {args.n}, {args.algo}")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "soak.png"), dpi=110)


if __name__ == "__main__":
    main()
