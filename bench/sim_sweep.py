#!/usr/bin/python3
"""Sweeps of `gradmesh sim`: the figures of the SparDL paper's kind, for
cluster sizes no test bed here has.

  bench/sim_sweep.py --gradmesh=build/tools/gradmesh/gradmesh --out=out/sim
  bench/sim_sweep.py --workers=2,4,8 --teams-workers=12 --quick   # a minute
  bench/sim_sweep.py --cluster=out/cluster-sim ...   # against the emulated
                                                     # cluster's measurements

Writes OUT/sim.json (every case as `gradmesh sim --json` printed it),
OUT/sim.md (the tables) and three plots:
  scaling.png  time per all-reduce against P for every algorithm (SparDL at
               d = 1 and at the d the coordinator's model picks)
  teams.png    time against d for each of --teams-workers, the model's pick
               and the simulated best marked
  cluster.png  with --cluster: predicted against measured, per P
Tables: time against P; rounds and bytes against Table I; time against d
with the model's ranking; and with --cluster, the prediction for each
SparDL row of a cluster_bench.py run (its links' fitted alpha and beta, its
n and density, compute scaled by P/cores: the emulated workers share this
machine's cores) beside the measured time.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ALGORITHMS = ("spardl", "topka", "topkdsa", "gtopk", "oktopk", "dense")


def log(message):
    print(message, flush=True)


def csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x]


class Sim:
    def __init__(self, args):
        self.args = args

    def run(self, **flags):
        """One `gradmesh sim --json` call; its parsed JSON."""
        base = {"n": self.args.n, "density": self.args.density,
                "gbit": self.args.gbit, "alpha_us": self.args.alpha_us,
                "iterations": self.args.iterations,
                "max_values": self.args.max_values}
        for cost in ("select_ns", "merge_ns", "accumulate_ns"):
            if getattr(self.args, cost) is not None:
                base[cost] = getattr(self.args, cost)
        base.update(flags)
        cmd = [self.args.gradmesh, "sim", "--json"] + [
            f"--{k}={v}" for k, v in base.items()]
        start = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=self.args.case_timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
        log(f"  {' '.join(cmd[3:])}: {time.monotonic() - start:.1f} s")
        return json.loads(done.stdout)


def sweep_scaling(sim, args):
    """Every algorithm at every P; SparDL at every d (for the model's)."""
    rows = []
    for p in args.workers:
        for algorithm in args.algorithms:
            if algorithm == "spardl":
                all_d = sim.run(algo="spardl", workers=p, teams="all")
                by_d = {c["teams"]: c for c in all_d["cases"]}
                rows.append(dict(by_d[1], label="spardl d=1"))
                model = by_d[all_d["model_teams"]]
                rows.append(dict(model, label="spardl, model's d"))
                best = by_d[all_d["best_teams"]]
                rows.append(dict(best, label="spardl, best d"))
            elif p <= args.max_workers.get(algorithm, 1 << 30):
                rows.append(dict(sim.run(algo=algorithm, workers=p),
                                 label=algorithm))
    return rows


def sweep_teams(sim, args):
    return {p: sim.run(algo="spardl", workers=p, teams="all")
            for p in args.teams_workers}


def cluster_rows(sim, cluster_dir):
    """The SparDL rows of a cluster_bench.py run, each with the simulator's
    prediction on that link."""
    with open(os.path.join(cluster_dir, "results.json")) as f:
        data = json.load(f)
    cores = sim.args.cluster_cores
    out = []
    for row in data["cases"]:
        if row.get("system") != "spardl" or "seconds_median" not in row:
            continue
        fit = data["links"][row["link"]]
        predicted = sim.run(
            algo="spardl", teams=1, workers=row["workers"], n=row["n"],
            density=row["density"], alpha_us=fit["alpha_s"] * 1e6,
            gbit=fit["gbit_per_s"],
            compute_scale=max(1.0, row["workers"] / cores))
        measured = row["seconds_median"]
        out.append({"link": row["link"], "workers": row["workers"],
                    "n": row["n"], "density": row["density"],
                    "measured_seconds": measured,
                    "predicted_seconds": predicted["seconds"],
                    "ratio": predicted["seconds"] / measured,
                    "predicted": predicted})
    return out


def fmt_bytes(b):
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def table_one_cells(case):
    t = case.get("table_one")
    if t is None:
        return "-", "-"
    if t["min_bytes"] == t["max_bytes"]:
        return str(t["rounds"]), fmt_bytes(t["min_bytes"])
    return str(t["rounds"]), (f"[{fmt_bytes(t['min_bytes'])}, "
                              f"{fmt_bytes(t['max_bytes'])}]")


def markdown(args, scaling, teams, cluster):
    costs = ", ".join(f"{c} {getattr(args, c)}" for c in
                      ("select_ns", "merge_ns", "accumulate_ns")
                      if getattr(args, c) is not None)
    lines = [f"`{' '.join(sys.argv)}`", "",
             f"n = {args.n:,}, density {args.density}, {args.gbit} Gbit/s, "
             f"alpha {args.alpha_us} us, {args.iterations} iterations, "
             f"compute: {costs or 'gradmesh sim defaults'}.", ""]
    if scaling:
        labels = list(dict.fromkeys(r["label"] for r in scaling))
        ps = sorted({r["workers"] for r in scaling})
        lines += ["### Time per all-reduce (ms) against P", "",
                  "| P | " + " | ".join(labels) + " |",
                  "|---" * (len(labels) + 1) + "|"]
        for p in ps:
            cells = []
            for label in labels:
                row = [r for r in scaling
                       if r["workers"] == p and r["label"] == label]
                if not row:
                    cells.append("-")
                elif label.startswith("spardl,"):
                    cells.append(f"{row[0]['seconds'] * 1e3:,.2f} "
                                 f"(d={row[0]['teams']})")
                else:
                    cells.append(f"{row[0]['seconds'] * 1e3:,.2f}")
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines += ["", "### Rounds and bytes received against Table I", "",
                  "| algorithm | P | d | n' | rounds | Table I | bytes (max) "
                  "| Table I | compute share |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in scaling:
            if r["label"] == "spardl, best d":
                continue
            rounds, table_bytes = table_one_cells(r)
            lines.append(
                f"| {r['algorithm']} | {r['workers']} | {r['teams']} | "
                f"{r['simulated_n']:,} | {r['rounds']} | {rounds} | "
                f"{fmt_bytes(r['max_bytes_received'])} | {table_bytes} | "
                f"{r['compute_seconds'] / max(r['seconds'], 1e-30):.0%} |")
    for p, result in teams.items():
        model = {m["teams"]: m for m in result["model"]}
        lines += ["", f"### Time against d, P = {p}", "",
                  "| d | simulated ms | rounds | bytes (max) | modeled ms "
                  "| model rank |", "|---|---|---|---|---|---|"]
        order = [m["teams"] for m in result["model"]]
        for c in result["cases"]:
            d = c["teams"]
            mark = (" (best)" if d == result["best_teams"] else "") + (
                " (model's pick)" if d == result["model_teams"] else "")
            skipped = " skipped" if model[d]["skipped"] else ""
            lines.append(
                f"| {d}{mark} | {c['seconds'] * 1e3:,.3f} | {c['rounds']} | "
                f"{fmt_bytes(c['max_bytes_received'])} | "
                f"{model[d]['seconds'] * 1e3:,.3f} | "
                f"{order.index(d) + 1}{skipped} |")
    if cluster:
        lines += ["", "### The simulator against the emulated cluster", "",
                  "| link | P | measured ms | predicted ms | predicted / "
                  "measured |", "|---|---|---|---|---|"]
        for c in cluster:
            lines.append(
                f"| {c['link']} | {c['workers']} | "
                f"{c['measured_seconds'] * 1e3:,.1f} | "
                f"{c['predicted_seconds'] * 1e3:,.1f} | {c['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(out, scaling, teams, cluster):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plots")
        return
    if scaling:
        fig, ax = plt.subplots(figsize=(8, 5))
        for label in dict.fromkeys(r["label"] for r in scaling):
            rows = sorted((r for r in scaling if r["label"] == label),
                          key=lambda r: r["workers"])
            ax.plot([r["workers"] for r in rows],
                    [r["seconds"] * 1e3 for r in rows], marker="o",
                    label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers P")
        ax.set_ylabel("simulated ms per all-reduce")
        ax.set_title("gradmesh sim: time per all-reduce against P")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "scaling.png"), dpi=110)
    if teams:
        fig, axes = plt.subplots(1, len(teams), figsize=(4.5 * len(teams), 4))
        axes = axes if len(teams) > 1 else [axes]
        for ax, (p, result) in zip(axes, teams.items()):
            ds = [c["teams"] for c in result["cases"]]
            ms = [c["seconds"] * 1e3 for c in result["cases"]]
            ax.plot(range(len(ds)), ms, marker="o", label="simulated")
            model = {m["teams"]: m["seconds"] * 1e3 for m in result["model"]}
            ax.plot(range(len(ds)), [model[d] for d in ds], marker="x",
                    linestyle="--", label="model (communication only)")
            pick = ds.index(result["model_teams"])
            ax.scatter([pick], [ms[pick]], s=160, facecolors="none",
                       edgecolors="red", label="model's pick", zorder=3)
            ax.set_xticks(range(len(ds)), [str(d) for d in ds])
            ax.set_xlabel("teams d")
            ax.set_ylabel("ms per all-reduce")
            ax.set_title(f"P = {p}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "teams.png"), dpi=110)
    if cluster:
        fig, ax = plt.subplots(figsize=(5, 4))
        labels = [f"{c['link']} P={c['workers']}" for c in cluster]
        x = range(len(cluster))
        ax.bar([i - 0.2 for i in x],
               [c["measured_seconds"] * 1e3 for c in cluster], 0.4,
               label="emulated cluster (measured)")
        ax.bar([i + 0.2 for i in x],
               [c["predicted_seconds"] * 1e3 for c in cluster], 0.4,
               label="gradmesh sim")
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("ms per all-reduce (SparDL d=1)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "cluster.png"), dpi=110)


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 1)[1])
    p.add_argument("--gradmesh", default="build/tools/gradmesh/gradmesh")
    p.add_argument("--out", default="out/sim")
    p.add_argument("--n", type=int, default=25_000_000)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--gbit", type=float, default=25)
    p.add_argument("--alpha_us", type=float, default=50)
    p.add_argument("--iterations", type=int, default=2)
    for cost in ("select_ns", "merge_ns", "accumulate_ns"):
        p.add_argument(f"--{cost}", type=float,
                       help=f"gradmesh sim --{cost} (default: its own; 0 "
                       "for communication alone)")
    p.add_argument("--max_values", type=int, default=1 << 30,
                   help="gradmesh sim --max-values (memory: ~4 bytes each; "
                   "twice the command's own default)")
    p.add_argument("--workers", type=csv(int),
                   default=[2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--algorithms", type=csv(str), default=list(ALGORITHMS))
    p.add_argument("--max_workers", type=csv(str),
                   default=["topka=256", "dense=256", "oktopk=512",
                            "topkdsa=512"],
                   help="ALGO=P: skip larger P for ALGO (on 2 cores, TopkA's "
                   "all-gather and the ring take hours at P = 1024, Ok-Topk's "
                   "and TopkDSA's P rounds of messages tens of minutes)")
    p.add_argument("--teams_workers", type=csv(int), default=[12, 14, 1024])
    p.add_argument("--cluster", metavar="DIR",
                   help="a cluster_bench.py --out directory to predict")
    p.add_argument("--cluster_cores", type=int, default=os.cpu_count() or 1,
                   help="the cores of the machine that ran --cluster (its "
                   "workers' compute is scaled by P / cores; default: this "
                   "machine's)")
    p.add_argument("--case_timeout", type=int, default=3600)
    p.add_argument("--quick", action="store_true",
                   help="n = 1M, P up to 16, d for P = 12: a minute")
    args = p.parse_args()
    args.max_workers = {a: int(v) for a, v in
                        (item.split("=") for item in args.max_workers)}
    if args.quick:
        args.n = 1_000_000
        args.workers = [w for w in args.workers if w <= 16]
        args.teams_workers = [12]
    if not os.access(args.gradmesh, os.X_OK):
        sys.exit(f"sim_sweep: {args.gradmesh} is not an executable "
                 "(build the gradmesh target, or pass --gradmesh)")
    os.makedirs(args.out, exist_ok=True)
    sim = Sim(args)
    log("time against P")
    scaling = sweep_scaling(sim, args)
    log("time against d")
    teams = sweep_teams(sim, args)
    cluster = []
    if args.cluster:
        log(f"the emulated cluster's cases ({args.cluster})")
        cluster = cluster_rows(sim, args.cluster)
    with open(os.path.join(args.out, "sim.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "scaling": scaling,
                   "teams": teams, "cluster": cluster}, f, indent=1)
    text = markdown(args, scaling, teams, cluster)
    with open(os.path.join(args.out, "sim.md"), "w") as f:
        f.write(text)
    plot(args.out, scaling, teams, cluster)
    print(text)
    log(f"wrote {args.out}/sim.json, sim.md and the plots")


if __name__ == "__main__":
    main()
