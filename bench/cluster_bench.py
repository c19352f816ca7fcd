#!/usr/bin/python3
"""The cluster benchmark: gradmesh's all-reduces through the real daemons on
emulated hosts, against Gloo's and MPI's dense all-reduce on the same links.

Every worker (and every Gloo or MPI rank) runs in a network namespace of its
own, joined to a bridge by a veth pair that tc's tbf shapes to the link's rate
in both directions; "loopback" runs everything on 127.0.0.1 instead. For each
link it first fits alpha and beta over gradmesh's own transport
(transport_bench --fit), then runs every case: n x density x P x system.

  sudo bench/cluster_bench.py --build=build-release            # the full grid
  sudo bench/cluster_bench.py --links=loopback,1gbit --n=25000000 \
      --densities=0.01 --workers=4
  bench/cluster_bench.py --smoke --build=build --out=/tmp/smoke  # CI

Writes OUT/results.json, OUT/results.md and OUT/results.png, printing one
progress line per case. Everything it creates in the network (namespaces
gmb*, bridge gmbr0) it removes on exit, Ctrl-C included.
"""

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from netns_hosts import Hosts, run, run_then_clean_up

LINKS = {  # name: tbf rate (None: not shaped)
    "loopback": None,
    "10gbit": "10gbit",
    "1gbit": "1gbit",
    "100mbit": "100mbit",
}
GRADMESH_SYSTEMS = {  # name: (--algo, --teams)
    "spardl": ("spardl", "1"),
    "spardl-auto": ("spardl", "auto"),
    "oktopk": ("oktopk", "1"),
    "topka": ("topka", "1"),
    "topkdsa": ("topkdsa", "1"),
    "gtopk": ("gtopk", "1"),
    "dense": ("dense", "1"),
}
PEER_SYSTEMS = ("gloo", "mpi")
SPARSE_BASELINES = ("oktopk", "topka", "topkdsa", "gtopk")


def log(message):
    print(message, flush=True)


LIVE = set()  # process groups of running cases, killed on any exit


