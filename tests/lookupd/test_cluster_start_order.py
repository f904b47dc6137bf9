"""A cluster started in any order: a broker up before its lookupd loses no channel's copy.

The lookupd listens on ports reserved in advance (bound, not listening: a connect is refused, as
for a lookupd not started yet), so the broker can be told its address before it exists.
"""

import json
import re
import socket
import time
import urllib.request

import pytest

from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.lookupd.nsqlookupd import NSQLookupd
from nsqd_threaded.lookupd.registration_db import Registration

from support.core import wait_until

pytestmark = pytest.mark.timeout(90)


class ReservedPort:
    """A 127.0.0.1 port bound (so no one else gets it) but not listening (so connects are refused)."""

    def __init__(self):
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.addr = "127.0.0.1:%d" % self.port

    def release(self):
        self._sock.close()


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def nodes(lookupd):
    return sorted(p["tcp_port"] for p in get_json(lookupd.http_url + "/nodes")["producers"])


def start_lookupd(tcp, http, knowing=()):
    """Start the lookupd on the reserved ports, already knowing the ``(topic, channel)`` pairs in
    ``knowing`` (as POST /channel/create records them): a broker dialling again may connect and ask
    within a millisecond of the listener opening, before anything sent afterwards could arrive."""
    tcp.release()
    http.release()
    lookupd = NSQLookupd.local(tcp_address=tcp.addr, http_address=http.addr)
    for topic, channel in knowing:
        lookupd.db.add_registration(Registration("topic", topic, ""))
        lookupd.db.add_registration(Registration("channel", topic, channel))
    lookupd.start()
    return lookupd


def drain(consumer, n):
    bodies = []
    for _ in range(n):
        message = consumer.get(timeout=20)
        message.fin()
        bodies.append(message.body)
    return bodies


def test_a_broker_started_before_its_lookupd(make_nsqd):
    tcp, http = ReservedPort(), ReservedPort()
    first = make_nsqd(nsqlookupd_tcp_addresses=[tcp.addr], broadcast_address="127.0.0.1")
    lookupd = None
    try:
        # While no lookupd answers: the topic is created, published to, and consumed locally on
        # `billing` (without the hold, that consumer would drain the backlog before `audit` exists).
        before = [b"before %d" % i for i in range(10)]
        with Producer(first.tcp_address) as producer:
            for body in before[:5]:
                producer.pub("orders", body)
            with Consumer(first.tcp_address, "orders", "billing", max_in_flight=100) as billing:
                for body in before[5:]:
                    producer.pub("orders", body)
                assert "no available nsqlookupd to query for channels to pre-create for topic orders" in \
                    first.log.stream.getvalue()

                wait_until(lambda: "Connection refused" in first.log.stream.getvalue(), what="a refused connect")
                started = time.monotonic()
                while time.monotonic() - started < 2:  # the lookupd comes 2 s after the broker
                    with pytest.raises(TimeoutError):  # held: nothing before the cluster's channels exist
                        billing.get(timeout=0.1)
                # The cluster has `audit` for the topic: the lookupd knows it when it comes up.
                lookupd = start_lookupd(tcp, http, knowing=[("orders", "audit")])
                up = time.monotonic()

                wait_until(lambda: first.tcp_address[1] in nodes(lookupd), timeout=10, what="the first broker in /nodes")
                assert time.monotonic() - up < 3 + 2, "re-registered late"  # 3 s, and a margin for a loaded machine
                topic = first.get_existing_topic("orders")
                wait_until(lambda: sorted(c.name for c in topic.channels()) == ["audit", "billing"], timeout=10,
                           what="audit pre-created on the first broker")

                after = [b"after %d" % i for i in range(10)]
                for body in after:
                    producer.pub("orders", body)
                assert sorted(drain(billing, 20)) == sorted(before + after)
        with Consumer(first.tcp_address, "orders", "audit", max_in_flight=100) as audit:
            assert sorted(drain(audit, 20)) == sorted(before + after)
        assert "LOOKUPD(%s): peer info" % tcp.addr in first.log.stream.getvalue()
    finally:
        if lookupd is None:
            tcp.release()
            http.release()
        else:
            lookupd.stop()


