"""Rendered Kustomize manifests, for the deployment tests.

    docs = render("deploy/k8s/overlays/cpu")   # raises RenderError
    for name, value, source in environment(docs, container): ...
"""

import re
import shlex
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


def image_environment(dockerfile, stage):
    """The ENV a stage of `dockerfile` sets, its parent stages' first: what
    a container of that image starts with, before the pod's env."""
    stages, current, text = {}, None, ""
    with open(dockerfile) as f:
        for line in f.read().replace("\\\n", " ").splitlines():
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "FROM":
                current = words[3] if len(words) > 3 else words[1]
                stages[current] = (words[1], {})
            elif words[0] == "ENV" and current is not None:
                for pair in shlex.split(line[len("ENV"):]):
                    name, _, value = pair.partition("=")
                    stages[current][1][name] = value
    env, chain = {}, []
    while stage in stages:
        chain.append(stages[stage][1])
        stage = stages[stage][0]
    for layer in reversed(chain):
        env.update(layer)
    return env
