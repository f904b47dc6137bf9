"""FaultProxy (and the plugin's fault_proxy fixture): real clients through it stall, wait, reset, recover."""

import socket
import threading
import time

import pytest

from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.testing import Broker, BrokerProcess, FaultProxy
from support.core import wait_until
from support.tools import go_tool


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_dir=str(tmp_path)) as running:
        yield running


def channel_stats(broker, topic, channel):
    for t in broker.stats(topic=topic)["topics"] or []:
        for c in t["channels"] or []:
            if c["channel_name"] == channel:
                return c
    return None


def in_flight(broker, topic, channel):
    stats = channel_stats(broker, topic, channel)
    return stats["in_flight_count"] if stats else 0


def ready(broker, topic, channel):
    """A consumer has subscribed and is ready for messages (its RDY went through)."""
    stats = channel_stats(broker, topic, channel)
    return bool(stats and any(c["ready_count"] > 0 for c in stats["clients"]))


class Received:
    """A consumer handler that records bodies and signals when ``n`` arrived."""

    def __init__(self):
        self.bodies = []
        self.lock = threading.Lock()  # guards bodies

    def __call__(self, message):
        with self.lock:
            self.bodies.append(message.body)

    def count(self):
        with self.lock:
            return len(self.bodies)


def stall_then_heal(broker, proxy, n=20):
    """A consumer through ``proxy``: nothing arrives while stalled, everything once healed."""
    received = Received()
    with Consumer(proxy.addr, "t", "c", received, max_in_flight=n):
        wait_until(lambda: ready(broker, "t", "c"), 30, "the consumer")
        proxy.stall()
        with Producer(broker.tcp_address) as p:  # straight to the broker
            for i in range(n):
                p.pub("t", b"%d" % i)
        wait_until(lambda: in_flight(broker, "t", "c") == n, 30, "the broker to send them")
        assert received.count() == 0  # sent by the broker, held by the proxy
        proxy.heal()
        wait_until(lambda: received.count() == n, 30, "every message after the heal")
    assert sorted(received.bodies, key=int) == [b"%d" % i for i in range(n)]


def test_stall_holds_both_ways_and_heal_delivers_everything(broker, fault_proxy):
    stall_then_heal(broker, fault_proxy(broker.tcp_addr))


def test_delay_adds_latency_each_way(broker, fault_proxy):
    proxy = fault_proxy(broker.tcp_address)
    with Producer(proxy.addr) as p:
        p.pub("t", b"warm")
        proxy.delay(0.2)
        t0 = time.monotonic()
        p.pub("t", b"late")
        assert time.monotonic() - t0 >= 0.38  # 0.2 s to the broker and 0.2 s back (timer slack aside)
        proxy.heal()
        p.pub("t", b"on time")
    assert broker.stats(topic="t")["topics"][0]["message_count"] == 3


def test_cut_resets_connections_refuses_new_ones_and_heal_lets_clients_back(broker, fault_proxy):
    accepts = []
    proxy = fault_proxy(broker.tcp_addr, on_event=lambda ev, **f: accepts.append(ev) if ev == "accept" else None)
    raw = socket.create_connection(proxy.address, timeout=10)
    received = Received()
    try:
        raw.sendall(b"  V2")
        with Consumer(proxy.addr, "t", "c", received, reconnect_backoff=(0.05, 0.2)):
            wait_until(lambda: proxy.connections == 2, 30, "both connections")
            proxy.cut()
            with pytest.raises(ConnectionResetError):
                raw.recv(100)  # the RST, not an orderly end
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(proxy.address, timeout=10).close()
            with pytest.raises(OSError):
                with Producer(proxy.addr, timeout=2.0) as p:
                    p.pub("t", b"refused")
            proxy.heal()
            wait_until(lambda: accepts.count("accept") >= 3, 30, "the consumer to reconnect")
            with Producer(proxy.addr) as p:
                p.pub("t", b"after")
            wait_until(lambda: received.count() == 1, 30, "the message after the heal")
    finally:
        raw.close()
    assert received.bodies == [b"after"]


def test_close_joins_every_thread(broker):
    before = set(threading.enumerate())
    with FaultProxy(broker.tcp_addr) as proxy:
        with Producer(proxy.addr) as p:
            p.pub("t", b"x")
            proxy.stall()
            held = socket.create_connection(proxy.address, timeout=10)
            wait_until(lambda: proxy.connections == 2, 30, "the held connection")
    held.close()
    assert [t for t in threading.enumerate() if t not in before and t.name.startswith("fault-proxy")] == []


def test_pynsq_clients_through_the_proxy(broker, fault_proxy):
    from support.pynsq import Loop

    proxy = fault_proxy(broker.tcp_addr)
    loop = Loop()
    got = []

    def handler(message):
        got.append(message.body)
        return True

    try:
        writer = loop.writer(proxy.addr)
        writer.reconnect_interval = 0.2
        loop.reader(proxy.addr, "t", "c", handler)
        loop.wait_writers_connected()
        loop.run_until(lambda: ready(broker, "t", "c"), 30, "the reader")
        proxy.stall()
        with Producer(broker.tcp_address) as p:  # straight to the broker
            p.pub("t", b"a")
            p.pub("t", b"b")
        # (pynsq starts each connection at RDY 1: one message goes out at first)
        loop.run_until(lambda: in_flight(broker, "t", "c") == 1, 30, "the broker to send one")
        assert got == []
        proxy.heal()
        loop.run_until(lambda: len(got) == 2, 30, "delivery after the heal")
        proxy.cut()
        loop.run_until(lambda: not writer.conns, 30, "the writer to see the reset")
        proxy.heal()
        loop.wait_writers_connected(30)
        state = loop.publish(writer, "t", [b"c"])
        loop.run_until(lambda: state["ok"] == 1, 30, "a publish after the heal")
    finally:
        loop.close()
    assert sorted(got) == [b"a", b"b"]


@pytest.mark.skipif(go_tool("nsqd") is None, reason="Go's nsqd binary is not here")
def test_go_nsqd_behind_the_proxy(tmp_path, fault_proxy):
    with BrokerProcess(command=[go_tool("nsqd")], tmp_dir=str(tmp_path)) as go:
        proxy = fault_proxy(go.tcp_addr)
        stall_then_heal(go, proxy)
        with Producer(proxy.addr, reconnect_backoff=(0.05, 0.2)) as p:
            p.pub("t", b"before")
            proxy.cut()
            with pytest.raises(OSError):
                p.pub("t", b"refused")
            proxy.heal()
            wait_until(lambda: _pub_ok(p), 30, "a publish after the heal")


def _pub_ok(producer):
    try:
        producer.pub("t", b"after")
    except OSError:
        return False
    return True
