#!/usr/bin/env python3
"""The Kubernetes manifests' environment on emulated pods: one network
namespace per pod, names resolved as the cluster DNS would.

    sudo k8s_netns_test.py --bin-dir=BUILD [--overlay=cpu] [--keep]

Renders deploy/k8s/overlays/OVERLAY and deploy/k8s/examples/fashion-mnist,
then, with no flag of its own, runs:
  - the coordinator Deployment's container and every replica of the worker
    StatefulSet, each in its own namespace with the environment of its image
    (the Dockerfile's ENV) and of the manifests over it (ConfigMap,
    fieldRefs, $(VAR) expansion), as the pod's
    user and groups (securityContext), and its volumes (Secrets from
    deploy/k8s/make-secrets.sh's certificate shape, one wildcard certificate
    for the workers and the coordinator, with the volume's mode and fsGroup;
    emptyDirs as directories of the fsGroup);
  - the pods' readiness probes (`gradmesh health`, as the kubelet asks) until
    every pod is ready;
  - beside each worker, the training script of the example's trainer
    container with that container's environment and mounts, from this tree
    (the image runs it from /usr/share/gradmesh/examples) and on a slice of
    Fashion-MNIST for one epoch; then checks that every rank holds bitwise
    the same parameters.
Not emulated: the read-only root file system and dropped capabilities.
Exits 0 when it all works, 1 with the reason otherwise, 77 (skipped) when
not root. Everything it creates (namespaces gmk*, bridge gmkbr0,
/etc/netns/gmk*) it removes on exit.
"""

import argparse
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from netns_hosts import Hosts  # noqa: E402
import k8s_objects  # noqa: E402
import on_sigterm  # noqa: E402
from k8s_objects import expand, find, render  # noqa: E402

K8S = os.path.join(ROOT, "deploy", "k8s")
EXAMPLE = os.path.join(K8S, "examples", "fashion-mnist")
DOCKERFILE = os.path.join(ROOT, "deploy", "docker", "Dockerfile")
SKIPPED = 77


def log(message):
    print(f"k8s_netns_test: {message}", flush=True)


def container(workload, name):
    for c in workload["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise KeyError(f"no container {name}")


def environment(docs, c, pod_name, namespace):
    """The container's environment as the kubelet builds it."""
    return expand(k8s_objects.environment(docs, c),
                  {"metadata.name": pod_name, "metadata.namespace": namespace})


class Pod:
    """One emulated pod: a namespace, its volumes as directories, its
    processes run as the pod's securityContext says (user, group, fsGroup)."""
    started = []  # every process of every pod, killed on exit

    def __init__(self, name, netns, ip, work, workload):
        self.name, self.netns, self.ip = name, netns, ip
        security = workload["spec"]["template"]["spec"].get(
            "securityContext", {})
        self.uid = security.get("runAsUser", 0)
        self.gid = security.get("runAsGroup", self.uid)
        self.fs_group = security.get("fsGroup", self.gid)
        self.dir = os.path.join(work, "pods", name)
        os.makedirs(self.dir)
        os.chown(self.dir, self.uid, self.fs_group)

    def mounts(self, workload, c, secrets):
        """mountPath -> directory here."""
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]
                   .get("volumes", [])}
        mapped = {}
        for mount in c.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "secret" in volume:
                path = secrets[volume["secret"]["secretName"]]
                for name in os.listdir(path):  # as the kubelet projects them
                    os.chown(os.path.join(path, name), 0, self.fs_group)
                    os.chmod(os.path.join(path, name),
                             volume["secret"].get("defaultMode", 0o644))
                mapped[mount["mountPath"]] = path
            elif volume.get("emptyDir", {}).get("medium") == "Memory":
                continue  # /dev/shm: this machine's, as the pod's would be
            else:
                path = os.path.join(self.dir, mount["name"])
                os.makedirs(path, exist_ok=True)
                os.chown(path, 0, self.fs_group)
                os.chmod(path, 0o2775)  # an fsGroup emptyDir
                mapped[mount["mountPath"]] = path
        return mapped

    def start(self, command, env, log_name):
        out = open(os.path.join(self.dir, log_name), "w")
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "setpriv",
             f"--reuid={self.uid}", f"--regid={self.gid}",
             f"--groups={self.fs_group}", "--"] + command,
            env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
        Pod.started.append(process)
        return process


