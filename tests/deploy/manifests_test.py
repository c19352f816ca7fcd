#!/usr/bin/env python3
"""The deployment files agree with the binaries they deploy.

    manifests_test.py --bin-dir=BUILD   (gradmesh-worker, gradmesh-coordinator
                                          found under it)

Checks:
  - yamllint (the repository's .yamllint) passes on deploy/ and dashboards/;
  - `kubectl kustomize` renders every overlay and example;
  - in every rendered manifest and in the compose file, each GRADMESH_*
    variable a gradmesh container gets (env and ConfigMaps) names a flag in
    its binary's --help, and each $(VAR) it uses is defined before it;
  - ports agree: every listen address a container is given is one of its
    containerPorts, probes ask the health port, Services, PodMonitors and
    NetworkPolicies name ports the pods have;
  - peer names: the address a worker advertises is
    $(POD_NAME).<headless Service>.$(POD_NAMESPACE).svc.cluster.local at its
    peer port, with the StatefulSet's serviceName that headless Service
    selecting its pods, and the coordinator address it dials is the
    coordinator Service's name and port;
  - the gpu overlay asks for nvidia.com/gpu and spreads workers over nodes;
  - the dashboards pass dashboards/check_dashboards.py.
Exits 0 when all pass, 1 otherwise (each failure on stderr).
"""

import argparse
import os
import re
import subprocess
import sys

import yaml

from k8s_objects import RenderError, environment, image_environment, render

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
RENDERED = [os.path.join(K8S, "overlays", "cpu"),
            os.path.join(K8S, "overlays", "gpu"),
            os.path.join(K8S, "examples", "fashion-mnist")]
COMPOSE = os.path.join(ROOT, "deploy", "docker", "compose.yaml")
# Image name fragment -> (binary, environment prefix).
BINARIES = {"coordinator": ("gradmesh-coordinator", "GRADMESH_COORDINATOR_"),
            "worker": ("gradmesh-worker", "GRADMESH_WORKER_")}
LISTEN_FLAGS = ("listen", "metrics_listen", "health_listen", "sdk_listen")


class Checker:
    def __init__(self):
        self.failures = []
        self.checks = 0

    def expect(self, condition, message):
        self.checks += 1
        if not condition:
            self.failures.append(message)
        return condition


def find_binary(bin_dir, name):
    for directory, _, files in os.walk(bin_dir):
        if name in files:
            return os.path.join(directory, name)
    raise FileNotFoundError(f"{name} not found under {bin_dir}")


def flags_of(binary):
    text = subprocess.run([binary, "--help"], capture_output=True,
                          text=True, timeout=30).stdout
    flags = {f.replace("-", "_")
             for f in re.findall(r"^  --([a-z0-9-]+)=", text, re.M)}
    if not flags:
        raise RuntimeError(f"no flags in `{binary} --help`")
    return flags


def role_of(image):
    """'worker', 'coordinator' or None, from a gradmesh image's name."""
    m = re.match(r"(?:.*/)?gradmesh/(worker|coordinator)(?:-cuda)?(?::|$)",
                 image or "")
    return m and m[1]


def flag_of(variable, prefix):
    return variable[len(prefix):].lower() if variable.startswith(prefix) else None


def host_port(value):
    host, _, port = value.rpartition(":")
    return host, int(port) if port.isdigit() else None


class Manifests:
    """One rendered overlay, indexed."""

    def __init__(self, docs):
        self.docs = docs

    def of_kind(self, kind):
        return [d for d in self.docs if d["kind"] == kind]

    def workloads(self):
        return [d for d in self.docs
                if d["kind"] in ("Deployment", "StatefulSet", "Job")]


def check_environment(c, where, env, flags, prefix):
    defined = set()
    values = {}
    for name, value in env:
        if name.startswith("GRADMESH_"):
            flag = flag_of(name, prefix)
            other = name.startswith("GRADMESH_WORKER_") or name.startswith(
                "GRADMESH_COORDINATOR_")
            if flag is not None:
                c.expect(flag in flags,
                         f"{where}: {name}: no --{flag} in the binary's --help")
            elif not other:
                c.expect(False, f"{where}: {name} is read by no gradmesh binary")
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value or ""):
            c.expect(ref in defined,
                     f"{where}: {name} uses $({ref}) before it is defined")
        defined.add(name)
        values[name] = value
    return values


