"""Emulated hosts: network namespaces on a bridge, each joined by a veth pair
that tc's tbf may shape. Used by the cluster benchmark and by the test that
runs the Kubernetes manifests' environment on emulated pods.

    hosts = Hosts(4, prefix="gmb", subnet="10.77.0", bridge="gmbr0")
    hosts.create()            # gmb0..gmb3 at 10.77.0.1..4, bridge .254
    hosts.shape("1gbit")
    ...
    hosts.remove_all()        # also kills what still runs inside

Needs root.
"""

import os
import signal
import subprocess
import sys
import time


def run(cmd, check=True, **kwargs):
    """A short setup command (ip, tc)."""
    return subprocess.run(cmd, check=check, text=True, capture_output=True,
                          timeout=60, **kwargs)


class Hosts:
    """`count` network namespaces PREFIX0.. at SUBNET.1.. on a bridge (at
    SUBNET.254), with veths VETH0.. outside; shaped by tbf on request."""

    def __init__(self, count, prefix="gmb", subnet="10.77.0", bridge="gmbr0",
                 veth="gmv"):
        self.count = count
        self.prefix, self.subnet, self.bridge, self.veth = (
            prefix, subnet, bridge, veth)
        self.bridge_ip = f"{subnet}.254"
        self.names = [f"{prefix}{i}" for i in range(count)]
        self.ips = [f"{subnet}.{i + 1}" for i in range(count)]

    def remove_all(self):
        """Removes every namespace, veth and the bridge this script makes,
        killing what still runs inside (a namespace with a process in it
        outlives `ip netns del`)."""
        out = run(["ip", "netns", "list"], check=False).stdout
        for line in out.splitlines():
            name = line.split()[0] if line.split() else ""
            if (name.startswith(self.prefix)
                    and name[len(self.prefix):].isdigit()):
                pids = run(["ip", "netns", "pids", name], check=False).stdout
                for pid in pids.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                run(["ip", "netns", "del", name], check=False)
        links = run(["ip", "-o", "link", "show"], check=False).stdout
        for line in links.splitlines():
            dev = line.split(":")[1].strip().split("@")[0]
            if dev == self.bridge or (dev.startswith(self.veth)
                                      and dev[len(self.veth):].isdigit()):
                run(["ip", "link", "del", dev], check=False)

    def create(self):
        self.remove_all()
        run(["ip", "link", "add", self.bridge, "type", "bridge"])
        run(["ip", "addr", "add", self.bridge_ip + "/24", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        for i, (ns, ip) in enumerate(zip(self.names, self.ips)):
            outer = f"{self.veth}{i}"
            run(["ip", "netns", "add", ns])
            run(["ip", "link", "add", outer, "type", "veth", "peer", "name",
                 "eth0", "netns", ns])
            run(["ip", "link", "set", outer, "master", self.bridge, "up"])
            run(["ip", "-n", ns, "addr", "add", ip + "/24", "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def shape(self, rate):
        """tbf at `rate` on both ends of every veth (None: unshaped)."""
        for i, ns in enumerate(self.names):
            for prefix, dev in ((["ip", "netns", "exec", ns], "eth0"),
                                ([], f"{self.veth}{i}")):
                run(prefix + ["tc", "qdisc", "del", "dev", dev, "root"],
                    check=False)
                if rate is None:
                    continue
                bits = parse_rate(rate)
                # A burst of 1 ms of traffic (at least 32 KiB): enough for
                # tbf to reach the rate, small against the messages.
                burst = max(32 << 10, int(bits / 8 * 0.001))
                run(prefix + ["tc", "qdisc", "add", "dev", dev, "root", "tbf",
                              "rate", rate, "burst", str(burst), "latency",
                              "100ms"])

    def rx_bytes(self):
        """Bytes each host has received so far (its veth's outer tx)."""
        counts = []
        for i in range(self.count):
            with open(f"/sys/class/net/{self.veth}{i}/statistics/tx_bytes") as f:
                counts.append(int(f.read()))
        return counts


def parse_rate(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    return float(rate)


def finish(processes, timeout):
    """Each launcher's exit status and output; kills what outlives
    `timeout` (a hang is a failure, not a wait)."""
    results = []
    deadline = time.monotonic() + timeout
    for p in processes:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(killed: still running at the deadline)"
        results.append((p.returncode, out))
    return results


def run_then_clean_up(body, clean_up):
    """Returns body()'s exit status; SIGTERM and Ctrl-C stop it (130), and
    clean_up() runs in every case, shielded from a second Ctrl-C."""

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        return body()
    except KeyboardInterrupt:
        print("interrupted: writing what was measured", file=sys.stderr,
              flush=True)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        clean_up()
