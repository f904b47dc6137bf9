"""The client across a cluster: a Producer over several nsqd, a Consumer finding nsqd through nsqlookupd.

Real brokers (child processes where one is SIGKILLed), our nsqlookupd, and pynsq's Reader.
"""

import contextlib
import threading
import time

import pytest

from nsqd_threaded.client import ConnectionClosed, Consumer, Producer
from nsqd_threaded.testing import BrokerProcess, Cluster, Lookupd

from support.hostile import HostileNode
from support.pynsq import Loop
from support.wire import SilentNSQD, wait_for

pytestmark = pytest.mark.timeout(120)


def wait_until(predicate, timeout=30.0, what="condition"):
    return wait_for(predicate, timeout, interval=0.005, what=what)


def create(broker, topic, channel=None):
    assert broker.http("POST", "/topic/create?topic=" + topic)[0] == 200
    if channel is not None:
        assert broker.http("POST", "/channel/create?topic=%s&channel=%s" % (topic, channel))[0] == 200


def message_count(broker, topic):
    for t in broker.stats(topic=topic)["topics"]:
        if t["topic_name"] == topic:
            return t["message_count"]
    return 0


def ready_counts(broker, topic, channel):
    """The RDY of each client of ``topic/channel`` as nsqd sees it."""
    for t in broker.stats(topic=topic, channel=channel)["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return [client["ready_count"] for client in c["clients"]]
    return []


def consume_all(addresses, topic, channel, wanted, timeout=60.0):
    """Consume ``topic/channel`` from ``addresses`` until every body of ``wanted`` was seen; the bodies seen."""
    seen = set()
    with Consumer(addresses, topic, channel, max_in_flight=100) as consumer:
        deadline = time.monotonic() + timeout
        while not wanted <= seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "%d acknowledged messages never consumed" % len(wanted - seen)
            try:
                msg = consumer.get(timeout=remaining)
            except TimeoutError:
                continue
            seen.add(msg.body)
            msg.fin()
    return seen


# -- Producer -------------------------------------------------------------------------


def test_producer_keeps_publishing_through_a_sigkill_and_restart():
    # --mem-queue-size=0: an acknowledged message is on disk, so a SIGKILL loses none that
    # nobody consumed yet.
    with Cluster(3, processes=True, mem_queue_size=0) as cluster:
        for broker in cluster:
            create(broker, "ha", "c")
        acked, failures = [], []
        acked_lock = threading.Lock()  # guards acked
        stop = threading.Event()

        def publish(name):
            with Producer(cluster.tcp_addrs, reconnect_backoff=(0.02, 0.2)) as producer:
                i = 0
                while not stop.is_set():
                    body = b"%s-%06d" % (name, i)
                    i += 1
                    try:
                        producer.pub("ha", body)
                    except Exception as e:  # the test fails on any error
                        failures.append(e)
                        return
                    with acked_lock:
                        acked.append(body)

        threads = [threading.Thread(target=publish, args=(b"p%d" % i,), name="test-publisher-%d" % i, daemon=True)
                   for i in range(2)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(acked) >= 300 or failures, what="300 publishes")
            victim = cluster[1]
            victim.kill()
            seen = len(acked)
            wait_until(lambda: len(acked) >= seen + 300 or failures, what="publishes without the killed broker")
            victim.restart()  # same ports, same data directory
            wait_until(lambda: message_count(victim, "ha") > 0 or failures, what="the restarted broker to rejoin")
            seen = len(acked)
            wait_until(lambda: len(acked) >= seen + 100 or failures, what="publishes after the restart")
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert not failures, failures
        bodies = set(acked)
        assert len(bodies) == len(acked)
        consume_all(cluster.tcp_addrs, "ha", "c", bodies)


def test_producer_round_robin_over_lookupd_nodes(nsq_cluster):
    with Producer(lookupd_http_addresses=nsq_cluster.lookupd_http_addrs) as producer:
        assert sorted(producer.nodes) == sorted(b.tcp_address for b in nsq_cluster)
        for i in range(30):
            producer.pub("rr", b"x%d" % i)
        futures = [producer.pub_async("rr", b"y%d" % i) for i in range(30)]
        assert [f.result(10) for f in futures] == [b"OK"] * 30
    assert [message_count(b, "rr") for b in nsq_cluster] == [20, 20, 20]


def test_producer_resends_a_request_whose_connection_ended(nsqd_factory):
    real = nsqd_factory()
    fake = SilentNSQD()
    try:
        with Producer([fake.address, real.tcp_address]) as producer:
            producer.pub("moved", b"once")  # sent to the fake first (round robin), then to the real one
            assert fake.got_pub.is_set()
        assert message_count(real, "moved") == 1
    finally:
        fake.close()


@pytest.mark.nsq_cluster(n=2)
def test_producer_raises_when_no_node_can_take_it(nsq_cluster):
    producer = Producer(nsq_cluster.tcp_addrs)
    try:
        producer.pub("t", b"before")
        for broker in nsq_cluster:
            broker.stop()
        with pytest.raises(ConnectionClosed, match="no nsqd could take the request"):
            producer.pub("t", b"after")
    finally:
        producer.close()


# -- Consumer ---------------------------------------------------------------------------


@pytest.mark.nsq_cluster(n=2)
def test_consumer_finds_nodes_through_lookupd_and_resplits_rdy(nsq_cluster):
    busy, idle = nsq_cluster[0], nsq_cluster[1]
    for broker in nsq_cluster:
        create(broker, "rd", "c")
    wait_until(lambda: len(nsq_cluster.lookupd.lookup("rd")) == 2, what="both producers in /lookup")
    consumer = Consumer(
        None, "rd", "c", lookupd_http_addresses=nsq_cluster.lookupd_http_addrs, max_in_flight=10,
        rdy_redistribute_interval=0.05, low_rdy_idle_timeout=0.5,
    )
    with consumer, Producer(busy.tcp_address) as producer:
        assert consumer.subscribed == sorted([busy.tcp_address, idle.tcp_address])
        assert consumer.rdy == {busy.tcp_address: 5, idle.tcp_address: 5}
        # Messages keep coming from one nsqd only: the other goes idle and drops to RDY 1, as both
        # the consumer and the two nsqd see it (still publishing: a busy node that stops is idle too).
        deadline = time.monotonic() + 30
        while not (consumer.rdy == {busy.tcp_address: 9, idle.tcp_address: 1}
                   and ready_counts(idle, "rd", "c") == [1] and ready_counts(busy, "rd", "c") == [9]):
            assert time.monotonic() < deadline, consumer.rdy
            producer.pub("rd", b"work")
            consumer.get(timeout=10).fin()
        # The idle connection still receives (RDY 1) and is busy again at the next re-split.
        with Producer(idle.tcp_address) as other:
            other.pub("rd", b"wake up")
        msg = consumer.get(timeout=10)
        assert msg.body == b"wake up" and msg.connection.address == idle.tcp_address
        msg.fin()
        wait_until(lambda: consumer.rdy[idle.tcp_address] > 1, what="the woken connection to get a share")


@pytest.mark.nsq_cluster(n=2)
def test_consumer_polls_lookupd_for_new_nodes(nsq_cluster):
    first, second = nsq_cluster[0], nsq_cluster[1]
    create(first, "later", "c")
    wait_until(lambda: nsq_cluster.lookupd.lookup("later") == [first.tcp_addr], what="the first producer")
    consumer = Consumer(
        None, "later", "c", lookupd_http_addresses=nsq_cluster.lookupd_http_addrs, max_in_flight=4,
        lookupd_poll_interval=0.05, rdy_redistribute_interval=0.05, low_rdy_idle_timeout=300,
    )
    with consumer:
        assert consumer.subscribed == [first.tcp_address]
        with Producer(second.tcp_address) as producer:
            producer.pub("later", b"from the second")
        assert consumer.wait_subscribed(2, timeout=30), consumer.subscribed
        msg = consumer.get(timeout=10)
        assert msg.body == b"from the second" and msg.connection.address == second.tcp_address
        msg.fin()
        wait_until(lambda: sorted(consumer.rdy.values()) == [2, 2], what="max_in_flight split over both")


@pytest.mark.nsq_cluster(n=2)
def test_a_lookupd_poll_shorter_than_the_rdy_re_split_keeps_its_own_interval(nsq_cluster):
    """The poll has its own clock: with a 0.2 s poll and an hour between RDY re-splits, a node
    listed later is found within a few polls, not at the next re-split."""
    first, second = nsq_cluster[0], nsq_cluster[1]
    create(first, "ownclock", "c")
    wait_until(lambda: nsq_cluster.lookupd.lookup("ownclock") == [first.tcp_addr], what="the first producer")
    consumer = Consumer(
        None, "ownclock", "c", lookupd_http_addresses=nsq_cluster.lookupd_http_addrs, max_in_flight=4,
        lookupd_poll_interval=0.2, rdy_redistribute_interval=3600,
    )
    with consumer:
        assert consumer.subscribed == [first.tcp_address]
        create(second, "ownclock", "c")
        assert consumer.wait_subscribed(2, timeout=15), consumer.subscribed


@pytest.mark.nsq_cluster(n=1)
def test_consumer_redials_a_lookupd_node_at_once_when_the_broker_drops_it(nsq_cluster):
    """A connection to a node found through lookupd, closed by the broker: lookupd is asked at once
    and the node redialled, long before the next poll (60 s here); a message published after
    arrives through the new connection."""
    broker = nsq_cluster[0]
    create(broker, "redial", "c")
    wait_until(lambda: nsq_cluster.lookupd.lookup("redial") == [broker.tcp_addr], what="the producer in /lookup")
    consumer = Consumer(
        None, "redial", "c", lookupd_http_addresses=nsq_cluster.lookupd_http_addrs,
        lookupd_poll_interval=60, reconnect_backoff=(0.05, 0.5), timeout=5,
    )
    with consumer:
        assert consumer.subscribed == [broker.tcp_address]
        (dropped,) = [c for c in broker.nsqd.clients() if c.channel is not None]
        dropped.close_connection()  # the broker shuts the socket: the consumer reads EOF
        wait_until(lambda: [c.id for c in broker.nsqd.clients() if c.channel is not None and c.id != dropped.id],
                   timeout=5, what="the consumer to subscribe again (the next lookupd poll is 60 s away)")
        with Producer(broker.tcp_address) as producer:
            producer.pub("redial", b"after the drop")
        msg = consumer.get(timeout=5)
        assert msg.body == b"after the drop"
        msg.fin()
        assert consumer.subscribed == [broker.tcp_address]


@contextlib.contextmanager
def listed_broker(tmp_path, topic):
    """A lookupd and a broker process that lookupd lists for ``topic``/c through a separate
    registration (``HostileNode``), so the listing outlives the broker: ``(lookupd, broker,
    registration)``."""
    with Lookupd() as lookupd, BrokerProcess(tmp_dir=str(tmp_path)) as broker:
        registration = HostileNode()
        try:
            registration.register(lookupd.tcp_address, topic, "c", tcp_port=broker.tcp_address[1],
                                  http_port=broker.http_address[1])
            wait_until(lambda: lookupd.lookup(topic) == [broker.tcp_addr], what="the node in /lookup")
            yield lookupd, broker, registration
        finally:
            registration.close()


def test_consumer_redials_a_listed_node_with_backoff_until_it_is_back(tmp_path):
    """A broker killed while lookupd still lists it (registered here by a separate lookupd
    connection, as a node whose own connection survived would be): the consumer's redials are
    refused, reported, and spaced by ``reconnect_backoff``; once the broker is back on its port the
    consumer is subscribed again within the back-off's maximum, long before the next poll."""
    errors = []
    with listed_broker(tmp_path, "backoff") as (lookupd, broker, registration):
        consumer = Consumer(
            None, "backoff", "c", lookupd_http_addresses=[lookupd.http_addr], lookupd_poll_interval=60,
            reconnect_backoff=(0.05, 0.4), timeout=5, on_error=lambda e: errors.append((time.monotonic(), e)),
        )
        with consumer:
            assert consumer.subscribed == [broker.tcp_address]
            broker.kill()
            wait_until(lambda: len(errors) >= 4, timeout=10, what="four refused redials")
            assert all(isinstance(e, ConnectionError) for _, e in errors), errors
            gaps = [b - a for (a, _), (b, _) in zip(errors, errors[1:])]
            assert gaps[-1] >= 0.15, gaps  # backing off: 0.05, 0.1, 0.2, then 0.4 s (lower bounds)
            broker.restart()
            assert consumer.wait_subscribed(timeout=5), "not subscribed again within 5 s"
            with Producer(broker.tcp_address) as producer:
                producer.pub("backoff", b"back")
            msg = consumer.get(timeout=5)
            assert msg.body == b"back"
            msg.fin()


def test_consumer_stops_redialling_a_node_lookupd_no_longer_lists(tmp_path):
    """The broker killed and its registration gone: the consumer's connection thread for it asks
    lookupd after a refused redial, finds it unlisted and ends (the next poll would bring it back)."""
    errors = []
    with listed_broker(tmp_path, "gone") as (lookupd, broker, registration):
        consumer = Consumer(
            None, "gone", "c", lookupd_http_addresses=[lookupd.http_addr], lookupd_poll_interval=60,
            reconnect_backoff=(0.2, 0.4), timeout=5, on_error=errors.append,
        )
        with consumer:
            thread_name = "nsq-consumer[%s gone/c]" % broker.tcp_addr
            assert [t for t in threading.enumerate() if t.name == thread_name]
            broker.kill()
            wait_until(lambda: errors, timeout=10, what="a refused redial")
            for conn in registration.conns:
                conn.close()  # the registration's lookupd connection ends: lookupd drops the node
            wait_until(lambda: lookupd.lookup("gone") == [], what="the node off /lookup")
            wait_until(lambda: not [t for t in threading.enumerate() if t.name == thread_name], timeout=10,
                       what="the connection thread to give the node up")
            assert consumer.subscribed == []


@pytest.mark.nsq_cluster(n=2)
def test_consumer_start_fails_when_no_lookupd_answers(nsq_cluster):
    nsq_cluster.lookupd.stop()
    with pytest.raises(OSError, match="nsqlookupd at"):
        Consumer(None, "t", "c", lookupd_http_addresses=nsq_cluster.lookupd_http_addrs, timeout=2).start()


# -- pynsq ------------------------------------------------------------------------------


@pytest.mark.nsq_cluster(n=2)
def test_pynsq_reader_through_our_lookupd(nsq_cluster):
    import nsq

    wanted = set()
    for i, broker in enumerate(nsq_cluster):
        with Producer(broker.tcp_address) as producer:
            bodies = [b"b%d-%03d" % (i, j) for j in range(50)]
            producer.mpub("py", bodies)
            wanted.update(bodies)
    wait_until(lambda: len(nsq_cluster.lookupd.lookup("py")) == 2, what="both producers in /lookup")
    loop = Loop()
    try:
        seen = set()
        reader = nsq.Reader(
            topic="py", channel="c", message_handler=lambda m: seen.add(m.body) or True,
            lookupd_http_addresses=["http://" + a for a in nsq_cluster.lookupd_http_addrs],
            lookupd_poll_interval=3600, max_in_flight=20,
        )
        loop.readers.append(reader)
        loop.run_until(lambda: seen >= wanted, 30, "100 messages from two nsqd")
        assert len(reader.conns) == 2
    finally:
        loop.close()
    for broker in nsq_cluster:
        wait_until(lambda: ready_counts(broker, "py", "c") == [], what="the reader to leave")


def test_fin_all_answers_messages_of_two_nodes_in_one_write_each(nsqd_factory):
    from nsqd_threaded.client.consumer import fin_all

    first, second = nsqd_factory(), nsqd_factory()
    for node, bodies in ((first, [b"a1", b"a2", b"a3"]), (second, [b"b1", b"b2"])):
        with Producer(node.tcp_addr) as producer:
            producer.mpub("batch", bodies)
    with Consumer([first.tcp_addr, second.tcp_addr], "batch", "c", max_in_flight=10) as consumer:
        got = [consumer.get(timeout=20) for _ in range(5)]
        fin_all(got)
        assert all(m.responded for m in got)
        assert sorted(m.body for m in got) == [b"a1", b"a2", b"a3", b"b1", b"b2"]

        def finished(node):
            channel = node.stats(topic="batch")["topics"][0]["channels"][0]
            return channel["in_flight_count"] == 0 and channel["depth"] == 0 and channel["requeue_count"] == 0

        wait_until(lambda: finished(first) and finished(second), 20, what="the FINs to arrive")
        with pytest.raises(TimeoutError):
            consumer.get(timeout=0.2)  # nothing comes back