def remap(env, mounts):
    """Paths under a mountPath point at the pod's directory instead."""
    out = {}
    for name, value in env.items():
        for path, here in mounts.items():
            if value.startswith(path + "/"):
                value = here + value[len(path):]
            elif value.startswith("unix:" + path + "/"):
                value = "unix:" + here + value[len("unix:") + len(path):]
        out[name] = value
    return out


def make_secrets(work, namespace):
    """The Secrets of deploy/k8s/make-secrets.sh, as directories."""
    certs = os.path.join(work, "certs")
    suffix = f"{namespace}.svc.cluster.local"
    subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "make-test-certs.sh"), certs,
         f"cluster=*.gradmesh-worker.{suffix},gradmesh-coordinator.{suffix}"],
        check=True, capture_output=True, timeout=60)
    tls = os.path.join(work, "secrets", "gradmesh-tls")
    os.makedirs(tls)
    for src, dst in (("ca.pem", "ca.crt"), ("cluster.pem", "tls.crt"),
                     ("cluster.key", "tls.key")):
        shutil.copy(os.path.join(certs, src), os.path.join(tls, dst))
    return {"gradmesh-tls": tls}


def write_hosts_files(hosts, names):
    """/etc/netns/NS/hosts: what `ip netns exec` shows as /etc/hosts there,
    with every pod's and Service's cluster DNS name."""
    lines = ["127.0.0.1 localhost"] + [f"{ip} {name}" for name, ip in names]
    for ns in hosts.names:
        os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
        with open(f"/etc/netns/{ns}/hosts", "w") as f:
            f.write("\n".join(lines) + "\n")


