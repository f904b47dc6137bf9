"""The virtual network: hosts as network namespaces joined by veth pairs to a bridge, partitions
as blackhole routes, and the checks and clean-up of namespaces around a run."""

import os
import shutil
import subprocess

from .topology import HOST_ADDRESSES, SUBNET


def run_cmd(argv, check=True):
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and result.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(argv), result.stderr.strip()))
    return result


class Network:
    """Hosts as namespaces ``<prefix><host>``, each with ``eth0`` on a bridge in ``<prefix>br``.

    Everything made is listed in ``made`` (namespace names) and removed by :meth:`close`; the
    veth pairs live only inside the namespaces, so removing those removes them."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.made = []
        self.hosts = {}
        self.cuts = set()
        self.bridge = prefix + "br"
        self._add_ns(self.bridge)
        run_cmd(["ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge"])
        run_cmd(["ip", "-n", self.bridge, "link", "set", "br0", "up"])

    def _add_ns(self, name):
        run_cmd(["ip", "netns", "add", name])
        self.made.append(name)
        run_cmd(["ip", "-n", name, "link", "set", "lo", "up"])

    def ns(self, host):
        return self.prefix + host

    def address(self, host):
        return SUBNET + str(HOST_ADDRESSES[host])

    def add_host(self, host):
        ns = self.ns(host)
        self._add_ns(ns)
        veth = "v-" + host
        run_cmd(["ip", "-n", self.bridge, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run_cmd(["ip", "-n", self.bridge, "link", "set", veth, "master", "br0", "up"])
        run_cmd(["ip", "-n", ns, "addr", "add", self.address(host) + "/24", "dev", "eth0"])
        run_cmd(["ip", "-n", ns, "link", "set", "eth0", "up"])
        self.hosts[host] = ns

    def cut(self, a, b):
        """A partition between hosts ``a`` and ``b``: a blackhole route to the other on each side
        (packets vanish; an established connection sees silence, a new one fails)."""
        for x, y in ((a, b), (b, a)):
            run_cmd(["ip", "-n", self.ns(x), "route", "add", "blackhole", self.address(y) + "/32"])
        self.cuts.add((a, b))

    def heal(self, a, b):
        for x, y in ((a, b), (b, a)):
            run_cmd(["ip", "-n", self.ns(x), "route", "del", "blackhole", self.address(y) + "/32"], check=False)
        self.cuts.discard((a, b))

    def close(self):
        for name in reversed(self.made):
            run_cmd(["ip", "netns", "del", name], check=False)
        self.made = []


def can_make_namespaces():
    """(True, "") when this process may make network namespaces, else (False, why)."""
    if os.geteuid() != 0:
        return False, "not root"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return False, "no %s" % tool
    name = "nsqf-%d-probe" % os.getpid()
    r = run_cmd(["ip", "netns", "add", name], check=False)
    if r.returncode != 0:
        return False, r.stderr.strip()
    run_cmd(["ip", "netns", "del", name], check=False)
    return True, ""


def clean_stale():
    """Delete the namespaces ``nsqf-<pid>-...`` whose run (``pid``) is no longer alive; their names."""
    out = run_cmd(["ip", "netns", "list"], check=False).stdout
    removed = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != "nsqf" or not parts[1].isdigit():
            continue
        if os.path.exists("/proc/%s" % parts[1]):
            continue  # that run is alive (or its pid was reused: left alone either way)
        run_cmd(["ip", "netns", "del", name], check=False)
        removed.append(name)
    return removed
