#!/usr/bin/env python3
"""Delivery behaviour of this broker against Go nsqd's, over many random client sessions.

    scripts/delivery_diff.py --go DIR [--seeds 100] [--first 1] [--steps 30]

Each seed makes a random session (tests/support/delivery.py: several consumers
on one channel, random RDY values and changes, FIN/REQ/TOUCH at random
moments, messages held, publishes in between, consumers leaving, holds past
the message timeout) and plays it against Go nsqd (DIR holds the reference
``nsqd``) and against this broker; after every step what the clients observe
must be equal.  Prints one line per seed and the settle times (how long a
step took until every deliverable message was delivered); exits 1 on any
difference.  Without --go, each session is checked against the contract
alone.  The suite runs a few fixed seeds of the same (tests/protocol/
test_delivery_differential.py).
"""

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from support import delivery  # noqa: E402


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--go", help="directory of the Go reference binaries (nsqd)")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    seeds = range(args.first, args.first + args.seeds)
    scripts = {seed: delivery.random_session(seed, steps=args.steps) for seed in seeds}
    topics = {seed: "diff-%d" % seed for seed in seeds}
    go = None
    if args.go:
        delivery.GO_NSQD = os.path.join(args.go, "nsqd")
        go = delivery.GoBroker()
        go.prepare(list(topics.values()))
    ours = delivery.OurBroker()
    failed = 0
    settle = {"go": [], "ours": []}
    try:
        for seed in seeds:
            script = scripts[seed]
            observed, latencies = delivery.play(ours, script, topics[seed])
            settle["ours"].extend(latencies)
            expected = delivery.ideal(script)
            if go is not None:
                expected, latencies = delivery.play(go, script, topics[seed])
                settle["go"].extend(latencies)
            diff = [(a, b) for a, b in zip(observed, expected) if a != b]
            if len(observed) != len(expected):
                diff.append(("length", len(observed), len(expected)))
            verdict = "same" if not diff else "DIFFERENT %s" % diff
            failed += bool(diff)
            print("seed %d: %d steps, %s" % (seed, len(script), verdict), flush=True)
    finally:
        ours.close()
        if go is not None:
            go.close()
    for name, values in settle.items():
        if values:
            print("%s: step settle time p50 %.1f ms, p99 %.1f ms, max %.1f ms" % (
                name, 1000 * percentile(values, 0.5), 1000 * percentile(values, 0.99), 1000 * max(values)))
    print("%d of %d seeds differ" % (failed, len(scripts)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
