"""Publish throughput per storage policy: memory only, disk with the default sync, and --durable.

Each policy gets a fresh broker (started here) and the bench_writer load: MPUB batches of 200 and
single PUBs, over N connections (group commit needs concurrent publishers to share fsyncs).
"""

import argparse
import sys

from . import writer
from .common import BrokerProc

POLICIES = [
    ("memory only", ["--mem-queue-size=10000000"]),
    ("disk, default sync", ["--mem-queue-size=0"]),
    ("durable (fsync per ack)", ["--durable"]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs the broker")
    ap.add_argument("--runfor", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=4)
    a = ap.parse_args()
    print("%-26s %14s %14s" % ("policy", "MPUB 200 msg/s", "PUB msg/s"))
    for name, flags in POLICIES:
        with BrokerProc("ours", a.python, flags) as b:
            mpub, _, _ = writer.run(b.address, "p_mpub", 200, 200, a.runfor, a.connections)
            pub, _, _ = writer.run(b.address, "p_pub", 200, 1, a.runfor, a.connections)
        print("%-26s %14.0f %14.0f" % (name, mpub, pub))


if __name__ == "__main__":
    main()