def remove_hosts_files(hosts):
    for ns in hosts.names:
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def probe(binary, pod, spec):
    grpc = spec["grpc"]
    command = ["ip", "netns", "exec", pod.netns, binary, "health",
               f"--address=127.0.0.1:{grpc['port']}",
               f"--service={grpc.get('service', '')}", "--probe_timeout_ms=1000"]
    try:
        return subprocess.run(command, capture_output=True, text=True,
                              timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def wait_ready(binary, pods_probes, timeout):
    deadline = time.monotonic() + timeout
    waiting = list(pods_probes)
    while waiting and time.monotonic() < deadline:
        for pod, process, spec in list(waiting):
            if process.poll() is not None:
                raise RuntimeError(f"{pod.name} exited with {process.returncode}"
                                   f"; log in {pod.dir}")
            if probe(binary, pod, spec):
                waiting.remove((pod, process, spec))
        time.sleep(0.5)
    if waiting:
        raise RuntimeError("not ready within "
                           f"{timeout} s: {[p.name for p, _, _ in waiting]}")


def run_emulation(args, work, hosts):
    docs = render(os.path.join(K8S, "overlays", args.overlay))
    example = render(EXAMPLE)
    sts = find(docs, "StatefulSet", "gradmesh-worker")
    deployment = find(docs, "Deployment", "gradmesh-coordinator")
    namespace = sts["metadata"]["namespace"]
    service = sts["spec"]["serviceName"]
    replicas = sts["spec"]["replicas"]
    binary = {name: os.path.join(args.bin_dir, path) for name, path in (
        ("gradmesh-coordinator", "server/gradmesh-coordinator"),
        ("gradmesh-worker", "worker/daemon/gradmesh-worker"),
        ("gradmesh", "tools/gradmesh/gradmesh"))}
    secrets = make_secrets(work, namespace)

    coordinator_pod = Pod("gradmesh-coordinator-0", hosts.names[0],
                          hosts.ips[0], work, deployment)
    workers = [Pod(f"{sts['metadata']['name']}-{i}", hosts.names[i + 1],
                   hosts.ips[i + 1], work, sts) for i in range(replicas)]
    write_hosts_files(hosts, [(f"gradmesh-coordinator.{namespace}.svc.cluster.local",
                               coordinator_pod.ip)] +
                      [(f"{w.name}.{service}.{namespace}.svc.cluster.local", w.ip)
                       for w in workers])
    base_env = {"PATH": "/usr/bin:/bin"}
    started = []
    for pod, workload, name, program in (
            [(coordinator_pod, deployment, "coordinator", "gradmesh-coordinator")]
            + [(w, sts, "worker", "gradmesh-worker") for w in workers]):
        c = container(workload, name)
        image = k8s_objects.image_environment(DOCKERFILE, name)
        env = remap(dict(image, **environment(docs, c, pod.name, namespace)),
                    pod.mounts(workload, c, secrets))
        process = pod.start([binary[program]], dict(base_env, **env),
                            f"{name}.log")
        started.append((pod, process, c["readinessProbe"]))
        started.append((pod, process, c["livenessProbe"]))
    log(f"started the coordinator and {replicas} workers in namespaces "
        f"{hosts.names[0]}..{hosts.names[-1]}, environment from the manifests")
    start = time.monotonic()
    wait_ready(binary["gradmesh"], started, 60)
    log(f"every pod live and ready after {time.monotonic() - start:.1f} s")

    trainer_sts = find(example, "StatefulSet", "gradmesh-worker")
    trainer = container(trainer_sts, "trainer")
    trainers = []
    for w in workers:
        image = k8s_objects.image_environment(DOCKERFILE, "trainer")
        env = remap(dict(image, **environment(example, trainer, w.name,
                                              namespace)),
                    w.mounts(trainer_sts, trainer, secrets))
        env = dict(base_env, PYTHONPATH=args.pythonpath, HOME=w.dir, **env)
        out = os.path.join(w.dir, "run.json")
        trainers.append((w, out, w.start(
            ["/usr/bin/python3",
             os.path.join(ROOT, "client", "python", "examples", "fashion_mnist.py"),
             "--epochs=1", "--train-limit=512", "--test-limit=256",
             f"--out={out}"], env, "trainer.log")))
    log(f"started {len(trainers)} trainers with the example's environment")
    deadline = time.monotonic() + args.timeout
    hashes = []
    for w, out, process in trainers:
        try:
            code = process.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"training took over {args.timeout} s")
        if code != 0:
            raise RuntimeError(f"the trainer in {w.name} exited with {code}; "
                               f"log in {w.dir}/trainer.log")
        for name in os.listdir(w.dir):
            if name.endswith(".sha256"):
                with open(os.path.join(w.dir, name)) as f:
                    hashes.append(f.read().strip())
    if len(hashes) != replicas or len(set(hashes)) != 1:
        raise RuntimeError(f"expected {replicas} equal parameter hashes, "
                           f"got {hashes}")
    with open(os.path.join(workers[0].dir, "run.json")) as f:
        summary = json.load(f)
    log(f"trained one epoch ({summary['steps']} steps, {summary['algorithm']} "
        f"d={summary['teams']}) on {replicas} emulated pods; every rank holds "
        f"parameters {hashes[0][:16]}...")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True, help="the build directory")
    parser.add_argument("--pythonpath", default=None,
                        help="the built Python module (default: "
                             "BIN_DIR/client/python)")
    parser.add_argument("--overlay", default="cpu")
    parser.add_argument("--timeout", type=int, default=300,
                        help="seconds the training may take")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs)")
    args = parser.parse_args()
    args.pythonpath = args.pythonpath or os.path.join(args.bin_dir, "client",
                                                      "python")
    # SIGTERM (a stop by hand; ctest's timeout kills outright, so the
    # script's own deadlines stay under it): clean up as on any other exit.
    on_sigterm.exit_cleanly()
    if os.geteuid() != 0:
        print("k8s_netns_test: skipped: network namespaces need root")
        return SKIPPED
    replicas = find(render(os.path.join(K8S, "overlays", args.overlay)),
                    "StatefulSet", "gradmesh-worker")["spec"]["replicas"]
    hosts = Hosts(replicas + 1, prefix="gmk", subnet="10.79.0",
                  bridge="gmkbr0", veth="gmkv")
    work = tempfile.mkdtemp(prefix="gradmesh-k8s-")
    os.chmod(work, 0o755)  # the pods' users reach their directories
    failed = None
    try:
        hosts.create()
        run_emulation(args, work, hosts)
    except (RuntimeError, subprocess.SubprocessError, KeyError, OSError,
            k8s_objects.RenderError) as e:
        failed = str(e)
    finally:
        for process in Pod.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        hosts.remove_all()
        remove_hosts_files(hosts)
        if failed or args.keep:
            log(f"logs kept in {work}")
            for name in ("coordinator.log", "worker.log", "trainer.log"):
                for log_path in sorted(
                        os.path.join(d, name) for d, _, f in os.walk(work)
                        if name in f)[:2]:
                    with open(log_path) as f:
                        sys.stderr.write(f"--- {log_path}\n{f.read()[-1500:]}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        print(f"k8s_netns_test: FAILED: {failed}", file=sys.stderr)
        return 1
    print("k8s_netns_test: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
