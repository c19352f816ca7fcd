"""Rendered Kustomize manifests, for the deployment tests.

    docs = render("deploy/k8s/overlays/cpu")   # raises RenderError
    for name, value, source in environment(docs, container): ...
"""

import re
import subprocess

import yaml


class RenderError(Exception):
    pass


def render(directory, timeout=60):
    """The objects `kubectl kustomize directory` prints."""
    run = subprocess.run(["kubectl", "kustomize", directory],
                         capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise RenderError(f"kubectl kustomize {directory}: {run.stderr}")
    return [d for d in yaml.safe_load_all(run.stdout) if d]


def find(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise KeyError(f"no {kind} {name}")


def environment(docs, container):
    """[(name, value, fieldPath)] in the order the kubelet sets them: the
    ConfigMaps of envFrom, then env. value is None for a fieldRef."""
    entries = []
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref:
            data = find(docs, "ConfigMap", ref["name"]).get("data", {})
            entries += [(k, v, None) for k, v in data.items()]
    for item in container.get("env", []):
        field = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        entries.append((item["name"], item.get("value"), field))
    return entries


def expand(entries, fields):
    """The values the process sees: fieldRefs from `fields`, $(VAR) replaced
    by what is defined before it (left as it is otherwise)."""
    env = {}
    for name, value, field in entries:
        if field is not None:
            env[name] = fields[field]
        else:
            env[name] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                               lambda m: env.get(m[1], m[0]), value or "")
    return env
