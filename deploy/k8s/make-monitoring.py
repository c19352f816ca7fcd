#!/usr/bin/env python3
"""Prints the monitoring objects for a Kubernetes cluster that runs the
Prometheus Operator and Grafana's dashboard sidecar:

  - a PrometheusRule holding deploy/prometheus/rules/gradmesh.yml;
  - a ConfigMap per dashboard of dashboards/, labelled grafana_dashboard: "1"
    (the label the Grafana Helm chart's sidecar loads dashboards from).

    deploy/k8s/make-monitoring.py --namespace=gradmesh | kubectl apply -f -
"""

import argparse
import json
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def objects(namespace):
    with open(os.path.join(ROOT, "deploy", "prometheus", "rules",
                           "gradmesh.yml")) as f:
        rules = yaml.safe_load(f)
    yield {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "gradmesh", "namespace": namespace,
                        "labels": {"app.kubernetes.io/part-of": "gradmesh"}},
           "spec": rules}
    dashboards = os.path.join(ROOT, "dashboards")
    for name in sorted(os.listdir(dashboards)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(dashboards, name)) as f:
            board = json.load(f)
        yield {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": board["uid"], "namespace": namespace,
                            "labels": {"grafana_dashboard": "1",
                                       "app.kubernetes.io/part-of": "gradmesh"}},
               "data": {name: json.dumps(board, indent=1)}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", default="gradmesh")
    args = parser.parse_args()
    yaml.safe_dump_all(objects(args.namespace), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
