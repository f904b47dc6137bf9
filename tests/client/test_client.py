"""nsqd_threaded.client: Producer and Consumer against a real broker, every command and error path."""

import concurrent.futures
import socket
import threading
import time

import pytest

from nsqd_threaded.client import USER_AGENT, ConnectionClosed, Consumer, NSQError, Producer, ReceivedMessage
from nsqd_threaded.testing import Broker, BrokerProcess

from support.wire import SilentNSQD, wait_for


@pytest.fixture
def broker():
    with Broker() as b:
        yield b


@pytest.fixture
def make_broker():
    started = []

    def make(*flags, **options):
        b = Broker(*flags, **options).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


def channel_stats(broker, topic, channel):
    for t in broker.stats(topic=topic)["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    return None


def topic_stats(broker, topic):
    topics = broker.stats(topic=topic)["topics"]
    return topics[0] if topics else None


def broker_clients(broker):
    return broker.nsqd.clients()


def subscribed_clients(broker):
    """The broker's consumer connections (a producer's may still be closing)."""
    return [c for c in broker.nsqd.clients() if c.channel is not None]


class Errors(list):
    """An on_error sink that can be waited on."""

    def __init__(self):
        super().__init__()
        self._cond = threading.Condition()

    def __call__(self, error):
        with self._cond:
            self.append(error)
            self._cond.notify_all()

    def wait(self, n=1, timeout=10.0):
        with self._cond:
            assert self._cond.wait_for(lambda: len(self) >= n, timeout), "only %d errors: %r" % (len(self), self)
        return self


def raises_nsq(code, description, fatal=True):
    """Check an NSQError exactly."""

    class Check:
        def __init__(self):
            self.info = pytest.raises(NSQError)

        def __enter__(self):
            self.ctx = self.info.__enter__()
            return self.ctx

        def __exit__(self, *exc):
            result = self.info.__exit__(*exc)
            err = self.ctx.value
            assert (err.code, err.description, err.fatal) == (code, description, fatal)
            return result

    return Check()


# -- Producer ----------------------------------------------------------------------


def test_pub_mpub_dpub_deliver(broker):
    with Producer(broker.tcp_address) as p:
        p.pub("t", b"one")
        p.pub("t", "two")  # str bodies are UTF-8
        p.mpub("t", [b"three", "four"])
        started = time.monotonic()
        p.dpub("t", 300, b"deferred")
    with Consumer(broker.tcp_address, "t", "c", max_in_flight=10) as c:
        bodies = []
        for _ in range(5):
            msg = c.get(timeout=10)
            bodies.append(msg.body)
            if msg.body == b"deferred":
                assert time.monotonic() - started >= 0.29
            msg.fin()
    assert bodies == [b"one", b"two", b"three", b"four", b"deferred"]
    assert topic_stats(broker, "t")["message_count"] == 5


def test_producer_identifies_itself(broker):
    with Producer(broker.tcp_address, identify={"client_id": "my-producer"}) as p:
        p.pub("t", b"x")
        (client,) = broker_clients(broker)
        assert (client.client_id, client.user_agent) == ("my-producer", USER_AGENT)
        assert client.pub_counts == {"t": 1}


def test_string_and_tuple_addresses(broker):
    for address in (broker.tcp_address, broker.tcp_addr, list(broker.tcp_address)):
        with Producer(address) as p:
            p.pub("t", b"x")
    with pytest.raises(ValueError, match="invalid nsqd address"):
        Producer("localhost")


def test_pub_errors_are_exact_and_the_next_request_reconnects(make_broker):
    broker = make_broker(max_msg_size=10)
    with Producer(broker.tcp_address) as p:
        with raises_nsq("E_BAD_TOPIC", 'PUB topic name "bad!" is not valid'):
            p.pub("bad!", b"x")
        p.pub("t", b"ok")  # a new connection
        with raises_nsq("E_BAD_MESSAGE", "PUB invalid message body size 0"):
            p.pub("t", b"")
        with raises_nsq("E_BAD_MESSAGE", "PUB message too big 11 > 10"):
            p.pub("t", b"x" * 11)
        p.pub("t", b"x" * 10)  # equal is allowed
        with raises_nsq("E_BAD_TOPIC", 'DPUB topic name "bad!" is not valid'):
            p.dpub("bad!", 0, b"x")
        with raises_nsq("E_INVALID", "DPUB timeout 3600001 out of range 0-3600000"):
            p.dpub("t", 3600001, b"x")
        with raises_nsq("E_INVALID", "DPUB could not parse timeout -1"):
            p.dpub("t", -1, b"x")
        with raises_nsq("E_BAD_MESSAGE", "DPUB invalid message body size 0"):
            p.dpub("t", 10, b"")
        p.dpub("t", 0, b"now")
    assert topic_stats(broker, "t")["message_count"] == 3


def test_mpub_errors_are_exact(make_broker):
    broker = make_broker(max_msg_size=10, max_body_size=200)  # IDENTIFY's body must fit too
    with Producer(broker.tcp_address) as p:
        with raises_nsq("E_BAD_TOPIC", 'E_BAD_TOPIC MPUB topic name "bad!" is not valid'):
            p.mpub("bad!", [b"x"])
        with raises_nsq("E_BAD_BODY", "MPUB invalid message count 0"):
            p.mpub("t", [])
        with raises_nsq("E_BAD_MESSAGE", "MPUB invalid message(1) body size 0"):
            p.mpub("t", [b"a", b""])
        with raises_nsq("E_BAD_MESSAGE", "MPUB message too big 11 > 10"):
            p.mpub("t", [b"a", b"x" * 11])
        with raises_nsq("E_BAD_BODY", "MPUB body too big 214 > 200"):
            p.mpub("t", [b"x" * 10] * 15)
        p.mpub("t", [b"a", b"b"])
    assert topic_stats(broker, "t")["message_count"] == 2


def test_names_that_would_break_the_command_line_are_refused_locally(broker):
    with Producer(broker.tcp_address) as p:
        for name in ("a b", "a\nPUB b", "a\r"):
            with pytest.raises(ValueError, match="cannot contain"):
                p.pub(name, b"x")
        p.pub("t", b"still fine")


def test_pipelined_answers_are_matched_in_order_around_a_fatal_error(broker):
    with Producer(broker.tcp_address) as p:
        p.connect()
        futures = [p.pub_async("t", b"1"), p.pub_async("bad!", b"2"), p.pub_async("t", b"3")]
        assert futures[0].result(10) == b"OK"
        with raises_nsq("E_BAD_TOPIC", 'PUB topic name "bad!" is not valid'):
            futures[1].result(10)
        with pytest.raises(ConnectionClosed, match="ended before the answer"):
            futures[2].result(10)
        p.pub("t", b"4")
    assert topic_stats(broker, "t")["message_count"] == 2


def test_many_threads_share_one_pipelined_connection(broker):
    threads, per_thread = 8, 150
    with Producer(broker.tcp_address) as p:

        def publish(i):
            for j in range(per_thread):
                if j % 10 == 0:
                    p.mpub("t", [b"%d-%d-a" % (i, j), b"%d-%d-b" % (i, j)])
                else:
                    p.pub("t", b"%d-%d" % (i, j))

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(publish, range(threads)))
        assert len(broker_clients(broker)) == 1
        futures = [p.pub_async("t", b"async-%d" % i) for i in range(200)]
        assert [f.result(10) for f in futures] == [b"OK"] * 200
    expected = threads * (per_thread + per_thread // 10) + 200
    assert topic_stats(broker, "t")["message_count"] == expected


def test_producer_answers_heartbeats(broker):
    with Producer(broker.tcp_address, identify={"heartbeat_interval": 1000}) as p:
        p.pub("t", b"x")
        (client,) = broker_clients(broker)
        # nsqd drops a client that is silent for 2 heartbeat intervals
        wait_for(lambda: p.heartbeats >= 3, timeout=10, what="3 heartbeats")
        p.pub("t", b"y")
        assert [c.id for c in broker_clients(broker)] == [client.id]


def test_producer_identify_errors_are_raised_on_connect(broker):
    with raises_nsq("E_BAD_BODY", "IDENTIFY heartbeat interval (10) is invalid"):
        Producer(broker.tcp_address, identify={"heartbeat_interval": 10}).connect()
    p = Producer(broker.tcp_address, identify={"msg_timeout": 1})
    with raises_nsq("E_BAD_BODY", "IDENTIFY msg timeout (1) is invalid"):
        p.pub("t", b"x")
    p.close()


def test_producer_reconnects_after_the_broker_restarts(broker):
    with Producer(broker.tcp_address) as p:
        p.pub("t", b"before")
        broker.restart()
        wait_for(lambda: not p.connected, timeout=10, what="the producer to notice")
        p.pub("t", b"after")
    assert topic_stats(broker, "t")["message_count"] == 1


def test_producer_connection_refused_and_timeouts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = s.getsockname()
    with pytest.raises(ConnectionRefusedError):
        Producer(address).pub("t", b"x")
    # A server that accepts but never answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="no answer from nsqd"):
            Producer(silent.getsockname(), timeout=0.3).connect()
        assert time.monotonic() - started < 5


def test_request_timeout():
    # A fake nsqd that reads the PUB and never answers: the timeout, not the broker's speed, decides.
    fake = SilentNSQD(hold=True)
    try:
        with Producer(fake.address) as p:
            with pytest.raises(TimeoutError, match="no answer"):
                p.pub("t", b"never answered", timeout=0.2)
            assert fake.got_pub.is_set()
    finally:
        fake.close()


def test_closed_producer_refuses_requests_and_close_waits_for_answers(broker):
    p = Producer(broker.tcp_address)
    futures = [p.pub_async("t", b"%d" % i) for i in range(50)]
    p.close()
    assert all(f.done() and f.result() == b"OK" for f in futures)
    with pytest.raises(ConnectionClosed, match="producer is closed"):
        p.pub("t", b"x")
    assert topic_stats(broker, "t")["message_count"] == 50
    assert not [t for t in threading.enumerate() if t.name.startswith("nsq-producer")]


# -- Consumer ----------------------------------------------------------------------


def test_consumer_sends_identify_sub_and_rdy_max_in_flight(broker):
    identify = {"client_id": "reader-1", "msg_timeout": 5000, "heartbeat_interval": 2000}
    with Consumer(broker.tcp_address, "t", "c", max_in_flight=7, identify=identify) as c:
        assert c.subscribed == [broker.tcp_address]
        (client,) = broker_clients(broker)
        wait_for(lambda: client.ready_count == 7, what="RDY 7")  # RDY has no answer
        assert (client.client_id, client.user_agent) == ("reader-1", USER_AGENT)
        assert (client.msg_timeout_ns, client.heartbeat_interval) == (5000 * 10**6, 2.0)
        assert channel_stats(broker, "t", "c")["clients"][0]["state"] == 3  # subscribed


def test_consumer_flow_control_is_max_in_flight(broker):
    with Producer(broker.tcp_address) as p:
        p.mpub("t", [b"%d" % i for i in range(10)])
    with Consumer(broker.tcp_address, "t", "c", max_in_flight=3) as c:
        held = [c.get(timeout=10) for _ in range(3)]
        assert [m.attempts for m in held] == [1, 1, 1]
        with pytest.raises(TimeoutError):
            c.get(timeout=0.3)  # nsqd sends no 4th while 3 are in flight
        assert channel_stats(broker, "t", "c")["in_flight_count"] == 3
        held[0].fin()
        fourth = c.get(timeout=10)
        for m in held[1:] + [fourth]:
            m.fin()
        rest = []
        for _ in range(6):
            rest.append(c.get(timeout=10))
            rest[-1].fin()
        assert sorted(m.body for m in held + [fourth] + rest) == sorted(b"%d" % i for i in range(10))
        wait_for(lambda: channel_stats(broker, "t", "c")["in_flight_count"] == 0, what="all finished")


def test_max_in_flight_is_capped_at_max_rdy_count(make_broker):
    broker = make_broker(max_rdy_count=5)
    errors = Errors()
    with Consumer(broker.tcp_address, "t", "c", max_in_flight=50, on_error=errors) as c:
        (client,) = broker_clients(broker)
        wait_for(lambda: client.ready_count == 5, what="RDY 5")  # RDY has no answer
        with Producer(broker.tcp_address) as p:
            p.pub("t", b"x")
        c.get(timeout=10).fin()
    assert errors == []


def test_handler_mode_fin_req_and_exceptions(broker):
    seen = []
    done = threading.Event()

    def handler(msg):
        seen.append((msg.body, msg.attempts))
        if msg.body == b"req" and msg.attempts == 1:
            return False  # REQ
        if msg.body == b"raise" and msg.attempts == 1:
            raise RuntimeError("handler failed")  # REQ too
        if len(seen) == 5:
            done.set()
        return None  # FIN

    with Producer(broker.tcp_address) as p:
        p.mpub("t", [b"ok", b"req", b"raise"])
    with Consumer(broker.tcp_address, "t", "c", handler, max_in_flight=3):
        assert done.wait(10)
        wait_for(lambda: channel_stats(broker, "t", "c")["in_flight_count"] == 0, what="all finished")
    assert sorted(seen) == [(b"ok", 1), (b"raise", 1), (b"raise", 2), (b"req", 1), (b"req", 2)]
    stats = channel_stats(broker, "t", "c")
    assert (stats["depth"], stats["requeue_count"], stats["message_count"]) == (0, 2, 3)


def test_handler_threads_process_everything_once(broker):
    n = 500
    seen = []
    lock = threading.Lock()
    done = threading.Event()
    workers = set()

    def handler(msg):
        with lock:
            seen.append(msg.body)
            workers.add(threading.current_thread().name)
            if len(seen) == n:
                done.set()

    with Consumer(broker.tcp_address, "t", "c", handler, max_in_flight=50, concurrency=4):
        with Producer(broker.tcp_address) as p:
            for i in range(0, n, 100):
                p.mpub("t", [b"%03d" % j for j in range(i, i + 100)])
        assert done.wait(30)
        wait_for(lambda: channel_stats(broker, "t", "c")["in_flight_count"] == 0, what="all finished")
    assert sorted(seen) == [b"%03d" % j for j in range(n)]
    assert len(workers) >= 1 and all(w.startswith("nsq-handler[t/c") for w in workers)


@pytest.mark.parametrize("transport", [{}, {"deflate": True}, {"snappy": True}], ids=["plain", "deflate", "snappy"])
def test_many_handler_threads_answering_at_once_lose_no_fin(broker, transport):
    """FINs posted by 32 threads on one connection (a writer sends the others' with its own) all arrive."""
    n = 3000
    with Producer(broker.tcp_address) as p:
        for i in range(0, n, 500):
            p.mpub("t", [b"%04d" % j for j in range(i, i + 500)])
    with Consumer(broker.tcp_address, "t", "c", lambda msg: None, max_in_flight=200, concurrency=32, **transport):
        wait_for(lambda: (lambda c: (c["depth"], c["in_flight_count"]) == (0, 0))(channel_stats(broker, "t", "c")),
                 timeout=60, what="every message FINed")
    stats = channel_stats(broker, "t", "c")
    assert (stats["message_count"], stats["requeue_count"], stats["timeout_count"]) == (n, 0, 0)


def test_async_handler_answers_later(broker):
    answered = threading.Event()

    def handler(msg):
        msg.enable_async()
        threading.Timer(0.05, lambda: (msg.fin(), answered.set())).start()

    with Producer(broker.tcp_address) as p:
        p.pub("t", b"x")
    with Consumer(broker.tcp_address, "t", "c", handler):
        assert answered.wait(10)
        wait_for(lambda: channel_stats(broker, "t", "c")["in_flight_count"] == 0, what="FIN")
    stats = channel_stats(broker, "t", "c")
    assert (stats["requeue_count"], stats["depth"]) == (0, 0)


def test_req_with_delay(broker):
    with Producer(broker.tcp_address) as p:
        p.pub("t", b"x")
    with Consumer(broker.tcp_address, "t", "c") as c:
        msg = c.get(timeout=10)
        requeued = time.monotonic()
        msg.req(400)
        wait_for(lambda: channel_stats(broker, "t", "c")["deferred_count"] == 1, what="deferred")  # no answer
        again = c.get(timeout=10)
        assert time.monotonic() - requeued >= 0.39
        assert (again.id, again.attempts, again.body) == (msg.id, 2, b"x")
        again.fin()


def test_touch_keeps_a_message_in_flight(broker):
    with Producer(broker.tcp_address) as p:
        p.pub("t", b"x")
    with Consumer(broker.tcp_address, "t", "c", identify={"msg_timeout": 1000}) as c:
        msg = c.get(timeout=10)
        held_until = time.monotonic() + 1.8
        while time.monotonic() < held_until:
            msg.touch()
            with pytest.raises(TimeoutError):
                c.get(timeout=0.3)  # not redelivered
        assert channel_stats(broker, "t", "c")["timeout_count"] == 0
        msg.fin()
        # Untouched, a message times out and comes back with attempts 2.
        with Producer(broker.tcp_address) as p:
            p.pub("t", b"y")
        first = c.get(timeout=10)
        second = c.get(timeout=10)
        assert (second.id, second.attempts) == (first.id, 2)
        second.fin()
    assert channel_stats(broker, "t", "c")["timeout_count"] == 1


def test_fin_req_touch_failures_are_non_fatal_and_reported(broker):
    errors = Errors()
    with Producer(broker.tcp_address) as p:
        p.mpub("t", [b"1", b"2"])
    with Consumer(broker.tcp_address, "t", "c", on_error=errors) as c:
        (client,) = subscribed_clients(broker)
        msg = c.get(timeout=10)
        msg.fin()
        msg.fin()
        msg.req(0)
        msg.touch()
        bogus = ReceivedMessage(b"\0" * 10 + b"0000000000000000" + b"body", msg.connection)
        bogus.fin()
        errors.wait(4)
        mid = msg.id.decode()
        assert [(e.code, e.description, e.fatal) for e in errors] == [
            ("E_FIN_FAILED", "FIN %s failed ID not in flight" % mid, False),
            ("E_REQ_FAILED", "REQ %s failed ID not in flight" % mid, False),
            ("E_TOUCH_FAILED", "TOUCH %s failed ID not in flight" % mid, False),
            ("E_FIN_FAILED", "FIN 0000000000000000 failed ID not in flight", False),
        ]
        assert errors[0].address == broker.tcp_address
        # Still the same connection, still delivering.
        c.get(timeout=10).fin()
        assert [x.id for x in subscribed_clients(broker)] == [client.id]
        assert c.subscribed == [broker.tcp_address]


@pytest.mark.parametrize(
    "topic, channel, options, code, description",
    [
        ("bad!", "c", {}, "E_BAD_TOPIC", 'SUB topic name "bad!" is not valid'),
        ("t", "bad!", {}, "E_BAD_CHANNEL", 'SUB channel name "bad!" is not valid'),
        ("t", "c", {"identify": {"heartbeat_interval": -1}}, "E_INVALID", "cannot SUB with heartbeats disabled"),
        ("t", "c", {"identify": {"heartbeat_interval": 999}}, "E_BAD_BODY", "IDENTIFY heartbeat interval (999) is invalid"),
        ("t", "c", {"identify": {"msg_timeout": 999}}, "E_BAD_BODY", "IDENTIFY msg timeout (999) is invalid"),
        ("t", "c", {"identify": {"sample_rate": 100}}, "E_BAD_BODY", "IDENTIFY sample rate (100) is invalid"),
    ],
)
def test_consumer_start_raises_fatal_errors(broker, topic, channel, options, code, description):
    before = set(threading.enumerate())
    consumer = Consumer(broker.tcp_address, topic, channel, **options)
    with raises_nsq(code, description):
        consumer.start()
    assert [t for t in threading.enumerate() if t not in before and t.name.startswith("nsq-")] == []


def test_consumer_limit_is_e_sub_failed(make_broker):
    broker = make_broker(max_channel_consumers=1)
    with Consumer(broker.tcp_address, "t", "c"):
        with raises_nsq("E_SUB_FAILED", "SUB failed consumers for t:c exceeds limit of 1"):
            Consumer(broker.tcp_address, "t", "c").start()


def test_consumer_connection_refused_and_bad_arguments():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = s.getsockname()
    with pytest.raises(ConnectionRefusedError):
        Consumer(address, "t", "c").start()
    with pytest.raises(ValueError):
        Consumer(address, "a b", "c")
    with pytest.raises(ValueError):
        Consumer(address, "t", "c", max_in_flight=-1)
    # 0 would subscribe and never receive anything: refused with why.
    with pytest.raises(ValueError, match=r"max_in_flight must be >= 1 \(it is 0\): with 0 no message would ever"):
        Consumer(address, "t", "c", max_in_flight=0)
    with pytest.raises(ValueError):
        Consumer([], "t", "c")


def test_consumer_answers_heartbeats(broker):
    with Consumer(broker.tcp_address, "t", "c", identify={"heartbeat_interval": 1000}) as c:
        (client,) = broker_clients(broker)
        wait_for(lambda: c.heartbeats >= 3, timeout=10, what="3 heartbeats")
        with Producer(broker.tcp_address) as p:
            p.pub("t", b"x")
        c.get(timeout=10).fin()
        assert client.id in [x.id for x in broker_clients(broker)]


def test_consumer_reconnects_after_a_restart(broker):
    errors = Errors()
    with Consumer(broker.tcp_address, "t", "c", on_error=errors, reconnect_backoff=(0.05, 0.5)) as c:
        broker.restart()
        wait_for(lambda: len(broker_clients(broker)) == 1, what="a connection to the new broker")
        assert c.wait_subscribed(timeout=10)
        with Producer(broker.tcp_address) as p:
            p.pub("t", b"after restart")
        msg = c.get(timeout=10)
        assert msg.body == b"after restart"
        msg.fin()
        (client,) = subscribed_clients(broker)
        assert client.ready_count == 1  # RDY sent again after the new SUB


def test_consumer_backs_off_while_the_broker_is_down_and_survives_a_crash(tmp_path):
    errors = Errors()
    with BrokerProcess(tmp_dir=str(tmp_path)) as nsqd:
        with Consumer(nsqd.tcp_address, "t", "c", on_error=errors, reconnect_backoff=(0.05, 0.2)) as c:
            nsqd.kill()
            assert wait_for(lambda: c.subscribed == [], what="the loss")
            errors.wait(3)  # three failed reconnections, with backoff in between
            assert all(isinstance(e, ConnectionError) for e in errors), errors  # refused (or reset)
            nsqd.restart()
            assert c.wait_subscribed(timeout=10)
            with Producer(nsqd.tcp_address) as p:
                p.pub("t", b"after crash")
            msg = c.get(timeout=10)
            assert msg.body == b"after crash"
            msg.fin()


def test_consumer_reads_from_several_brokers(make_broker):
    a, b = make_broker(), make_broker()
    got = []
    lock = threading.Lock()
    done = threading.Event()

    def handler(msg):
        with lock:
            got.append(msg.body)
            if len(got) == 20:
                done.set()

    with Consumer([a.tcp_addr, b.tcp_address], "t", "c", handler, max_in_flight=5) as c:
        assert c.subscribed == sorted([a.tcp_address, b.tcp_address])
        wait_for(lambda: sorted(cl.ready_count for x in (a, b) for cl in broker_clients(x)) == [2, 3], what="RDY")
        for i, x in enumerate((a, b)):
            with Producer(x.tcp_address) as p:
                p.mpub("t", [b"%d-%d" % (i, j) for j in range(10)])
        assert done.wait(10)
    assert sorted(got) == sorted(b"%d-%d" % (i, j) for i in range(2) for j in range(10))


def test_close_sends_cls_and_requeues_what_nobody_took(broker):
    with Producer(broker.tcp_address) as p:
        p.mpub("t", [b"%d" % i for i in range(5)])
    c = Consumer(broker.tcp_address, "t", "c", max_in_flight=5).start()
    held = c.get(timeout=10)
    wait_for(lambda: c._queue.qsize() == 4, what="all 5 delivered")
    started = time.monotonic()
    c.close(timeout=5)
    assert time.monotonic() - started < 2  # CLOSE_WAIT came: no waiting for the timeout
    assert not [t for t in threading.enumerate() if t.name.startswith(("nsq-consumer", "nsq-handler"))]
    stats = wait_for(lambda: (lambda s: s if s["in_flight_count"] == 0 else None)(channel_stats(broker, "t", "c")))
    assert stats["depth"] == 5 and stats["requeue_count"] >= 4
    with pytest.raises(ConnectionClosed):
        held.fin()  # its connection is gone (nsqd has requeued it)
    with pytest.raises(ConnectionClosed, match="consumer is closed"):
        c.get(timeout=1)


def test_iteration_ends_when_closed_from_another_thread(broker):
    with Producer(broker.tcp_address) as p:
        p.mpub("t", [b"a", b"b"])
    c = Consumer(broker.tcp_address, "t", "c", max_in_flight=2).start()
    bodies = []
    closer = threading.Thread(target=c.close, name="test-closer", daemon=True)
    for msg in c:
        bodies.append(msg.body)
        msg.fin()
        if len(bodies) == 2:
            closer.start()
    closer.join(10)
    assert sorted(bodies) == [b"a", b"b"] and not closer.is_alive()


def test_handler_mode_has_no_iterator(broker):
    with Consumer(broker.tcp_address, "t", "c", lambda m: None) as c:
        with pytest.raises(RuntimeError):
            c.get(timeout=0.1)
        with pytest.raises(RuntimeError):
            iter(c).__next__()
