"""A broker that skips time by itself (``--time-skipping=auto``, ``Broker(auto_skip=True)``): a
threaded client, or a suite in any language, gets no real waits without a loop of ours; this
project's Producer and Consumer take ``clock=`` for their reconnect and backoff timers."""

import socket
import struct
import time

import pytest

from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.testing import Broker, BrokerProcess, FaultProxy

pytestmark = pytest.mark.timeout(60)


def test_a_quiet_broker_skips_to_its_next_deadline(tmp_path):
    started = time.monotonic()
    with Broker(auto_skip=True, tmp_dir=str(tmp_path)) as nsqd:
        with Producer(nsqd.tcp_address) as producer:
            producer.dpub("orders", 3600 * 1000, b"in an hour")
            producer.pub("orders", b"now")
        with Consumer(nsqd.tcp_address, "orders", "billing", clock=nsqd).start() as consumer:
            first = consumer.get(timeout=5)
            assert first.body == b"now"
            first.req(30 * 1000)  # back in 30 s of the clock
            second = consumer.get(timeout=5)
            assert (second.body, second.attempts) == (b"now", 2)
            second.fin()
            later = consumer.get(timeout=5)
            assert later.body == b"in an hour"
            assert nsqd.now() - time.time() >= 3599  # the clock went through the hour
            later.fin()
        assert nsqd.nsqd.auto_skipper.skips >= 1  # (one jump may pass both deadlines, if the REQ came late)
    assert time.monotonic() - started < 10


def test_it_never_skips_while_a_client_talks(tmp_path):
    # (a grace of 0.5 s: a loaded machine may hold the TOUCHing thread back longer than the default)
    with Broker(auto_skip=True, msg_timeout=60.0, time_skipping_grace=0.5, tmp_dir=str(tmp_path)) as nsqd:
        with Producer(nsqd.tcp_address) as producer:
            producer.pub("orders", b"held")
        with Consumer(nsqd.tcp_address, "orders", "billing").start() as consumer:
            message = consumer.get(timeout=5)
            # TOUCHed every 20 ms for a second: the connection moves, so the 60 s timeout never comes
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                message.touch()
                time.sleep(0.02)  # (the client's pace, in real time: what the test is about)
            assert nsqd.stats(topic="orders")["topics"][0]["channels"][0]["timeout_count"] == 0
            message.fin()


def test_the_consumers_reconnect_delay_runs_on_the_brokers_clock(tmp_path):
    with Broker(auto_skip=True, tmp_dir=str(tmp_path)) as nsqd, FaultProxy(nsqd.tcp_address) as proxy:
        with Consumer(proxy.addr, "orders", "billing", reconnect_backoff=(30.0, 60.0), clock=nsqd).start() as consumer:
            nsqd.wait_until("orders", "billing", client_count=1)
            proxy.cut()  # the connection reset, new ones refused
            nsqd.wait_until("orders", "billing", client_count=0)
            # redialled at once (refused), then it waits 30 s of the broker's clock: a deadline the broker holds
            deadline = time.monotonic() + 10
            while nsqd.clock.next_waiter_ns() is None:
                assert time.monotonic() < deadline, "the consumer never waited on the broker's clock"
                time.sleep(0.005)  # (polling with a deadline: the consumer's thread gives no signal)
            waiting_from = nsqd.now()
            assert 29 <= nsqd.next_deadline_in() <= 30
            proxy.heal()
            nsqd.wait_until("orders", "billing", client_count=1, timeout=10)  # the broker skipped to it
            assert nsqd.now() - waiting_from >= 29
            with Producer(nsqd.tcp_address) as producer:
                producer.pub("orders", b"after the cut")
            consumer.get(timeout=5).fin()


def test_a_daemon_with_time_skipping_auto_over_plain_tcp(tmp_path):
    """What a suite in another language does: start the daemon with --time-skipping=auto, DPUB an hour."""
    with BrokerProcess("--time-skipping=auto", tmp_dir=str(tmp_path)) as nsqd:
        sock = socket.create_connection(nsqd.tcp_address, timeout=10)
        try:
            sock.sendall(b"  V2SUB orders billing\nRDY 1\n")
            body = b"in an hour"
            pub = socket.create_connection(nsqd.tcp_address, timeout=10)
            pub.sendall(b"  V2DPUB orders 3600000\n" + struct.pack(">i", len(body)) + body)
            assert _frame(pub) == (0, b"OK")
            pub.close()
            assert _frame(sock) == (0, b"OK")  # the SUB's
            started = time.monotonic()
            kind, data = _frame(sock)
            while (kind, data) == (0, b"_heartbeat_"):  # what the skipped hour brought: answered, as clients do
                sock.sendall(b"NOP\n")
                kind, data = _frame(sock)
            assert kind == 2 and data.endswith(body)
            assert time.monotonic() - started < 10
        finally:
            sock.close()


def _frame(sock):
    head = _exactly(sock, 8)
    size, kind = struct.unpack(">ii", head)
    return kind, _exactly(sock, size - 4)


def _exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(data), n))
        data += chunk
    return data