def check_ports(c, where, container, values, prefix):
    ports = {p["containerPort"]: p.get("name")
             for p in container.get("ports", [])}
    for flag in LISTEN_FLAGS:
        value = values.get(prefix + flag.upper())
        if value:
            _, port = host_port(value)
            c.expect(port in ports,
                     f"{where}: --{flag}={value}: port not a containerPort")
    health = values.get(prefix + "HEALTH_LISTEN")
    for probe in ("readinessProbe", "livenessProbe"):
        spec = container.get(probe)
        if c.expect(spec and "grpc" in spec, f"{where}: no grpc {probe}"):
            c.expect(health and spec["grpc"]["port"] == host_port(health)[1],
                     f"{where}: {probe} asks port {spec['grpc']['port']}, "
                     f"not --health_listen ({health})")
    return ports


def check_mounts(c, where, pod, container, values, prefix):
    volumes = {v["name"] for v in pod.get("volumes", [])}
    mounts = container.get("volumeMounts", [])
    for m in mounts:
        c.expect(m["name"] in volumes, f"{where}: mount {m['name']} has no volume")
    for flag in ("tls_ca", "tls_cert", "tls_key", "sdk_token_file",
                 "sdk_socket"):
        path = values.get(prefix + flag.upper())
        if path:
            c.expect(any(path.startswith(m["mountPath"] + "/") for m in mounts),
                     f"{where}: --{flag}={path} is on no mounted volume")


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v
                                  for k, v in selector.items())


def check_services(c, name, m, pods):
    """pods: [(workload, pod labels, {port: port name})]."""
    for svc in m.of_kind("Service"):
        where = f"{name}: Service {svc['metadata']['name']}"
        chosen = [p for p in pods if selects(svc["spec"].get("selector"), p[1])]
        if not c.expect(chosen, f"{where} selects no pod"):
            continue
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for workload, _, ports in chosen:
                c.expect(target in ports.values() or target in ports,
                         f"{where}: targetPort {target} is no port of "
                         f"{workload}")
    for policy in m.of_kind("NetworkPolicy"):
        where = f"{name}: NetworkPolicy {policy['metadata']['name']}"
        chosen = [p for p in pods
                  if selects(policy["spec"]["podSelector"]["matchLabels"], p[1])]
        if not c.expect(chosen, f"{where} selects no pod"):
            continue
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                for workload, _, ports in chosen:
                    c.expect(port["port"] in ports or port["port"] in
                             ports.values(),
                             f"{where}: port {port['port']} is no port of "
                             f"{workload}")
    for monitor in m.of_kind("PodMonitor"):
        where = f"{name}: PodMonitor {monitor['metadata']['name']}"
        chosen = [p for p in pods
                  if selects(monitor["spec"]["selector"]["matchLabels"], p[1])]
        c.expect(len(chosen) >= 2, f"{where} selects {len(chosen)} workloads")
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            for workload, _, ports in chosen:
                c.expect(endpoint["port"] in ports.values(),
                         f"{where}: port {endpoint['port']} not on {workload}")


