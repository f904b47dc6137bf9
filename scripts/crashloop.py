"""Crash loop: a broker SIGKILLed at random instants under load, restarted on its data directory, and
everything read back: what was lost, duplicated though never delivered, or redelivered after delivery.

    scripts/crashloop.py [--kills 200] [--mode durable|default|memless|all] [--go GO_NSQD] [--seed N]

Each round: a fresh data directory; a topic with two channels (``work``, consumed, and ``audit``, never
consumed); publishers send PUB, MPUB and DPUB (a short deferral) and record what was acknowledged; a
consumer on ``work`` FINs most messages, REQs some, lets some time out, and disconnects now and then;
after a random 0.05 to 0.6 s the broker is SIGKILLed, restarted on the same directory, and both channels
drained.  Per channel it counts, for the acknowledged messages:

* lost: never delivered, before the kill or after;
* duplicated: delivered more than once after the restart, or (``audit``: never consumed) held twice;
* redelivered: delivered before the kill and again after (only a message delivered and not FINed may
  come again); ``FIN sent`` counts those among them whose FIN the consumer had written to its socket
  (the FIN may not have reached the broker before the kill: a FIN has no answer).

``work`` has a delivery policy (``max_attempts=2``, dead-letter topic ``orders-dead``, which a channel
``dead`` holds, never consumed before the kill): a message REQ'd or timed out twice is moved there.  A
moved message counts as delivered (not lost); ``dead twice`` counts the moves that appear more than
once in ``orders-dead`` (a move may appear once, never twice), ``dead and after`` the moved messages
``work`` delivered again after the restart.  (Go nsqd has no policies: its ``orders-dead`` stays empty.)

Modes: ``durable`` (--durable: nothing acknowledged lost, nothing never-delivered twice), ``memless``
(--mem-queue-size=0), ``default`` (memory queues: a kill loses what memory held, as Go nsqd).
``--go`` runs Go nsqd 1.3 the same way (its memory queues: it loses what memory held at a kill; the
reference, not a failure of the loop).  The suite runs a short version (tests/storage/test_crash_loop.py).
"""

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from nsqd_threaded.client import Consumer, Producer  # noqa: E402
from nsqd_threaded.testing import BrokerProcess  # noqa: E402

MODES = {"durable": ("--durable",), "memless": ("--mem-queue-size=0",), "default": ()}
DEFER_MS = 200  # DPUB's deferral: short, so that some come due before the kill and some after


class Round:
    """One kill: what was acknowledged and delivered before it, what came after.  ``lock`` guards the sets
    (the publisher and the consumer's handler threads add to them)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acked = set()
        self.delivered_before = set()
        self.fin_sent = set()
        self.after = {"work": [], "audit": []}
        self.dead = []  # what orders-dead's channel held after the restart


def _publish(producer, rnd, stop, rng, prefix):
    n = 0
    while not stop.is_set():
        kind = rng.random()
        try:
            if kind < 0.5:
                body = b"%s-%d" % (prefix, n)
                producer.pub("orders", body)
                sent = [body]
            elif kind < 0.85:
                sent = [b"%s-%d-%d" % (prefix, n, i) for i in range(rng.randint(2, 20))]
                producer.mpub("orders", sent)
            else:
                body = b"%s-%d-d" % (prefix, n)
                producer.dpub("orders", DEFER_MS, body)
                sent = [body]
        except Exception:  # the kill: what was not acknowledged does not count
            return
        with rnd.lock:
            rnd.acked.update(sent)
        n += 1


def _consume(address, rnd, stop, rng):
    """Until ``stop``: FIN most, REQ some, hold some to time out, reconnect now and then."""
    while not stop.is_set():
        try:
            consumer = Consumer(address, "orders", "work", max_in_flight=20, timeout=2.0,
                                identify={"msg_timeout": 1000}).start()
        except Exception:
            return
        try:
            until = time.monotonic() + rng.uniform(0.05, 0.3)
            while not stop.is_set() and time.monotonic() < until:
                try:
                    message = consumer.get(timeout=0.05)
                except Exception:  # (no message yet, or the kill)
                    continue
                with rnd.lock:
                    rnd.delivered_before.add(message.body)
                roll = rng.random()
                try:
                    if roll < 0.8:
                        message.fin()
                        with rnd.lock:
                            rnd.fin_sent.add(message.body)
                    elif roll < 0.9:
                        message.req(0)
                    # else: held, times out after msg_timeout (1 s) unless the consumer leaves first
                except Exception:
                    pass
        finally:
            try:
                consumer.close(timeout=1.0)
            except Exception:
                pass


def _drain(nsqd, channel, quiet=1.5, topic="orders"):
    """Every message left on ``channel``, FINed; ends once none came for ``quiet`` seconds (deferred ones
    come due within DEFER_MS, timed-out ones within the msg_timeout)."""
    got = []
    with Consumer(nsqd.tcp_address, topic, channel, max_in_flight=200).start() as consumer:
        while True:
            try:
                message = consumer.get(timeout=quiet)
            except Exception:
                return got
            got.append(message.body)
            message.fin()


def run_round(flags, tmp, rng, command=None):
    """One round (see the module's docstring); returns the :class:`Round`."""
    rnd = Round()
    data = tempfile.mkdtemp(prefix="crashloop-", dir=tmp)
    kwargs = {"data_path": data} if command is None else {"data_path": data, "command": command}
    nsqd = BrokerProcess(*flags, **kwargs).start()
    try:
        for path in ("/topic/create?topic=orders", "/channel/create?topic=orders&channel=work",
                     "/channel/create?topic=orders&channel=audit", "/topic/create?topic=orders-dead",
                     "/channel/create?topic=orders-dead&channel=dead"):
            status, body = nsqd.http("POST", path)
            assert status == 200, (path, status, body)
        if command is None:  # (Go nsqd has no delivery policies)
            path = "/channel/policy?topic=orders&channel=work&max_attempts=2&dead_letter_topic=orders-dead"
            status, body = nsqd.http("POST", path)
            assert status == 200, (path, status, body)
        stop = threading.Event()
        producers = [Producer(nsqd.tcp_address, timeout=2.0) for _ in range(2)]
        threads = [threading.Thread(target=_publish, args=(p, rnd, stop, random.Random(rng.random()), b"p%d" % i),
                                    name="crashloop-publisher-%d" % i, daemon=True)
                   for i, p in enumerate(producers)]
        threads.append(threading.Thread(target=_consume, args=(nsqd.tcp_address, rnd, stop,
                                                               random.Random(rng.random())),
                                        name="crashloop-consumer", daemon=True))
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.05, 0.6))  # the load runs for a random while: the kill's instant
        nsqd.kill()
        stop.set()
        for t in threads:
            t.join(10)
        for p in producers:
            try:
                p.close()
            except Exception:
                pass
        nsqd.start()
        for channel in ("work", "audit"):
            rnd.after[channel] = _drain(nsqd, channel)
        rnd.dead = _drain(nsqd, "dead", topic="orders-dead")
    finally:
        nsqd.stop()
        shutil.rmtree(data, ignore_errors=True)
    return rnd