def kill_group(proc):
    """SIGTERM to the process's whole group (mpirun tidies its ranks up),
    SIGKILL 5 s later."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    LIVE.discard(proc)


def run_all(commands, timeout, env=None):
    """Runs the commands at once, each in a process group of its own, until
    all exit or `timeout` seconds pass (then all are killed). Returns
    [(returncode, stdout, stderr)]; never leaves a process behind."""
    procs, files = [], []
    try:
        for cmd in commands:
            out = tempfile.TemporaryFile(mode="w+")
            err = tempfile.TemporaryFile(mode="w+")
            files.append((out, err))
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err,
                                          text=True, env=env,
                                          start_new_session=True))
            LIVE.add(procs[-1])
        deadline = time.time() + timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{os.path.basename(commands[0][0])}: "
                                   f"no result within {timeout} s")
        results = []
        for proc, (out, err) in zip(procs, files):
            out.seek(0)
            err.seek(0)
            results.append((proc.returncode, out.read(), err.read()))
        return results
    finally:
        for proc in procs:
            kill_group(proc)
        for out, err in files:
            out.close()
            err.close()


def run_one(cmd, timeout, env=None):
    code, out, err = run_all([cmd], timeout, env)[0]
    if code != 0:
        raise RuntimeError(f"{os.path.basename(cmd[0])} exited with {code}: "
                           f"{err.strip()[-800:]}")
    return out


class Bench:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.gradmesh = os.path.join(self.build, "tools/gradmesh/gradmesh")
        self.transport_bench = os.path.join(self.build,
                                            "bench/transport_bench")
        self.gloo = os.path.join(self.build, "bench/gloo_allreduce")
        self.mpi = os.path.join(self.build, "bench/mpi_allreduce")
        self.hosts = None
        self.results = []
        self.links = {}
        self.skipped = []

    # ------------------------------------------------------------ systems
    def available(self, system):
        if system in GRADMESH_SYSTEMS or system == "engine":
            return os.access(self.gradmesh, os.X_OK)
        if system == "gloo":
            return os.access(self.gloo, os.X_OK)
        if system == "mpi":
            return os.access(self.mpi, os.X_OK) and shutil.which("mpirun")
        return False

    def host_args(self, workers):
        if self.hosts is None:
            return []
        return [f"--netns={','.join(self.hosts.names[:workers])}",
                f"--hosts={','.join(self.hosts.ips[:workers])}",
                f"--coordinator_host={self.hosts.bridge_ip}"]

    def run_gradmesh(self, system, n, density, workers, iterations):
        algo, teams = GRADMESH_SYSTEMS[system]
        warm = 1
        if teams == "auto":  # autotune tries every divisor of P first
            divisors = [d for d in range(1, workers + 1) if workers % d == 0]
            warm += len(divisors) * self.args.autotune_window
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "local.json")
            cmd = [self.gradmesh, "local", f"--algo={algo}",
                   f"--teams={teams}", f"--workers={workers}", f"--n={n}",
                   f"--density={density}", f"--iterations={warm + iterations}",
                   "--verify=false", f"--json={path}",
                   f"--autotune_window={self.args.autotune_window}",
                   f"--timeout_s={self.args.timeout}"]
            if self.args.smoke:
                cmd[cmd.index("--verify=false")] = "--verify=true"
            cmd += self.host_args(workers)
            run_one(cmd, self.args.case_timeout)
            with open(path) as f:
                data = json.load(f)
        rows = data["iterations"][-iterations:]
        if len(rows) < iterations:
            raise RuntimeError(f"{system}: {len(rows)} of {iterations} timed "
                               "iterations succeeded")
        # Per iteration, the slowest worker's figures: the critical path.
        out = {"seconds": [], "call_seconds": [], "compute_seconds": [],
               "bytes_received": [], "rounds": [], "teams": None}
        for it in rows:
            ws = it["workers"]
            out["seconds"].append(max(w["seconds"] for w in ws))
            out["call_seconds"].append(max(w["call_seconds"] for w in ws))
            out["compute_seconds"].append(
                max(w["seconds"] - w["wait_seconds"] for w in ws))
            out["bytes_received"].append(max(w["bytes_received"] for w in ws))
            out["rounds"].append(max(w["rounds"] for w in ws))
            out["teams"] = ws[0]["teams"]
        return out

    def run_engine(self, system, n, density, workers, iterations):
        """The in-process engine (gradmesh replay) on the same inputs."""
        algo, _ = GRADMESH_SYSTEMS[system]
        with tempfile.TemporaryDirectory() as tmp:
            out_dir = os.path.join(tmp, "replay")
            run_one([self.gradmesh, "replay", f"--algo={algo}", "--teams=1",
                     f"--workers={workers}", f"--n={n}",
                     f"--density={density}", f"--iterations={1 + iterations}",
                     f"--timeout_s={self.args.timeout}",
                     f"--output_dir={out_dir}"], self.args.case_timeout)
            with open(os.path.join(out_dir, "stats.json")) as f:
                data = json.load(f)
        per_iteration = zip(*[r["iterations"] for r in data["ranks"]])
        seconds = [max(x["seconds"] for x in its) for its in per_iteration]
        return {"seconds": seconds[1:]}

    def run_peer(self, system, n, workers, iterations):
        with tempfile.TemporaryDirectory() as store:
            if system == "gloo":
                commands = []
                for r in range(workers):
                    host = "127.0.0.1"
                    prefix = []
                    if self.hosts is not None:
                        host = self.hosts.ips[r]
                        prefix = ["ip", "netns", "exec", self.hosts.names[r]]
                    commands.append(
                        prefix + [self.gloo, f"--rank={r}",
                                  f"--size={workers}", f"--store_dir={store}",
                                  f"--host={host}", f"--n={n}",
                                  f"--iterations={iterations}",
                                  f"--timeout_s={self.args.timeout}"])
                outputs = []
                for code, out, err in run_all(commands,
                                              self.args.case_timeout):
                    if code != 0:
                        raise RuntimeError(f"gloo: {err.strip()[-800:]}")
                    outputs.append(out)
            else:
                outputs = [self.run_mpi(n, workers, iterations)]
        lines = [json.loads(l) for o in outputs for l in o.splitlines()
                 if l.startswith("{")]
        if len(lines) != workers or not all(l["checked"] for l in lines):
            raise RuntimeError(f"{system}: {len(lines)} of {workers} ranks "
                               "reported a checked sum")
        seconds = [max(ts) for ts in zip(*[l["seconds"] for l in lines])]
        return {"seconds": seconds}

    def run_mpi(self, n, workers, iterations):
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        program = [self.mpi, f"--n={n}", f"--iterations={iterations}"]
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none",
               "--timeout", str(self.args.case_timeout),
               "--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
        if self.hosts is None:
            cmd += ["--mca", "btl_tcp_if_include", "lo", "-np", str(workers)]
            cmd += program
        else:
            # The ranks reach mpirun's PMIx server over the bridge.
            subnet = self.hosts.subnet + ".0/24"
            env["PMIX_MCA_ptl_tcp_if_include"] = subnet
            cmd += ["--mca", "btl_tcp_if_include", subnet]
            for r in range(workers):
                if r > 0:
                    cmd.append(":")
                cmd += ["-np", "1", "ip", "netns", "exec",
                        self.hosts.names[r]] + program
        return run_one(cmd, self.args.case_timeout + 30, env)

    # -------------------------------------------------------------- cases
    def fit_link(self, link):
        cmd = [self.transport_bench, "--fit",
               f"--fit_max_kib={self.args.fit_max_kib}"]
        if self.hosts is not None:
            cmd += [f"--netns={self.hosts.names[0]},{self.hosts.names[1]}",
                    f"--hosts={self.hosts.ips[0]},{self.hosts.ips[1]}"]
        out = run_one(cmd, self.args.case_timeout)
        fit = fit_link_model(json.loads(out.strip().splitlines()[-1])["points"])
        log(f"link {link}: alpha {fit['alpha_s'] * 1e6:.1f} us, "
            f"{fit['gbit_per_s']:.3g} Gbit/s over the gRPC transport")
        return fit

    def run_case(self, link, n, density, workers, system):
        iterations = self.args.iterations
        before = self.hosts.rx_bytes() if self.hosts is not None else None
        if system in GRADMESH_SYSTEMS:
            out = self.run_gradmesh(system, n, density, workers, iterations)
            runs = 1 + iterations + (
                0 if GRADMESH_SYSTEMS[system][1] != "auto" else
                len([d for d in range(1, workers + 1) if workers % d == 0]) *
                self.args.autotune_window)
        elif system == "engine":
            out = self.run_engine("spardl", n, density, workers, iterations)
            runs = None
        else:
            out = self.run_peer(system, n, workers, iterations)
            runs = 1 + iterations
        if before is not None and runs:
            after = self.hosts.rx_bytes()
            out["wire_bytes_received"] = statistics.mean(
                (a - b) / runs for a, b in zip(after[:workers],
                                               before[:workers]))
        row = {"link": link, "n": n, "density": density, "workers": workers,
               "system": system, "iterations": iterations}
        for key, values in list(out.items()):
            if isinstance(values, list):
                row[key] = values
                row[key + "_median"] = statistics.median(values)
            else:
                row[key] = values
        row["spread"] = [min(out["seconds"]), max(out["seconds"])]
        # What a caller waits for: the SDK call for gradmesh, the library
        # call for Gloo and MPI. Speedups compare these.
        row["caller_seconds_median"] = row.get("call_seconds_median",
                                               row["seconds_median"])
        add_model(row, self.links[link])
        return row

    def grid(self):
        a = self.args
        for link in a.links:
            for n in a.n:
                for density in a.densities:
                    for workers in a.workers:
                        systems = list(a.systems)
                        if link == "loopback" and a.engine:
                            systems.append("engine")
                        for system in systems:
                            yield link, n, density, workers, system

    def main(self):
        cases = list(self.grid())
        max_workers = max(self.args.workers)
        done = 0
        start = time.time()
        namespaces = None
        for link in self.args.links:
            emulated = LINKS[link] is not None or self.args.netns_loopback
            try:
                if emulated and namespaces is None:
                    namespaces = Hosts(max(max_workers, 2))
                    namespaces.create()
            except (RuntimeError, subprocess.SubprocessError) as e:
                namespaces = None
                why = getattr(e, "stderr", "") or str(e)
                if self.args.smoke:  # optional there: loopback is the test
                    log(f"link {link}: no emulated hosts here ({why.strip()})")
                    continue
                raise RuntimeError(f"cannot make emulated hosts: {why}")
            self.hosts = namespaces if emulated else None
            try:
                if emulated:
                    self.hosts.shape(LINKS[link])
                self.links[link] = self.fit_link(link)
            except (RuntimeError, subprocess.SubprocessError) as e:
                log(f"link {link}: FAILED {e}; its cases are skipped")
                self.skipped.append(f"{link}: {e}")
                continue
            for case in cases:
                if case[0] != link:
                    continue
                done += 1
                _, n, density, workers, system = case
                label = (f"[{done}/{len(cases)}] {link} n={n} "
                         f"density={density:g} P={workers} {system}")
                if not self.available(system):
                    log(f"{label}: skipped (not built or not installed)")
                    self.skipped.append(label)
                    continue
                try:
                    row = self.run_case(link, n, density, workers, system)
                except (RuntimeError, subprocess.SubprocessError,
                        OSError, ValueError, KeyError) as e:
                    log(f"{label}: FAILED {e}")
                    self.results.append(
                        {"link": link, "n": n, "density": density,
                         "workers": workers, "system": system,
                         "error": str(e)[-800:]})
                    continue
                self.results.append(row)
                log(f"{label}: {row['seconds_median'] * 1e3:.1f} ms "
                    f"(median; {row['spread'][0] * 1e3:.1f}-"
                    f"{row['spread'][1] * 1e3:.1f}), "
                    f"{time.time() - start:.0f} s elapsed")
        if self.args.smoke and self.skipped:
            log("smoke: every system must run (scripts/setup.sh installs "
                "Gloo and Open MPI; build the harnesses)")
            return 1
        return 1 if any("error" in r for r in self.results) else 0

    def write(self):
        add_ratios(self.results)
        write_outputs({"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       "machine": machine(), "command": " ".join(sys.argv),
                       "links": self.links, "cases": self.results,
                       "skipped": self.skipped}, self.args.out)


def fit_link_model(points):
    """alpha and beta of t(m) = alpha + beta m from one-way times by size.

    alpha is the smallest message's time; beta the slope between the two
    largest, the sustained rate: tbf's token bucket lets small messages pass
    at line rate, so a least-squares line through every size would bend."""
    points = sorted(points)
    (m1, t1), (m2, t2) = points[-2], points[-1]
    beta = (t2 - t1) / (m2 - m1)
    if beta <= 0:  # noise on a fast link: the largest message's average
        beta = t2 / m2
    return {"alpha_s": points[0][1], "beta_s_per_byte": beta,
            "gbit_per_s": 8e-9 / beta, "points": points}


def add_model(row, fit):
    """The alpha-beta prediction of a gradmesh row: alpha x (the schedule's
    rounds + the members' agreement, a Bruck all-gather of ceil(log2 P)
    rounds) + beta x the slowest worker's bytes received + that worker's
    own work (its time not blocked on peers), iteration by iteration."""
    if "compute_seconds" not in row:
        return
    agree = math.ceil(math.log2(row["workers"]))
    predicted = [
        fit["alpha_s"] * (rounds + agree) + fit["beta_s_per_byte"] * received +
        compute for rounds, received, compute in zip(
            row["rounds"], row["bytes_received"], row["compute_seconds"])]
    row["compute_share"] = statistics.median(
        c / s for c, s in zip(row["compute_seconds"], row["seconds"]))
    row["predicted_seconds_median"] = statistics.median(predicted)
    row["measured_over_predicted"] = statistics.median(
        s / p for s, p in zip(row["seconds"], predicted))


def reanalyze(out_dir):
    """Refits the links and recomputes models, ratios, markdown and plot of
    a finished run from its results.json (no measurement)."""
    path = os.path.join(out_dir, "results.json")
    with open(path) as f:
        data = json.load(f)
    data["links"] = {link: fit_link_model(fit["points"])
                     for link, fit in data["links"].items()}
    for row in data["cases"]:
        if "error" not in row:
            add_model(row, data["links"][row["link"]])
    add_ratios(data["cases"])
    write_outputs(data, out_dir)
    return 0


def write_outputs(data, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(markdown(data))
    plotted = plot(data["cases"], os.path.join(out_dir, "results.png"))
    log(f"wrote {out_dir}/results.json, results.md"
        f"{', results.png' if plotted else ''}")


def add_ratios(rows):
    """Speedups of every row against its case's peers, same run."""
    by_case = {}
    for r in rows:
        if "error" not in r:
            key = (r["link"], r["n"], r["density"], r["workers"])
            by_case.setdefault(key, {})[r["system"]] = r
    for systems in by_case.values():
        for name, row in systems.items():
            if name == "engine":
                continue
            for peer in ("gloo", "mpi", "dense") + SPARSE_BASELINES:
                if peer in systems and peer != name:
                    row[f"speedup_vs_{peer}"] = (
                        systems[peer]["caller_seconds_median"] /
                        row["caller_seconds_median"])
            if name == "spardl" and "engine" in systems:
                row["daemon_over_engine"] = (
                    row["seconds_median"] / systems["engine"]["seconds_median"])


