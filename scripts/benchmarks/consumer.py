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
import sys
import threading
import time

from nsqd_threaded.client import Consumer, Producer

from . import ROOT
from .common import BrokerProc, drain_rounds


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
    brokers = [("ours", a.python, ROOT)]
    if a.go:
        brokers.insert(0, ("go", os.path.join(a.go, "nsqd"), None))
    if a.baseline:
        brokers.append(("base", a.python, os.path.abspath(a.baseline)))
    drain_rounds(brokers, a.rounds, a.messages,
                 lambda kind, argv0, root: one_run(kind, argv0, root, a.messages, a.max_in_flight))


if __name__ == "__main__":
    main()