def check_peer_names(c, name, m, worker_values):
    def worker_container(sts):
        for container in sts["spec"]["template"]["spec"]["containers"]:
            if role_of(container.get("image")) == "worker":
                return container
        return None

    sets = [d for d in m.of_kind("StatefulSet") if worker_container(d)]
    if not c.expect(len(sets) == 1, f"{name}: {len(sets)} worker StatefulSets"):
        return
    sts = sets[0]
    service_name = sts["spec"]["serviceName"]
    services = {s["metadata"]["name"]: s for s in m.of_kind("Service")}
    headless = services.get(service_name)
    labels = sts["spec"]["template"]["metadata"]["labels"]
    c.expect(headless is not None and headless["spec"].get("clusterIP") == "None"
             and selects(headless["spec"]["selector"], labels),
             f"{name}: serviceName {service_name} is no headless Service "
             "selecting the workers")
    c.expect(headless is not None and
             headless["spec"].get("publishNotReadyAddresses") is True,
             f"{name}: the headless Service must publish members not ready "
             "yet (peers dial them as soon as they are in a view)")
    env = {e["name"]: e for e in worker_container(sts)["env"]}
    for var, field in (("POD_NAME", "metadata.name"),
                       ("POD_NAMESPACE", "metadata.namespace")):
        c.expect(env.get(var, {}).get("valueFrom", {}).get("fieldRef", {})
                 .get("fieldPath") == field, f"{name}: {var} is not {field}")
    listen_port = host_port(worker_values["GRADMESH_WORKER_LISTEN"])[1]
    expected = (f"$(POD_NAME).{service_name}.$(POD_NAMESPACE)"
                f".svc.cluster.local:{listen_port}")
    c.expect(worker_values.get("GRADMESH_WORKER_ADVERTISE") == expected,
             f"{name}: workers advertise "
             f"{worker_values.get('GRADMESH_WORKER_ADVERTISE')}, the "
             f"StatefulSet's DNS names are {expected}")
    host, port = host_port(worker_values["GRADMESH_WORKER_COORDINATOR"])
    svc_name = host.split(".")[0]
    svc = services.get(svc_name)
    c.expect(svc is not None and host in (
        svc_name, f"{svc_name}.$(POD_NAMESPACE).svc.cluster.local"),
        f"{name}: the coordinator address {host} is no Service's name")
    if svc is not None:
        c.expect(any(p["port"] == port for p in svc["spec"]["ports"]),
                 f"{name}: Service {svc_name} has no port {port}")


def check_rendered(c, name, docs, binaries):
    m = Manifests(docs)
    pods = []
    worker_values = None
    for workload in m.workloads():
        pod = workload["spec"]["template"]["spec"]
        labels = workload["spec"]["template"]["metadata"].get("labels", {})
        all_ports = {}
        for container in pod["containers"] + pod.get("initContainers", []):
            where = (f"{name}: {workload['kind']} "
                     f"{workload['metadata']['name']}/{container['name']}")
            all_ports.update({p["containerPort"]: p.get("name")
                              for p in container.get("ports", [])})
            role = role_of(container.get("image"))
            if role is None:
                continue
            flags, prefix = binaries[role]
            entries = [(n, v) for n, v, _ in environment(docs, container)]
            values = check_environment(c, where, entries, flags, prefix)
            check_ports(c, where, container, values, prefix)
            check_mounts(c, where, pod, container, values, prefix)
            if role == "worker":
                worker_values = values
        pods.append((workload["metadata"]["name"], labels, all_ports))
    check_services(c, name, m, pods)
    if c.expect(worker_values is not None, f"{name}: no worker container"):
        check_peer_names(c, name, m, worker_values)
    if name.endswith("gpu"):
        sts = [d for d in m.of_kind("StatefulSet")][0]["spec"]["template"]
        worker = [w for w in sts["spec"]["containers"] if w["name"] == "worker"]
        limits = worker[0].get("resources", {}).get("limits", {})
        c.expect(limits.get("nvidia.com/gpu") == 1,
                 f"{name}: the worker's limits ask no nvidia.com/gpu: {limits}")
        anti = sts["spec"].get("affinity", {}).get("podAntiAffinity", {})
        c.expect(any(t.get("topologyKey") == "kubernetes.io/hostname"
                     for t in anti.get(
                         "requiredDuringSchedulingIgnoredDuringExecution", [])),
                 f"{name}: workers are not spread one per node")


def check_compose(c, binaries):
    if not c.expect(os.path.exists(COMPOSE), f"no {COMPOSE}"):
        return
    with open(COMPOSE) as f:
        compose = yaml.safe_load(f)
    for service_name, service in compose["services"].items():
        role = role_of(service.get("image"))
        if role is None:
            continue
        flags, prefix = binaries[role]
        env = service.get("environment", {})
        if isinstance(env, list):
            env = dict(e.split("=", 1) for e in env)
        check_environment(c, f"compose {service_name}",
                          [(k, str(v)) for k, v in env.items()], flags, prefix)
        for flag in LISTEN_FLAGS:
            value = env.get(prefix + flag.upper())
            if value and flag != "listen":
                c.expect(host_port(value)[1] is not None,
                         f"compose {service_name}: --{flag}={value}")


