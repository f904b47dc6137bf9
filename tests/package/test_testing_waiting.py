"""Broker.wait_until and Broker.messages (and BrokerProcess's, over HTTP): waiting on a broker's state."""

import threading
import time

import pytest

from nsqd_threaded.broker import watch
from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.testing import Broker, BrokerProcess

from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def no_recheck(monkeypatch):
    """A waiter looks again only when notified (no timed re-check within a test's time):
    a change the broker does not notify would leave wait_until to time out."""
    monkeypatch.setattr(watch, "RECHECK_INTERVAL", 300.0)


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_dir=str(tmp_path), mem_queue_size=2) as nsqd:
        yield nsqd


@pytest.fixture
def broker_process(tmp_path):
    with BrokerProcess(tmp_dir=str(tmp_path), mem_queue_size=2) as nsqd:
        yield nsqd


def woken(nsqd, *args, **expected):
    """wait_until with a 60 s timeout, which must end by a notification: well before its deadline
    (its last look, at the deadline, would succeed too; that is not what this checks)."""
    start = time.monotonic()
    found = nsqd.wait_until(*args, timeout=60, **expected)
    assert time.monotonic() - start < 30, "wait_until was not woken by the change"
    return found


def in_a_thread_once_waited_on(nsqd, action):
    """Run ``action`` in a thread as soon as a wait_until is registered with ``nsqd``'s broker."""
    errors = []

    def run():
        try:
            wait_for(lambda: nsqd.nsqd.watch.watchers, what="a waiter")
            action()
        except BaseException as e:  # reported by the test's thread
            errors.append(e)

    thread = threading.Thread(target=run, name="test-acts-while-waited-on", daemon=True)
    thread.start()
    return thread, errors


def test_wait_until_a_topic_that_does_not_exist_yet(broker, no_recheck):
    def publish():
        with Producer(broker.tcp_address) as producer:
            producer.mpub("later", [b"a", b"b", b"c"])

    thread, errors = in_a_thread_once_waited_on(broker, publish)
    try:
        found = woken(broker, "later", depth=3, message_count=3)
    finally:
        thread.join(30)
    assert not errors
    assert (found["topic_name"], found["depth"]) == ("later", 3)
    assert broker.nsqd.watch.watchers == 0


def test_wait_until_a_channel_that_does_not_exist_yet(broker, no_recheck):
    def subscribe_and_publish():
        with Producer(broker.tcp_address) as producer:
            producer.pub("orders", b"x")
        consumer = Consumer(broker.tcp_address, "orders", "billing").start()
        consumer.get(timeout=30).fin()
        consumer.close()

    thread, errors = in_a_thread_once_waited_on(broker, subscribe_and_publish)
    try:
        found = woken(broker, "orders", "billing", message_count=1, depth=0, in_flight_count=0)
    finally:
        thread.join(30)
    assert not errors
    assert found["channel_name"] == "billing"


def test_wait_until_returns_when_a_consumer_fins(broker, no_recheck):
    with Producer(broker.tcp_address) as producer:
        producer.pub("orders", b"x")
    with Consumer(broker.tcp_address, "orders", "billing") as consumer:
        message = consumer.get(timeout=30)
        assert broker.wait_until("orders", "billing", in_flight_count=1, depth=0)["in_flight_count"] == 1
        message.fin()  # FIN has no answer: the broker handles it after this returns
        found = woken(broker, "orders", "billing", in_flight_count=0)
    assert (found["depth"], found["in_flight_count"], found["requeue_count"]) == (0, 0, 0)


def test_wait_until_sees_timeouts_and_deferred_messages_come_due(tmp_path, no_recheck):
    with Broker(tmp_dir=str(tmp_path), msg_timeout=0.2, queue_scan_interval=0.05) as nsqd:
        with Producer(nsqd.tcp_address) as producer, Conn(nsqd.tcp_address) as consumer:
            producer.pub("orders", b"x")
            consumer.sub("orders", "billing", rdy=1)
            consumer.read_message()  # held until it times out
            consumer.cmd(b"RDY 0")  # not delivered again once it times out
            woken(nsqd, "orders", "billing", timeout_count=1, in_flight_count=0, depth=1)
            producer.dpub("orders", 100, b"soon")
            woken(nsqd, "orders", "billing", deferred_count=0, depth=2)


def test_the_timeout_names_each_field_s_last_value(broker):
    with pytest.raises(TimeoutError) as info:
        broker.wait_until("nothing", "here", timeout=0.05, depth=0)
    assert str(info.value) == "topic 'nothing' channel 'here': not as expected after 0.05s: it does not exist"
    with Producer(broker.tcp_address) as producer:
        producer.pub("orders", b"x")
    broker.http("POST", "/channel/create?topic=orders&channel=billing")
    broker.wait_until("orders", "billing", depth=1)
    with pytest.raises(TimeoutError) as info:
        broker.wait_until("orders", "billing", timeout=0.05, depth=0, in_flight_count=0, nonsense=1)
    assert str(info.value) == (
        "topic 'orders' channel 'billing': not as expected after 0.05s: depth=1 (expected 0), "
        "in_flight_count=0 (expected 0), nonsense=<no such field> (expected 1)")