def test_a_restarted_lookupd_is_registered_again_within_seconds(make_nsqd):
    tcp, http = ReservedPort(), ReservedPort()
    lookupd = start_lookupd(tcp, http)
    try:
        broker = make_nsqd(nsqlookupd_tcp_addresses=[lookupd.tcp_addr], broadcast_address="127.0.0.1")
        broker.get_topic("orders").get_channel("audit")
        wait_until(lambda: get_json(lookupd.http_url + "/channels?topic=orders")["channels"] == ["audit"],
                   what="registered")
        lookupd.stop()
        lookupd = NSQLookupd.local(tcp_address=tcp.addr, http_address=http.addr)
        lookupd.start()
        restarted = time.monotonic()
        # Go waits for the next 15 s PING; here the closed connection is noticed and dialled again.
        wait_until(lambda: get_json(lookupd.http_url + "/channels?topic=orders")["channels"] == ["audit"],
                   timeout=10, what="registered again")
        assert broker.tcp_address[1] in nodes(lookupd)
        assert time.monotonic() - restarted < 5
    finally:
        lookupd.stop()


def test_a_topic_held_past_its_deadline_delivers_and_still_gets_the_cluster_channels(make_nsqd):
    """No lookupd within the hold: the topic delivers to the channels it has; a channel the cluster
    has is created once a lookupd answers, and gets what is published from then on."""
    tcp, http = ReservedPort(), ReservedPort()
    broker = make_nsqd(nsqlookupd_tcp_addresses=[tcp.addr], broadcast_address="127.0.0.1",
                       lookupd_channel_query_hold=0.2)
    lookupd = None
    try:
        with Producer(broker.tcp_address) as producer, \
                Consumer(broker.tcp_address, "orders", "billing", max_in_flight=10) as billing:
            producer.pub("orders", b"early")
            assert billing.get(timeout=20).body == b"early"  # the hold ended
            assert "TOPIC(orders): no nsqlookupd answered within 0.2s" in broker.log.stream.getvalue()
            lookupd = start_lookupd(tcp, http, knowing=[("orders", "audit")])
            topic = broker.get_existing_topic("orders")
            wait_until(lambda: "audit" in [c.name for c in topic.channels()], timeout=20,
                       what="audit created when the lookupd answered")
            producer.pub("orders", b"late")
        with Consumer(broker.tcp_address, "orders", "audit", max_in_flight=10) as audit:
            assert audit.get(timeout=20).body == b"late"
    finally:
        if lookupd is None:
            tcp.release()
            http.release()
        else:
            lookupd.stop()


def test_a_refusing_lookupd_is_dialled_with_a_doubling_back_off(make_nsqd):
    """Not hammered, not left for 15 s: 0.25 s, 0.5 s, then 1 s at most between dials, each wait drawn
    from its upper half (lower bounds only: a loaded machine only makes the gaps longer; the upper
    bound is test_lookup_loop's re-registration after a long outage)."""
    port = ReservedPort()
    try:
        broker = make_nsqd(nsqlookupd_tcp_addresses=[port.addr])

        def dials():
            stamps = re.findall(r"(\d\d):(\d\d):(\d\d\.\d+) INFO: LOOKUP connecting to " + re.escape(port.addr),
                                broker.log.stream.getvalue())
            return [int(h) * 3600 + int(m) * 60 + float(s) for h, m, s in stamps]

        wait_until(lambda: len(dials()) >= 5, timeout=30, what="five dials")
        stamps = dials()[:5]
        gaps = [(b - a) % 86400 for a, b in zip(stamps, stamps[1:])]  # (modulo a day: the log shows the time of day)
        for gap, least in zip(gaps, (0.12, 0.24, 0.49, 0.49)):
            assert gap >= least, gaps
        assert "Connection refused" in broker.log.stream.getvalue()
    finally:
        port.release()
