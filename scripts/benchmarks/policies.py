"""Publish throughput per storage policy: memory only, disk with the default sync, and --durable.

Each policy gets a fresh broker (started here) and the bench_writer load: MPUB batches of 200 and
single PUBs, over N connections (group commit needs concurrent publishers to share fsyncs).
``--baseline TREE`` runs this project from another tree too, alternately with this one, for
``--rounds`` rounds (medians), so that a change is measured before and after in one run; the broker's
CPU time per message is printed beside each rate.  For ``--durable``, "PUBs/fsync" is how many
single PUBs shared a group commit's fsync (from ``/debug/state``; a tree that does not report it
shows "-").
"""

import argparse
import json
import os
import statistics
import sys

from . import ROOT, writer
from .common import BrokerProc

POLICIES = [
    ("memory only", ["--mem-queue-size=10000000"]),
    ("disk, default sync", ["--mem-queue-size=0"]),
    ("durable (fsync per ack)", ["--durable"]),
]


def group_commits(b, topic):
    """The fsyncs a durable topic's publishers shared so far (/debug/state's ``group_commits``;
    None for a tree or a mode that does not report it)."""
    try:
        state = json.loads(b.http("GET", "/debug/state"))
    except (OSError, ValueError, RuntimeError):
        return None
    for t in state.get("topics", []):
        if t.get("name") == topic:
            return t.get("backend", {}).get("group_commits")
    return None


def measure(root, python, flags, runfor, connections):
    """(MPUB msg/s, its CPU us/msg, PUB msg/s, its CPU us/msg, single PUBs per fsync or None) of
    one fresh broker."""
    with BrokerProc("ours", python, flags, root=root, http=True) as b:
        cpu = b.cpu_seconds()
        mpub = writer.run(b.address, "p_mpub", 200, 200, runfor, connections)[0]
        mpub_cpu = (b.cpu_seconds() - cpu) / max(1.0, mpub * runfor) * 1e6
        cpu = b.cpu_seconds()
        pub = writer.run(b.address, "p_pub", 200, 1, runfor, connections)[0]
        pub_cpu = (b.cpu_seconds() - cpu) / max(1.0, pub * runfor) * 1e6
        commits = group_commits(b, "p_pub")
    per_fsync = pub * runfor / commits if commits else None
    return mpub, mpub_cpu, pub, pub_cpu, per_fsync


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the broker")
    ap.add_argument("--runfor", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--baseline", metavar="TREE", help="this project from another tree too (before/after)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, the trees alternately (medians)")
    a = ap.parse_args()
    trees = [("this tree", ROOT)]
    if a.baseline:
        trees.append(("baseline", os.path.abspath(a.baseline)))
    print("%-26s %-10s %14s %8s %14s %8s %10s" % ("policy", "tree", "MPUB 200 msg/s", "us/msg", "PUB msg/s", "us/msg",
                                                  "PUBs/fsync"))
    for name, flags in POLICIES:
        runs = {tree: [] for tree, _ in trees}
        for _ in range(a.rounds):
            for tree, root in trees:
                runs[tree].append(measure(root, a.python, flags, a.runfor, a.connections))
        for tree, _ in trees:
            mpub, mpub_cpu, pub, pub_cpu = (statistics.median(r[i] for r in runs[tree]) for i in range(4))
            shared = [r[4] for r in runs[tree] if r[4] is not None]
            per_fsync = "%10.2f" % statistics.median(shared) if shared else "%10s" % "-"
            print("%-26s %-10s %14.0f %8.1f %14.0f %8.1f %s" % (name, tree, mpub, mpub_cpu, pub, pub_cpu, per_fsync),
                  flush=True)


if __name__ == "__main__":
    main()
