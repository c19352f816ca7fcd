#!/usr/bin/env python3
"""A real Prometheus scrapes a local gradmesh cluster under load.

    prometheus_test.py --gradmesh=BUILD/tools/gradmesh/gradmesh \
        --pythonpath=BUILD/client/python [--keep]

Checks, in order:
  1. `promtool check config` and `promtool check rules` pass on
     deploy/prometheus/;
  2. with `gradmesh run` training 3 copies of tests/deploy/workload.py, a
     Prometheus (scrape and rule evaluation every second, the production
     rules) answers every PromQL expression of the dashboards and of the
     rules with at least one series (the alerts' expressions are split at
     their comparisons and `and`s, and each side is asked);
  3. on the healthy cluster, the alerts of a fault stay quiet; after one
     worker is killed (SIGKILL), GradmeshWorkerDown fires for that worker
     and no other, and GradmeshMemberLost fires.
  The expressions are asked after the kill, so that the departures counter
  has a series.
The rules' `for:` durations are cut to 2 s for step 3, so that the test
does not wait a minute; the expressions are the production ones.
Exits 0 when every check passes, 1 otherwise (each failure on stderr).
"""

import argparse
import glob
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMETHEUS_DIR = os.path.join(ROOT, "deploy", "prometheus")
RULES = os.path.join(PROMETHEUS_DIR, "rules", "gradmesh.yml")
DASHBOARDS = os.path.join(ROOT, "dashboards")
sys.path.insert(0, DASHBOARDS)
import check_dashboards  # noqa: E402
import on_sigterm  # noqa: E402


