"""The package's Consumer draining a queued channel: from Go nsqd, ours and a baseline tree, alternately.

    scripts/bench consumer --go DIR [--messages 200000] [--max-in-flight 200] [--rounds 3] [--baseline TREE]

Each round, for each broker (fresh data directory, default flags, ephemeral
127.0.0.1 ports): ``--messages`` 200-byte messages are queued in channel
``ch`` of topic ``drain`` (memory queue, then disk), then
``nsqd_threaded.client.Consumer`` with a handler that does nothing (FIN on
return) and ``--max-in-flight`` drains them; the time until the handler has
seen every message, with the broker's CPU per message.  The consumer runs
in this process (CPython of the script), as an application's would.
Medians per broker and the ratio to Go.
"""

import argparse
import os
import statistics
import sys
import threading
import time

from nsqd_threaded.client import Consumer, Producer

from . import ROOT
from .common import BrokerProc, Quiet


def one_run(kind, argv0, root, messages, max_in_flight):
    """Queue, drain with the package's Consumer; returns (seconds, broker CPU us per message)."""
    broker = BrokerProc(kind, argv0, (), root, http=True)
    try:
        broker.http("POST", "/topic/create?topic=drain")
        broker.http("POST", "/channel/create?topic=drain&channel=ch")
        body = b"x" * 200
        with Producer(broker.address) as producer:
            for start in range(0, messages, 200):
                producer.mpub("drain", [body] * min(200, messages - start))
        seen = [0]
        done = threading.Event()

        def handler(message):
            seen[0] += 1
            if seen[0] >= messages:
                done.set()

        cpu = broker.cpu_seconds()
        start = time.monotonic()
        consumer = Consumer(broker.address, "drain", "ch", handler, max_in_flight=max_in_flight).start()
        try:
            if not done.wait(600):
                raise RuntimeError("%s: %d of %d after 600 s" % (kind, seen[0], messages))
            seconds = time.monotonic() - start
            cpu = broker.cpu_seconds() - cpu
        finally:
            consumer.close()
        return seconds, cpu / messages * 1e6
    finally:
        broker.stop()


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench consumer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--go", help="directory of the Go reference nsqd (a column for reference)")
    ap.add_argument("--messages", type=int, default=200000)
    ap.add_argument("--max-in-flight", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs our broker")
    ap.add_argument("--baseline", metavar="TREE", help="also run this project from another tree")
    a = ap.parse_args()
    quiet = Quiet()
    brokers = [("ours", a.python, ROOT)]
    if a.go:
        brokers.insert(0, ("go", os.path.join(a.go, "nsqd"), None))
    if a.baseline:
        brokers.append(("base", a.python, os.path.abspath(a.baseline)))
    results = {kind: [] for kind, _, _ in brokers}
    print("load average at start: %.2f" % quiet.start_load, flush=True)
    for rnd in range(a.rounds):
        for kind, argv0, root in (brokers if rnd % 2 == 0 else brokers[::-1]):
            seconds, cpu = one_run(kind, argv0, root, a.messages, a.max_in_flight)
            results[kind].append((seconds, cpu))
            print("round %d %-4s %.2f s (%.0f msg/s), %.1f us broker CPU/msg"
                  % (rnd + 1, kind, seconds, a.messages / seconds, cpu), file=sys.stderr, flush=True)
    reference = results[brokers[0][0]]
    ref_rate = a.messages / statistics.median(s for s, _ in reference)
    print("%-5s %12s %14s %10s" % ("", "msg/s", "CPU us/msg", "of " + brokers[0][0]))
    for kind, rows in results.items():
        rate = a.messages / statistics.median(s for s, _ in rows)
        print("%-5s %12.0f %14.1f %10.2f" % (kind, rate, statistics.median(c for _, c in rows), rate / ref_rate))


if __name__ == "__main__":
    main()
