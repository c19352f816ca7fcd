#!/usr/bin/env python3
"""Static checks of the Grafana dashboards in this directory.

For each dashboard JSON (by default every *.json next to this script):
  - the file parses, and has a uid, a title and schemaVersion;
  - panel ids are unique (rows included) and every panel has a gridPos
    (h, w, x, y, within the 24-column grid);
  - every panel other than a row has a title, a description, the datasource
    {"type": "prometheus", "uid": "prometheus"}, a unit
    (fieldConfig.defaults.unit) and at least one target;
  - every target has the same datasource, a refId unique in its panel, a
    non-empty expr and a legendFormat;
  - every templating variable of type query uses that datasource and has a
    query.

--list prints every expression (panel targets and templating queries), one
per line as "FILE<TAB>PANEL<TAB>EXPR", after substituting the Grafana
variables the way the Prometheus test does ($__rate_interval -> 30s,
$__interval -> 15s, $__range -> 5m, $instance -> --instance).

--promtool also has promtool (if on PATH) parse every substituted
expression, by checking them as recording rules.

Exit status 0 when every check passes, 1 otherwise (problems on stderr).
Needs only the Python standard library (promtool for --promtool).
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
SUBSTITUTIONS = (
    ("$__rate_interval", "30s"),
    ("$__interval", "15s"),
    ("$__range", "5m"),
)


def walk_panels(panels):
    """Yields every panel, descending into rows' nested panels."""
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def substitute(expr, instance):
    for var, value in SUBSTITUTIONS:
        expr = expr.replace(var, value)
    expr = re.sub(r"\$\{instance(:[a-z]+)?\}|\$instance\b", instance, expr)
    return expr


def template_query(variable):
    """The PromQL of a query variable (label_values(m, l) -> m)."""
    query = variable.get("query")
    if isinstance(query, dict):
        query = query.get("query", "")
    query = query or ""
    match = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)\s*",
                         query)
    if match:
        return match.group(1)
    match = re.fullmatch(r"\s*query_result\((.*)\)\s*", query)
    return match.group(1) if match else query


def check(path):
    """Returns (problems, [(panel title, expr)])."""
    problems = []
    exprs = []

    def problem(where, text):
        problems.append(f"{path.name}: {where}: {text}")

    try:
        board = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return [f"{path.name}: does not parse: {e}"], []
    for key in ("uid", "title", "schemaVersion"):
        if not board.get(key):
            problem("dashboard", f"no {key}")
    ids = {}
    for panel in walk_panels(board.get("panels", [])):
        title = panel.get("title") or f"panel id {panel.get('id')}"
        where = f"panel '{title}'"
        pid = panel.get("id")
        if not isinstance(pid, int):
            problem(where, "no integer id")
        elif pid in ids:
            problem(where, f"id {pid} also used by '{ids[pid]}'")
        else:
            ids[pid] = title
        grid = panel.get("gridPos")
        if not isinstance(grid, dict) or any(
                not isinstance(grid.get(k), int) for k in "hwxy"):
            problem(where, "no gridPos with integer h, w, x, y")
        elif grid["x"] < 0 or grid["w"] <= 0 or grid["x"] + grid["w"] > 24:
            problem(where, f"gridPos outside the 24 columns: {grid}")
        if panel.get("type") == "row":
            if not panel.get("title"):
                problem(where, "row without a title")
            continue
        if not panel.get("title"):
            problem(where, "no title")
        if not panel.get("description"):
            problem(where, "no description")
        if panel.get("datasource") != DATASOURCE:
            problem(where, f"datasource is not {DATASOURCE}")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if not unit:
            problem(where, "no fieldConfig.defaults.unit")
        targets = panel.get("targets") or []
        if not targets:
            problem(where, "no targets")
        ref_ids = set()
        for i, target in enumerate(targets):
            twhere = f"{where} target {target.get('refId', i)}"
            if target.get("datasource") != DATASOURCE:
                problem(twhere, f"datasource is not {DATASOURCE}")
            ref_id = target.get("refId")
            if not ref_id or ref_id in ref_ids:
                problem(twhere, "missing or repeated refId")
            ref_ids.add(ref_id)
            expr = target.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                problem(twhere, "no expr")
            else:
                exprs.append((title, expr))
            if not isinstance(target.get("legendFormat"), str) or not target[
                    "legendFormat"]:
                problem(twhere, "no legendFormat")
    for variable in board.get("templating", {}).get("list", []):
        where = f"variable '{variable.get('name')}'"
        if variable.get("type") != "query":
            continue
        if variable.get("datasource") != DATASOURCE:
            problem(where, f"datasource is not {DATASOURCE}")
        query = template_query(variable)
        if not query.strip():
            problem(where, "no query")
        else:
            exprs.append((f"${variable.get('name')}", query))
    return problems, exprs


def promtool_check(all_exprs):
    """Problems promtool finds parsing the expressions."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return ["--promtool: promtool is not on PATH"]
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, (name, title, expr) in enumerate(all_exprs):
            rules = os.path.join(tmp, f"r{n}.yml")
            with open(rules, "w") as f:
                # JSON is YAML: no quoting trouble.
                json.dump({"groups": [{"name": "check", "rules": [
                    {"record": "check:expr", "expr": expr}]}]}, f)
            run = subprocess.run([promtool, "check", "rules", rules],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                problems.append(f"{name}: panel '{title}': promtool: "
                                f"{(run.stdout + run.stderr).strip()}\n"
                                f"  expr: {expr}")
    return problems


def main():
    here = pathlib.Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Checks: parse; uid/title/schemaVersion; unique panel ids and "
        "gridPos; title, description, Prometheus datasource uid "
        "'prometheus', unit and targets on every non-row panel; expr and "
        "legendFormat on every target; datasource and query on query "
        "variables.")
    parser.add_argument("files", nargs="*", type=pathlib.Path,
                        help="dashboard JSON files (default: *.json in "
                        f"{here})")
    parser.add_argument("--list", action="store_true",
                        help="print every expression, variables substituted")
    parser.add_argument("--instance", default=".+",
                        help="what $instance becomes in --list and "
                        "--promtool (default: .+)")
    parser.add_argument("--promtool", action="store_true",
                        help="parse every expression with promtool")
    args = parser.parse_args()
    files = args.files or sorted(here.glob("*.json"))
    if not files:
        print("no dashboard files", file=sys.stderr)
        return 1
    problems = []
    all_exprs = []
    for path in files:
        found, exprs = check(path)
        problems += found
        all_exprs += [(path.name, title, substitute(expr, args.instance))
                      for title, expr in exprs]
    if args.promtool:
        problems += promtool_check(all_exprs)
    if args.list:
        for name, title, expr in all_exprs:
            print(f"{name}\t{title}\t{expr}")
    for p in problems:
        print(p, file=sys.stderr)
    if not args.list:
        print(f"{len(files)} dashboards, {len(all_exprs)} expressions: "
              f"{'OK' if not problems else f'{len(problems)} problems'}",
              file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