def check_secrets_and_monitoring(c, docs):
    """make-secrets.sh gives the Secrets and keys the pods mount and read;
    make-monitoring.py wraps the rules and dashboards unchanged."""
    run = subprocess.run(["bash", os.path.join(K8S, "make-secrets.sh"), "ns"],
                         capture_output=True, text=True, timeout=60)
    if not c.expect(run.returncode == 0, f"make-secrets.sh: {run.stderr}"):
        return
    secrets = {d["metadata"]["name"]: set(d["data"])
               for d in yaml.safe_load_all(run.stdout) if d}
    for workload in docs:
        if workload["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v["secret"]["secretName"]
                   for v in pod.get("volumes", []) if "secret" in v}
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in volumes:
                    continue
                secret = volumes[mount["name"]]
                if not c.expect(secret in secrets,
                                f"make-secrets.sh makes no Secret {secret}"):
                    continue
                for item in container.get("env", []):
                    value = item.get("value") or ""
                    if value.startswith(mount["mountPath"] + "/"):
                        key = value[len(mount["mountPath"]) + 1:]
                        c.expect(key in secrets[secret],
                                 f"{item['name']}: Secret {secret} has no "
                                 f"key {key}")
    run = subprocess.run([sys.executable, os.path.join(K8S, "make-monitoring.py")],
                         capture_output=True, text=True, timeout=60)
    if not c.expect(run.returncode == 0, f"make-monitoring.py: {run.stderr}"):
        return
    made = list(yaml.safe_load_all(run.stdout))
    with open(os.path.join(ROOT, "deploy", "prometheus", "rules",
                           "gradmesh.yml")) as f:
        rules = yaml.safe_load(f)
    c.expect(any(d["kind"] == "PrometheusRule" and d["spec"] == rules
                 for d in made), "make-monitoring.py: no PrometheusRule "
             "equal to the rules")
    boards = [n for n in os.listdir(os.path.join(ROOT, "dashboards"))
              if n.endswith(".json")]
    for name in boards:
        c.expect(any(d["kind"] == "ConfigMap" and name in d.get("data", {})
                     and d["metadata"]["labels"].get("grafana_dashboard") == "1"
                     for d in made),
                 f"make-monitoring.py: no dashboard ConfigMap for {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True,
                        help="build directory holding the binaries")
    args = parser.parse_args()
    c = Checker()
    binaries = {role: (flags_of(find_binary(args.bin_dir, binary)), prefix)
                for role, (binary, prefix) in BINARIES.items()}

    lint = subprocess.run(["yamllint", "-s", "-c", os.path.join(ROOT, ".yamllint"),
                           os.path.join(ROOT, "deploy"),
                           os.path.join(ROOT, "dashboards")],
                          capture_output=True, text=True, timeout=60)
    c.expect(lint.returncode == 0, f"yamllint:\n{lint.stdout}{lint.stderr}")
    for directory in RENDERED:
        name = os.path.relpath(directory, K8S)
        try:
            docs = render(directory)
            if name.startswith("overlays/"):
                docs += render(os.path.join(K8S, "monitoring"))
        except RenderError as e:
            docs, error = None, str(e)
        if c.expect(docs is not None, error if docs is None else ""):
            check_rendered(c, name, docs, binaries)
            if name == "overlays/cpu":
                check_secrets_and_monitoring(c, docs)
            print(f"manifests_test: {name}: {len(docs)} objects rendered")
    check_compose(c, binaries)
    dockerfile = os.path.join(ROOT, "deploy", "docker", "Dockerfile")
    for role, (flags, prefix) in binaries.items():
        image = image_environment(dockerfile, role)
        check_environment(c, f"Dockerfile {role}", list(image.items()), flags,
                          prefix)
    dashboards = subprocess.run(
        [sys.executable, os.path.join(ROOT, "dashboards", "check_dashboards.py")],
        capture_output=True, text=True, timeout=60)
    c.expect(dashboards.returncode == 0,
             f"check_dashboards.py:\n{dashboards.stdout}{dashboards.stderr}")

    for failure in c.failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(f"manifests_test: {c.checks - len(c.failures)} passed, "
          f"{len(c.failures)} failed")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