def publish_every_kind(nsqd):
    """Channel "billing" of "orders" (memory queue of 2) gets: a message in flight, one deferred,
    two queued in memory and two on disk.  Returns the consumer holding the first one."""
    nsqd.http("POST", "/topic/create?topic=orders")
    nsqd.http("POST", "/channel/create?topic=orders&channel=billing")
    with Producer(nsqd.tcp_address) as producer:
        producer.pub("orders", b"held")
        consumer = Consumer(nsqd.tcp_address, "orders", "billing").start()
        held = consumer.get(timeout=30)
        producer.dpub("orders", 600000, b"deferred")
        producer.mpub("orders", [b"m1", b"m2", b"d1", b"d2"])
    nsqd.wait_until("orders", "billing", timeout=60, depth=4, in_flight_count=1, deferred_count=1,
                    backend_depth=2)
    return consumer, held


@pytest.mark.parametrize("kind", ["in-process", "process"])
def test_messages_lists_every_message_in_delivery_order_and_consumes_nothing(request, kind):
    nsqd = request.getfixturevalue("broker" if kind == "in-process" else "broker_process")
    with pytest.raises(LookupError, match="topic 'orders' does not exist"):
        nsqd.messages("orders", "billing")
    nsqd.create("orders", "billing")
    assert nsqd.messages("orders", "billing") == []  # an empty channel
    with pytest.raises(LookupError, match="channel 'other' of topic 'orders' does not exist"):
        nsqd.messages("orders", "other")
    consumer, held = publish_every_kind(nsqd)
    try:
        listed = nsqd.messages("orders", "billing")
        assert [(m.body, m.state) for m in listed] == [
            (b"m1", "queued"), (b"m2", "queued"), (b"d1", "queued"), (b"d2", "queued"),
            (b"held", "in_flight"), (b"deferred", "deferred")]
        assert [m.due_ns is None for m in listed] == [True] * 4 + [False] * 2
        assert [m.due_in is None for m in listed] == [True] * 4 + [False] * 2
        assert 0 < listed[5].due_in <= 600  # the DPUB's 600 s, counted on the broker's clock
        assert listed[5].due_ns == pytest.approx(nsqd.now() * 1e9 + listed[5].due_in * 1e9, abs=2e9)
        assert listed[4].id == held.id.decode() and listed[4].attempts == 1
        assert all(len(m.id) == 16 and m.timestamp > 0 for m in listed)
        assert nsqd.messages("orders", "billing") == listed  # nothing moved
    finally:
        consumer.close()  # (the message it held goes back to the tail of the queue)
    nsqd.wait_until("orders", "billing", timeout=60, in_flight_count=0, depth=5)
    # a consumer afterwards still gets every message, the queued ones in the order listed
    with Consumer(nsqd.tcp_address, "orders", "billing", max_in_flight=10) as consumer:
        got = [consumer.get(timeout=30) for _ in range(5)]
        for m in got:
            m.fin()
    assert [(m.id.decode(), m.body) for m in got] == [(m.id, m.body) for m in listed[:5]]


def test_broker_process_wait_until_polls_stats_over_http(broker_process):
    with pytest.raises(TimeoutError, match="it does not exist"):
        broker_process.wait_until("orders", "billing", timeout=0.05)
    with Producer(broker_process.tcp_address) as producer:
        producer.pub("orders", b"x")
    assert broker_process.wait_until("orders", timeout=60, depth=1)["topic_name"] == "orders"
    with Consumer(broker_process.tcp_address, "orders", "billing") as consumer:
        message = consumer.get(timeout=30)
        message.fin()
        found = broker_process.wait_until("orders", "billing", timeout=60, in_flight_count=0, message_count=1)
    assert found["depth"] == 0
    with pytest.raises(TimeoutError) as info:
        broker_process.wait_until("orders", "billing", timeout=0.05, depth=7)
    assert str(info.value).endswith("depth=0 (expected 7)")


def test_broker_process_wait_until_while_it_restarts(broker_process):
    with Producer(broker_process.tcp_address) as producer:
        producer.pub("orders", b"x")
    broker_process.terminate()  # graceful: the message is flushed to disk
    with pytest.raises(TimeoutError, match="the broker did not answer"):
        broker_process.wait_until("orders", timeout=0.05, depth=1)
    broker_process.restart()
    assert broker_process.wait_until("orders", timeout=60, depth=1)["depth"] == 1


def test_wait_until_sees_pauses_and_an_emptied_channel(broker, no_recheck):
    with Producer(broker.tcp_address) as producer:
        producer.pub("orders", b"x")
    broker.http("POST", "/channel/create?topic=orders&channel=billing")
    broker.wait_until("orders", "billing", depth=1)
    for path, args, expected in [
        ("/topic/pause?topic=orders", ("orders",), {"paused": True}),
        ("/channel/pause?topic=orders&channel=billing", ("orders", "billing"), {"paused": True}),
        ("/channel/empty?topic=orders&channel=billing", ("orders", "billing"), {"depth": 0}),
    ]:
        thread, errors = in_a_thread_once_waited_on(broker, lambda: broker.http("POST", path))
        try:
            woken(broker, *args, **expected)
        finally:
            thread.join(30)
        assert not errors