def tally(rounds, lossy=False):
    """Totals over the rounds: per channel lost, duplicated (never delivered, twice), redelivered; for
    ``work`` also the dead-letter moves (``dead``), those seen twice and those delivered again after."""
    totals = {c: {"acked": 0, "lost": 0, "duplicated": 0, "redelivered": 0} for c in ("work", "audit")}
    totals["work"].update({"FIN sent": 0, "dead": 0, "dead twice": 0, "dead and after": 0})
    for rnd in rounds:
        dead = {}
        for body in rnd.dead:
            dead[body] = dead.get(body, 0) + 1
        for channel, after in rnd.after.items():
            t = totals[channel]
            seen = {}
            for body in after:
                seen[body] = seen.get(body, 0) + 1
            before = rnd.delivered_before if channel == "work" else set()
            moved = dead if channel == "work" else {}
            t["acked"] += len(rnd.acked)
            t["lost"] += len([b for b in rnd.acked if b not in seen and b not in before and b not in moved])
            t["duplicated"] += sum(n - 1 for n in seen.values() if n > 1)
            t["redelivered"] += len([b for b in seen if b in before])
            if channel == "work":
                t["FIN sent"] += len([b for b in seen if b in rnd.fin_sent])
            if channel == "work":
                t["dead"] += len(dead)
                t["dead twice"] += sum(n - 1 for n in dead.values() if n > 1)
                t["dead and after"] += len([b for b in dead if b in seen])
    return totals


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--mode", default="durable", choices=sorted(MODES) + ["all"])
    ap.add_argument("--go", metavar="GO_NSQD", help="also run Go nsqd 1.3 (this binary) the same way")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    modes = sorted(MODES) if a.mode == "all" else [a.mode]
    runs = [("ours " + m, MODES[m], None) for m in modes]
    if a.go:
        runs.append(("Go nsqd 1.3", (), [os.path.abspath(a.go)]))
    tmp = tempfile.mkdtemp(prefix="crashloop-")
    try:
        print("%-18s %-6s %8s %6s %10s %11s %8s %6s %10s %14s" % (
            "broker", "chan", "acked", "lost", "duplicated", "redelivered", "FIN sent", "dead", "dead twice",
            "dead and after"))
        for name, flags, command in runs:
            rng = random.Random(a.seed)
            started = time.monotonic()
            rounds = [run_round(flags, tmp, rng, command) for _ in range(a.kills)]
            for channel, t in tally(rounds).items():
                print("%-18s %-6s %8d %6d %10d %11d %8s %6s %10s %14s" % (
                    name, channel, t["acked"], t["lost"], t["duplicated"], t["redelivered"], t.get("FIN sent", "-"),
                    t.get("dead", "-"), t.get("dead twice", "-"), t.get("dead and after", "-")))
            print("%-18s %d kills in %.0f s" % (name, a.kills, time.monotonic() - started))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