def log(message):
    print(f"prometheus_test: {message}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


class Prometheus:
    def __init__(self, work, targets):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = os.path.join(work, "rules.yml")
        with open(RULES) as f:
            text = f.read()
        with open(rules, "w") as f:
            f.write(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 2s", text))
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            json.dump({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [rules],
                "scrape_configs": [
                    {"job_name": job, "static_configs": [{"targets": t}]}
                    for job, t in targets.items()],
            }, f)  # JSON is YAML
        self.log = open(os.path.join(work, "prometheus.log"), "w")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        STARTED.append(self.process)
        wait_for(self.ready, 30, "Prometheus to start")

    def ready(self):
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def get(self, path, **params):
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:  # 400: a bad expression
            return json.load(e)

    def query(self, expr):
        """(number of series, error or None)."""
        answer = self.get("/api/v1/query", query=expr)
        if answer.get("status") != "success":
            return 0, answer.get("error", "no answer")
        result = answer["data"]["result"]
        if answer["data"]["resultType"] == "scalar":
            return 1, None
        return len(result), None

    def firing(self, alert):
        answer = self.get("/api/v1/alerts")
        return [a["labels"] for a in answer["data"]["alerts"]
                if a["labels"]["alertname"] == alert and a["state"] == "firing"]

    def stop(self):
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


def split_top_level(expr):
    """An alert's expression cut at top-level comparisons and set
    operators (and, or, unless, with their on()/ignoring() clauses) into the
    expressions that must each have series."""
    pieces, depth, start, i = [], 0, 0, 0
    operator = re.compile(
        r"\s(==|!=|>=|<=|>|<|and|or|unless)(\s+bool)?"
        r"(\s+(on|ignoring)\s*\([^)]*\))?\s")
    while i < len(expr):
        c = expr[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == '"':
            i = expr.index('"', i + 1)
        elif depth == 0:
            m = operator.match(expr, i)
            if m:
                pieces.append(expr[start:i])
                start = i = m.end()
                continue
        i += 1
    pieces.append(expr[start:])
    out = []
    for piece in (p.strip() for p in pieces):
        absent = re.fullmatch(r"absent\((.*)\)", piece, re.S)
        if absent:  # empty while all is well: ask what it looks at
            out += split_top_level(absent[1])
        elif not re.fullmatch(r"[-+]?[0-9.e]+", piece):
            out.append(piece)
    return out


def rule_expressions():
    import yaml
    with open(RULES) as f:
        groups = yaml.safe_load(f)["groups"]
    exprs = []
    for group in groups:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            if "alert" not in rule:
                exprs.append((f"rule {name}", rule["expr"], True))
                continue
            # Quiet while all is well: it must parse; its parts have series.
            exprs.append((f"rule {name}", rule["expr"], False))
            for piece in split_top_level(rule["expr"]):
                exprs.append((f"rule {name} (part)", piece, True))
    return exprs


def dashboard_expressions(instance):
    """Every panel's and variable's expression, as Grafana would send it."""
    exprs = []
    for name in sorted(os.listdir(DASHBOARDS)):
        if name.endswith(".json"):
            _, found = check_dashboards.check(
                pathlib.Path(DASHBOARDS) / name)
            exprs += [(f"{name}: {title}",
                       check_dashboards.substitute(expr, instance), True)
                      for title, expr in found]
    return exprs


def check_static():
    failures = []
    for command in (
            ["promtool", "check", "config",
             os.path.join(PROMETHEUS_DIR, "prometheus.yml")],
            ["promtool", "check", "rules", RULES]):
        run = subprocess.run(command, capture_output=True, text=True)
        log(f"{' '.join(command[:3])}: "
            f"{'ok' if run.returncode == 0 else 'FAILED'}")
        if run.returncode != 0:
            failures.append(f"{' '.join(command)}:\n{run.stdout}{run.stderr}")
    return failures


# Process groups started here, killed on every exit path (SIGTERM included).
STARTED = []


def kill_started():
    for process in STARTED:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def start_cluster(args, work):
    """`gradmesh run` with the workload; returns (process, metrics ports)."""
    env = dict(os.environ, PYTHONPATH=args.pythonpath)
    output = open(os.path.join(work, "run.log"), "w+")
    process = subprocess.Popen(
        [args.gradmesh, "run", "--workers=3", "--algo=spardl",
         "--density=0.01", "--autotune_window=2",
         f"--work_dir={os.path.join(work, 'cluster')}", "--",
         "/usr/bin/python3",
         os.path.join(ROOT, "tests", "deploy", "workload.py"),
         work],
        stdout=output, stderr=subprocess.STDOUT, env=env,
        start_new_session=True)
    STARTED.append(process)

    def ports():
        output.seek(0)
        m = re.search(r"/metrics at http://127.0.0.1:(\d+)/metrics "
                      r"\(coordinator\), workers on ports ([\d, ]+)",
                      output.read())
        if process.poll() is not None:
            raise RuntimeError(f"gradmesh run exited early; see {output.name}")
        return m and (int(m[1]), [int(p) for p in m[2].split(",")])

    def trainers_ready():
        ports()  # raises once `gradmesh run` has ended
        return all(os.path.exists(os.path.join(work, f"rank{r}.ready"))
                   for r in range(3))

    coordinator, workers = wait_for(ports, 60, "the cluster")
    wait_for(trainers_ready, 60, "the trainers' first steps")
    return process, coordinator, workers


def check_expressions(prometheus, instance):
    exprs = rule_expressions() + dashboard_expressions(instance)
    log(f"asking Prometheus {len(exprs)} expressions")
    pending = {expr: where for where, expr, _ in exprs}
    needs_series = {expr for _, expr, needed in exprs if needed}
    errors = {}
    deadline = time.monotonic() + 60  # until windows and recordings fill
    while pending and time.monotonic() < deadline:
        for expr in list(pending):
            series, error = prometheus.query(expr)
            if error is not None:
                errors[expr] = error
                del pending[expr]
            elif series > 0 or expr not in needs_series:
                del pending[expr]
        if pending:
            time.sleep(2)
    failures = [f"{where}: no series: {e}" for e, where in pending.items()]
    failures += [f"invalid expression ({error}): {e}"
                 for e, error in errors.items()]
    log(f"{len(exprs) - len(failures)} of {len(exprs)} expressions "
        "returned series")
    return failures


def kill_worker(work, rank):
    with open(os.path.join(work, f"rank{rank}.worker")) as f:
        sock = f.read().strip()[len("unix:"):]
    pid = int(subprocess.run(
        ["pgrep", "-f", "--", f"--sdk_socket={sock}"], check=True,
        capture_output=True, text=True).stdout.split()[0])
    os.kill(pid, signal.SIGKILL)


# Alerts that must stay quiet on a healthy cluster (the others measure trends
# that a 2 s `for:` over a minute-old cluster cannot judge).
QUIET = ("GradmeshWorkerDown", "GradmeshCoordinatorDown",
         "GradmeshAllReduceErrors", "GradmeshMemberLost",
         "GradmeshMemberFlapping", "GradmeshLinkRemovals")


def check_quiet(prometheus, targets):
    # Prometheus's first scrapes may come seconds after its first rule
    # evaluation (target updates are batched), and absent() in
    # GradmeshCoordinatorDown is true until then: a start-up transient that
    # a 1m `for:` absorbs but the test's 2 s does not. So wait for every
    # target, then let the rules run past their 2 s `for:`.
    wait_for(lambda: prometheus.query("up == 1")[0] == targets, 30,
             f"all {targets} targets to be up")
    time.sleep(6)
    loud = {a: prometheus.firing(a) for a in QUIET}
    loud = {a: labels for a, labels in loud.items() if labels}
    log(f"healthy cluster: {', '.join(QUIET)} quiet" if not loud
        else f"healthy cluster, yet firing: {loud}")
    return [f"{a} fires on a healthy cluster: {labels}"
            for a, labels in loud.items()]


def check_worker_down(prometheus, work, workers):
    victim = f"127.0.0.1:{workers[1]}"
    kill_worker(work, 1)
    log(f"killed worker 1 ({victim}); waiting for GradmeshWorkerDown")
    start = time.monotonic()
    failures = []
    try:
        firing = wait_for(lambda: prometheus.firing("GradmeshWorkerDown"), 30,
                          "GradmeshWorkerDown to fire")
        log(f"GradmeshWorkerDown fired after {time.monotonic() - start:.1f} s "
            f"for {[a['instance'] for a in firing]}")
        if [a["instance"] for a in firing] != [victim]:
            failures.append(
                f"GradmeshWorkerDown fired for {firing}, expected {victim}")
        # The view lost a member: what catches a pod that vanished with its
        # scrape target.
        wait_for(lambda: prometheus.firing("GradmeshMemberLost"), 30,
                 "GradmeshMemberLost to fire")
        log(f"GradmeshMemberLost fired after {time.monotonic() - start:.1f} s")
    except TimeoutError as e:
        failures.append(str(e))
    return failures


def print_logs(work):
    """The ends of the run's and the cluster's logs, for a failure in CI
    (where the work directory is gone)."""
    logs = [os.path.join(work, "run.log")] + sorted(
        glob.glob(os.path.join(work, "cluster", "*.log")))
    for path in logs:
        with open(path, errors="replace") as f:
            tail = f.read()[-3000:]
        sys.stderr.write(f"--- {os.path.relpath(path, work)} (end)\n{tail}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gradmesh", required=True, help="the gradmesh CLI")
    parser.add_argument("--pythonpath", required=True,
                        help="where the gradmesh Python module is built")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, TSDB)")
    args = parser.parse_args()
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            print(f"prometheus_test: {tool} is not installed "
                  "(scripts/setup.sh installs it)", file=sys.stderr)
            return 1

    # SIGTERM (a stop by hand; ctest's timeout kills outright, so the
    # script's own deadlines stay under it): clean up as on any other exit.
    on_sigterm.exit_cleanly()
    failures = check_static()
    work = tempfile.mkdtemp(prefix="gradmesh-prometheus-")
    cluster = prometheus = None
    try:
        cluster, coordinator, workers = start_cluster(args, work)
        log(f"cluster up: coordinator /metrics on {coordinator}, "
            f"workers on {workers}")
        prometheus = Prometheus(work, {
            "gradmesh-coordinator": [f"127.0.0.1:{coordinator}"],
            "gradmesh-worker": [f"127.0.0.1:{p}" for p in workers]})
        failures += check_quiet(prometheus, 1 + len(workers))
        failures += check_worker_down(prometheus, work, workers)
        # After the kill, so that departures have a series too.
        failures += check_expressions(prometheus, f"127.0.0.1:{workers[0]}")
    except (TimeoutError, RuntimeError, OSError) as e:
        failures.append(str(e))
    finally:
        open(os.path.join(work, "stop"), "w").close()
        try:
            if prometheus is not None:
                prometheus.stop()
            if cluster is not None:
                code = cluster.wait(timeout=60)
                if code != 0:
                    failures.append(f"gradmesh run exited {code}")
        except subprocess.TimeoutExpired:
            failures.append("gradmesh run did not stop within 60 s")
        kill_started()
        if failures:
            print_logs(work)
        if args.keep or failures:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(f"prometheus_test: {'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