def machine():
    cores = os.cpu_count()
    memory = ""
    try:
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
            memory = f", {kib / 2**20:.0f} GiB"
    except OSError:
        pass
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip() + ", "
                    break
    except OSError:
        pass
    return f"{model}{cores} cores{memory}"


def fmt(value, spec):
    return "" if value is None else format(value, spec)


def markdown(data):
    lines = [f"Measured {data['date']} on {data['machine']}.", "",
             f"`{data['command']}`", "", "| link | alpha | bandwidth |",
             "|---|---|---|"]
    for link, fit in data["links"].items():
        lines.append(f"| {link} | {fit['alpha_s'] * 1e6:.1f} us | "
                     f"{fit['gbit_per_s']:.3g} Gbit/s |")
    columns = ["link", "n", "density", "P", "system", "worker ms (median)",
               "spread ms", "caller ms", "payload B received", "wire B "
               "received", "compute share", "x Gloo", "x MPI", "x Ok-Topk",
               "x TopkA", "measured / model"]
    lines += ["", "| " + " | ".join(columns) + " |",
              "|" + "---|" * len(columns)]
    for r in data["cases"]:
        head = [r["link"], f"{r['n']:,}", f"{r['density']:g}",
                str(r["workers"]), r["system"]]
        if "error" in r:
            why = " ".join(r["error"].split()).replace("|", "/")[:120]
            cells = head + [f"failed: {why}"]
            lines.append("| " + " | ".join(
                cells + [""] * (len(columns) - len(cells))) + " |")
            continue
        if r.get("teams") and r["system"].startswith("spardl"):
            head[4] += f" (d={r['teams']})"
        if r["system"] == "engine":
            head[4] = "spardl (d=1), in-process engine"
        share = r.get("compute_share")
        cells = head + [
            f"{r['seconds_median'] * 1e3:.1f}",
            f"{r['spread'][0] * 1e3:.1f}-{r['spread'][1] * 1e3:.1f}",
            f"{r['caller_seconds_median'] * 1e3:.1f}",
            fmt(r.get("bytes_received_median"), ",.0f"),
            fmt(r.get("wire_bytes_received"), ",.0f"),
            "" if share is None else f"{share:.0%}",
            fmt(r.get("speedup_vs_gloo"), ".2f"),
            fmt(r.get("speedup_vs_mpi"), ".2f"),
            fmt(r.get("speedup_vs_oktopk"), ".2f"),
            fmt(r.get("speedup_vs_topka"), ".2f"),
            fmt(r.get("measured_over_predicted"), ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    engine = [r for r in data["cases"] if "daemon_over_engine" in r]
    if engine:
        lines += ["", "Daemon path against the in-process engine (SparDL "
                  "d=1, same inputs):", ""]
        for r in engine:
            lines.append(f"- n={r['n']:,}, density {r['density']:g}, "
                         f"P={r['workers']}: {r['daemon_over_engine']:.2f}x")
    if data["skipped"]:
        lines += ["", "Skipped: " + "; ".join(data["skipped"])]
    return "\n".join(lines) + "\n"


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot")
        return False
    groups = {}
    for r in rows:
        if "error" in r:
            continue
        key = (r["n"], r["density"], r["workers"])
        groups.setdefault(key, {}).setdefault(r["link"], {})[r["system"]] = (
            r["seconds_median"])
    if not groups:
        return False
    # One order and one colour per system in every panel.
    order = list(GRADMESH_SYSTEMS) + ["engine"] + list(PEER_SYSTEMS)
    present = {r["system"] for r in rows if "error" not in r}
    systems = [s for s in order if s in present]
    colours = plt.get_cmap("tab10")
    labels = {"engine": "spardl, in-process engine"}
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 3.6 * len(groups)),
                             squeeze=False)
    for ax, ((n, density, workers), links) in zip(axes[:, 0],
                                                   sorted(groups.items())):
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            xs = [j + i * width for j in range(len(links))]
            ys = [links[l].get(system, 0) * 1e3 for l in links]
            ax.bar(xs, ys, width, label=labels.get(system, system),
                   color=colours(i % 10))
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(links))])
        ax.set_xticklabels(list(links))
        ax.set_yscale("log")
        ax.set_ylabel("ms per all-reduce")
        ax.set_title(f"n = {n:,}, density {density:g}, P = {workers}")
        ax.legend(fontsize=7, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def csv(kind):
    return lambda s: [kind(x) for x in s.split(",") if x]


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--build", default="build-release",
                   help="build tree with gradmesh, transport_bench and the "
                   "harnesses (default: build-release)")
    p.add_argument("--out", default="out/cluster", help="output directory")
    p.add_argument("--links", type=csv(str), default=list(LINKS),
                   help="comma list of " + ", ".join(LINKS))
    p.add_argument("--n", type=csv(int), default=[4000000, 25000000])
    p.add_argument("--densities", type=csv(float), default=[0.001, 0.01])
    p.add_argument("--workers", type=csv(int), default=[4, 8])
    p.add_argument("--systems", type=csv(str),
                   default=list(GRADMESH_SYSTEMS) + list(PEER_SYSTEMS))
    p.add_argument("--iterations", type=int, default=5,
                   help="timed all-reduces per case (after a warm-up)")
    p.add_argument("--autotune_window", type=int, default=2)
    p.add_argument("--no-engine", dest="engine", action="store_false",
                   help="skip the in-process engine rows on loopback")
    p.add_argument("--netns_loopback", action="store_true",
                   help="run the loopback link in namespaces too (unshaped "
                   "veth)")
    p.add_argument("--fit_max_kib", type=int, default=4096)
    p.add_argument("--timeout", type=int, default=120,
                   help="per-operation timeout, seconds")
    p.add_argument("--case_timeout", type=int, default=1800,
                   help="a case that runs longer fails, seconds")
    p.add_argument("--reanalyze", metavar="DIR",
                   help="only recompute the fits, models and reports of the "
                   "finished run in DIR from its results.json")
    p.add_argument("--smoke", action="store_true",
                   help="tiny n, 2 iterations, on loopback and (as root, where "
                   "namespaces can be made) at 1 Gbit/s: checks that every "
                   "part runs and every sum is right (no timing claims)")
    args = p.parse_args()
    if args.smoke:
        # Emulated hosts too where root can make them.
        args.links = ["loopback"] + (["1gbit"] if os.geteuid() == 0 else [])
        args.n, args.densities = [20000], [0.01]
        args.workers, args.iterations, args.fit_max_kib = [4], 2, 64
        args.autotune_window = 1
        args.timeout, args.case_timeout = 30, 60
    if args.iterations < 1:
        p.error("--iterations: at least 1")
    for link in args.links:
        if link not in LINKS:
            p.error(f"unknown link {link}; known: {', '.join(LINKS)}")
    for system in args.systems:
        if system not in GRADMESH_SYSTEMS and system not in PEER_SYSTEMS:
            p.error(f"unknown system {system}")
    needs_root = args.netns_loopback or any(LINKS[l] for l in args.links)
    if needs_root and os.geteuid() != 0 and not args.reanalyze:
        p.error("emulated hosts need root (network namespaces and tc)")
    if min(args.workers) < 2:
        p.error("--workers: at least 2")
    return args


def main():
    args = parse_args()
    if args.reanalyze:
        return reanalyze(args.reanalyze)
    bench = Bench(args)
    if not os.access(bench.gradmesh, os.X_OK):
        sys.exit(f"{bench.gradmesh} is missing: build the project first "
                 f"(scripts/build.sh {args.build})")

    def body():
        try:
            return bench.main()
        except RuntimeError as e:
            log(f"cluster_bench: {e}")
            return 1

    def clean_up():
        for proc in list(LIVE):
            kill_group(proc)
        bench.write()
        if os.geteuid() == 0:
            Hosts(0).remove_all()

    return run_then_clean_up(body, clean_up)


if __name__ == "__main__":
    sys.exit(main())
