"""The source's reader driven as Spark drives it (latestOffset, partitions, read, commit, stop),
in this process against real brokers: what the driver and the executors do, without the JVM.

Spark runs the reader in its own Python workers, where coverage cannot follow; these tests
exercise the same code where it can, and pin the driver-side behaviour down directly.
"""

import pickle

import pytest

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import Broker, Cluster
from support.spark import channel_stats, drained, wait_until

# The runtimes without the spark extra collect this file too (-m "not spark" deselects only after
# collection), and nsqd_threaded.spark refuses to import without pyspark.
pytest.importorskip("pyspark")
from nsqd_threaded.spark.options import source_options  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]


def _publish(address, topic, bodies, chunk=2000):
    with Producer(address) as producer:
        for i in range(0, len(bodies), chunk):
            producer.mpub(topic, bodies[i:i + chunk])


class Driver:
    """Spark's side of the protocol: plan a batch, ship its partitions (pickled, as Spark
    does), read them, commit the previous batch."""

    def __init__(self, options):
        pytest.importorskip("pyarrow")
        from nsqd_threaded.spark.source import NsqStreamReader

        self.reader = NsqStreamReader(source_options(options))
        self.end = self.reader.initialOffset()
        self.rows = []

    def trigger(self):
        start, end = self.end, self.reader.latestOffset()
        if end != start:
            for partition in self.reader.partitions(start, end):
                executor_copy = pickle.loads(pickle.dumps(self.reader))
                for batch in executor_copy.read(pickle.loads(pickle.dumps(partition))):
                    self.rows.extend(batch.to_pylist())
            self.reader.commit(start)  # Spark commits batch N while planning N+1
        self.end = end
        return len(self.rows)

    def run_until(self, predicate, what):
        wait_until(lambda: self.trigger() is not None and predicate(), 60, what)


def test_every_message_read_once_with_its_columns_and_fined_after_commit():
    bodies = [b"m%05d" % i + b"y" * (i % 50) for i in range(6000)]
    with Broker() as broker:
        _publish(broker.tcp_addr, "t", bodies)
        driver = Driver({"nsqd": broker.tcp_addr, "topic": "t", "channel": "c", "maxInFlight": "5000"})
        try:
            driver.run_until(lambda: len(driver.rows) >= len(bodies), "every message read")
            assert channel_stats(broker, "t", "c")["client_count"] == 2  # 5000 / max_rdy_count 2500
            driver.run_until(lambda: drained([broker], "t", "c", len(bodies)), "every message FINed")
        finally:
            driver.reader.stop()
    assert sorted(r["body"] for r in driver.rows) == bodies
    assert len({r["message_id"] for r in driver.rows}) == len(bodies)
    assert {(r["nsqd"], r["topic"], r["channel"], r["attempts"]) for r in driver.rows} == {
        (broker.tcp_addr, "t", "c", 1)}
    assert len({r["timestamp"] for r in driver.rows}) >= 1


def _finished(broker, topic, channel):
    c = channel_stats(broker, topic, channel)
    return c["message_count"] - c["depth"] - c["in_flight_count"] - c["deferred_count"]


def test_batches_hold_at_most_max_batch_size_and_nothing_is_fined_before_its_commit():
    with Broker() as broker:
        _publish(broker.tcp_addr, "t", [b"x"] * 3000)
        driver = Driver({"nsqd": broker.tcp_addr, "topic": "t", "channel": "c", "maxInFlight": "2000"})
        reader = driver.reader
        try:
            first = reader.latestOffset()  # connects (one connection: RDY 2000)
            wait_until(lambda: (channel_stats(broker, "t", "c") or {}).get("in_flight_count") == 2000, 30,
                       "RDY 2000 filled")  # the channel exists once the connection subscribed
            second = reader.latestOffset()
            assert second["seq"] - first["seq"] <= 1000  # maxBatchSize: half of maxInFlight
            assert second["seq"] > first["seq"]
            assert _finished(broker, "t", "c") == 0  # planned is not committed
            reader.commit(second)
            wait_until(lambda: _finished(broker, "t", "c") == second["seq"], 30, "the committed batches FINed")
        finally:
            reader.stop()
        # stop() REQueues what was received and never planned, and the connections end: nsqd
        # holds everything not committed again, nothing is lost
        wait_until(lambda: channel_stats(broker, "t", "c")["in_flight_count"] == 0, 30, "nothing in flight")
        assert channel_stats(broker, "t", "c")["depth"] == 3000 - second["seq"]


def test_a_batch_from_several_connections_is_fined_each_message_on_its_own_connection():
    # The fin thread writes one run of FINs per connection (its runs gathered from the whole
    # batch): every message is FINed, by the connection nsqd delivered it on (a FIN on another
    # would be refused, E_FIN_FAILED, and leave the message in flight).
    with Broker("--max-rdy-count=500") as broker:
        _publish(broker.tcp_addr, "t", [b"x%d" % i for i in range(2000)])
        driver = Driver({"nsqd": broker.tcp_addr, "topic": "t", "channel": "c", "maxInFlight": "2000",
                         "maxBatchSize": "2000"})
        reader = driver.reader
        try:
            reader.latestOffset()  # connects: 4 connections (2000 / max_rdy_count 500) of RDY 500
            wait_until(lambda: (channel_stats(broker, "t", "c") or {}).get("in_flight_count") == 2000, 30,
                       "every connection's RDY filled")
            # in flight at nsqd is sent, not yet read: the last connection's frames may still be on their way
            offsets = []
            end = wait_until(lambda: offsets.append(reader.latestOffset()) or offsets[-1]["seq"] == 2000 and offsets[-1],
                             30, "every message received", interval=0.01)
            assert end["seq"] == 2000
            assert len({link for _, runs in reader._batches.values() for link, *_ in runs}) == 4
            reader.commit(end)
            wait_until(lambda: _finished(broker, "t", "c") == 2000, 30, "the batch FINed")
            clients = channel_stats(broker, "t", "c")["clients"]
            assert sorted(c["finish_count"] for c in clients) == [500] * 4
            assert all(c["in_flight_count"] == 0 for c in clients)
        finally:
            reader.stop()


def test_a_node_that_refuses_the_larger_output_buffer_is_read_with_its_default():
    from nsqd_threaded.spark import source

    # The source asks for 64 KiB output buffers; a node whose maximum is lower answers
    # E_BAD_BODY (and closes), and the connection is made again without asking.
    with Broker("--max-output-buffer-size=%d" % (source.OUTPUT_BUFFER_SIZE // 2), "--log-level=debug") as broker:
        _publish(broker.tcp_addr, "t", [b"x"] * 100)
        driver = Driver({"nsqd": broker.tcp_addr, "topic": "t", "channel": "c", "maxInFlight": "100"})
        try:
            driver.run_until(lambda: len(driver.rows) >= 100, "every message")
        finally:
            driver.reader.stop()
        assert "IDENTIFY output buffer size (%d) is invalid" % source.OUTPUT_BUFFER_SIZE in broker.log


def test_the_reader_reconnects_after_a_restart_and_reads_what_came_after():
    with Broker() as broker:
        driver = Driver({"nsqd": broker.tcp_addr, "topic": "t", "channel": "c", "maxInFlight": "100"})
        try:
            _publish(broker.tcp_addr, "t", [b"before"] * 50)
            driver.run_until(lambda: len(driver.rows) >= 50, "the first messages")
            broker.restart()
            _publish(broker.tcp_addr, "t", [b"after"] * 50)
            driver.run_until(lambda: sum(r["body"] == b"after" for r in driver.rows) >= 50, "the later messages")
        finally:
            driver.reader.stop()


def test_nodes_found_through_lookupd_each_feed_the_reader():
    with Cluster(2) as cluster:
        for i, broker in enumerate(cluster):
            _publish(broker.tcp_addr, "t", [b"node%d" % i] * 300)
        cluster.wait_registered()
        wait_until(lambda: len(cluster.lookupd.lookup("t")) == 2, 30, "both producers of the topic")
        driver = Driver({"lookupd": ",".join(cluster.lookupd_http_addrs), "topic": "t", "channel": "c",
                         "maxInFlight": "1000", "lookupdPollIntervalMs": "200"})
        try:
            driver.run_until(lambda: len(driver.rows) >= 600, "both nodes' messages")
        finally:
            driver.reader.stop()
        assert {r["nsqd"] for r in driver.rows} == set(cluster.tcp_addrs)


def test_an_unreachable_node_is_retried_without_failing_the_others():
    from nsqd_threaded.spark import source

    with Broker() as broker:
        dead = "127.0.0.1:1"  # nothing listens on port 1
        assert source._max_rdy_count([("127.0.0.1", 1)]) == source.DEFAULT_MAX_RDY_COUNT
        _publish(broker.tcp_addr, "t", [b"x"] * 20)
        driver = Driver({"nsqd": dead + "," + broker.tcp_addr, "topic": "t", "channel": "c",
                         "maxInFlight": "40", "connectionsPerNode": "1"})
        try:
            driver.run_until(lambda: len(driver.rows) >= 20, "the live node's messages")
        finally:
            driver.reader.stop()
