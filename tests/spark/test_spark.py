"""The nsq data source in a real Spark (``local[2]``) against real brokers."""

import datetime
import json
import threading

import pytest

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import Broker, Cluster

from support.spark import channel_stats, drained, query_state, spark, topic_count, total_rows, user_line, wait_until  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _publish(address, topic, bodies, chunk=2000):
    with Producer(address) as producer:
        for i in range(0, len(bodies), chunk):
            producer.mpub(topic, bodies[i:i + chunk])


def _stream_to_parquet(spark, tmp_path, brokers, topic, channel, total, while_running=None, **options):
    """Run a query into Parquet until every message is FINed (then ``while_running()``, the
    query still running); the rows written."""
    reader = spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    query = (reader.load().writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: drained(brokers, topic, channel, total), 180,
                   lambda: "%d messages FINed; %s" % (total, query_state(query, brokers, topic, channel)))
        assert query.exception() is None
        assert total_rows(query) >= total
        if while_running is not None:
            while_running()
    finally:
        query.stop()
    return spark.read.parquet(out).collect()


def test_stream_10k_messages_to_parquet_once_each(spark, tmp_path):
    bodies = [b"message %05d" % i for i in range(10000)]
    with Broker() as broker:
        _publish(broker.tcp_addr, "events", bodies)
        rows = _stream_to_parquet(spark, tmp_path, [broker], "events", "archive", len(bodies),
                                  nsqd=broker.tcp_addr, maxBatchSize=1000, maxInFlight=2500)
        stats = channel_stats(broker, "events", "archive")
    assert sorted(bytes(r.body) for r in rows) == bodies  # every message, once
    assert len({r.message_id for r in rows}) == len(bodies)
    assert {(r.nsqd, r.topic, r.channel) for r in rows} == {(broker.tcp_addr, "events", "archive")}
    assert {r.attempts for r in rows} == {1}
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0


def test_default_options_carry_every_column_of_each_message(spark, tmp_path):
    """Default options: connections enough for maxInFlight (80 at nsqd's max_rdy_count of 2500),
    batches of whatever arrived; the columns decoded from the message frames on the executors."""
    bodies = [b"%05d " % i + b"x" * (i % 300) for i in range(20000)]  # sizes 6-305 bytes
    with Broker() as broker:
        before = datetime.datetime.now(datetime.timezone.utc)
        _publish(broker.tcp_addr, "events", bodies)
        after = datetime.datetime.now(datetime.timezone.utc)
        clients = []

        def count_clients():
            clients.extend(c for t in broker.stats(topic="events")["topics"] for ch in t["channels"]
                           for c in ch["clients"])

        rows = _stream_to_parquet(spark, tmp_path, [broker], "events", "archive", len(bodies), count_clients,
                                  nsqd=broker.tcp_addr)
    assert sorted(bytes(r.body) for r in rows) == bodies
    assert all(len(r.message_id) == 16 and int(r.message_id, 16) >= 0 for r in rows)
    assert len({r.message_id for r in rows}) == len(bodies)
    stamps = [r.timestamp.astimezone(datetime.timezone.utc) for r in rows]
    slack = datetime.timedelta(seconds=1)
    assert before - slack <= min(stamps) and max(stamps) <= after + slack
    assert {r.attempts for r in rows} == {1}
    assert len(clients) == 80


def test_the_source_reconnects_when_nsqd_restarts(spark, tmp_path):
    """Every connection ends with the restart; each reconnects and the query goes on: what nsqd
    requeued (or kept in nsqd.dat) comes again, nothing is lost."""
    first = [b"before %05d" % i for i in range(3000)]
    second = [b"after %05d" % i for i in range(3000)]
    with Broker() as broker:
        _publish(broker.tcp_addr, "events", first)
        reader = (spark.readStream.format("nsq").option("nsqd", broker.tcp_addr).option("topic", "events")
                  .option("channel", "archive").option("maxInFlight", "10000"))
        out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
        query = (reader.load().writeStream.format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
        try:
            wait_until(lambda: drained([broker], "events", "archive", len(first)), 180, "the first messages FINed")
            broker.restart()
            _publish(broker.tcp_addr, "events", second)
            wait_until(lambda: channel_stats(broker, "events", "archive") is not None
                       and channel_stats(broker, "events", "archive")["client_count"] == 4, 60,
                       "the source's 4 connections back")
            wait_until(lambda: drained([broker], "events", "archive", len(second)), 180, "the later messages FINed")
            assert query.exception() is None
        finally:
            query.stop()
    got = {bytes(r.body) for r in spark.read.parquet(out).collect()}
    assert got == set(first) | set(second)


def test_two_brokers_found_through_lookupd_feed_one_query(spark, tmp_path):
    with Cluster(2) as cluster:
        expected = []
        for i, broker in enumerate(cluster):
            bodies = [b"node%d-%04d" % (i, j) for j in range(3000)]
            _publish(broker.tcp_addr, "clicks", bodies)
            expected += bodies
        cluster.wait_registered()
        wait_until(lambda: len(cluster.lookupd.lookup("clicks")) == 2, 30, "both producers of the topic")
        rows = _stream_to_parquet(spark, tmp_path, list(cluster), "clicks", "spark", len(expected),
                                  lookupd=",".join(cluster.lookupd_http_addrs), maxBatchSize=1000)
        addrs = sorted(cluster.tcp_addrs)
    assert sorted(bytes(r.body) for r in rows) == sorted(expected)
    by_node = {}
    for r in rows:
        by_node.setdefault(r.nsqd, set()).add(bytes(r.body)[:5])
    assert sorted(by_node) == addrs
    assert sorted(tuple(v) for v in by_node.values()) == [(b"node0",), (b"node1",)]


def test_sink_200k_rows_land_as_200k_messages(spark):
    with Broker() as broker:
        df = spark.range(200000).selectExpr("cast(id as string) as body")
        df.write.format("nsq").mode("append").option("nsqd", broker.tcp_addr).option("topic", "sunk") \
            .option("bodyColumn", "body").save()
        assert topic_count(broker, "sunk") == 200000


def test_sink_finds_its_brokers_through_lookupd(spark):
    with Cluster(2) as cluster:
        cluster.wait_registered()
        df = spark.range(40000).repartition(4).selectExpr("cast(id as string) as body")
        df.write.format("nsq").mode("append").option("lookupd", ",".join(cluster.lookupd_http_addrs)) \
            .option("topic", "via-lookupd").option("bodyColumn", "body").save()
        counts = [topic_count(broker, "via-lookupd") for broker in cluster]
    assert sum(counts) == 40000, counts


def test_sink_routes_rows_by_topic_column_and_writes_json_rows(spark):
    with Broker() as broker:
        rows = [(i, "even" if i % 2 == 0 else "odd", "x%d" % i) for i in range(1000)]
        df = spark.createDataFrame(rows, "n long, route string, label string")
        df.write.format("nsq").mode("append").option("nsqd", broker.tcp_addr).option("topicColumn", "route").save()
        assert topic_count(broker, "even") == 500
        assert topic_count(broker, "odd") == 500
        from nsqd_threaded.client import Consumer
        with Consumer(broker.tcp_addr, "odd", "check", max_in_flight=100) as consumer:
            got = []
            for _ in range(500):
                msg = consumer.get(timeout=30)
                got.append(json.loads(msg.body))
                msg.fin()
    assert sorted(g["n"] for g in got) == list(range(1, 1000, 2))
    assert got[0] == {"n": got[0]["n"], "route": "odd", "label": "x%d" % got[0]["n"]}


def test_streaming_sink_publishes_every_row(spark, tmp_path):
    src = str(tmp_path / "src")
    spark.range(28000).selectExpr("cast(cast(id as string) as binary) as body").write.parquet(src)
    with Broker() as broker:
        query = (spark.readStream.schema("body binary").parquet(src).writeStream.format("nsq")
                 .option("nsqd", broker.tcp_addr).option("topic", "streamed").option("bodyColumn", "body")
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None
        assert topic_count(broker, "streamed") == 28000


@pytest.mark.parametrize("options, message", [
    ({"nsqd": "{nsqd}", "channel": "c"}, "nsq: option topic is required"),
    ({"nsqd": "{nsqd}", "topic": "t"}, "nsq: option channel is required"),
    ({"topic": "t", "channel": "c"}, "nsq: set option nsqd (host:port,...) or lookupd (host:httpport,...)"),
    ({"nsqd": "127.0.0.1:1", "topic": "t", "channel": "c"}, "nsq: option nsqd: cannot reach 127.0.0.1:1 (Connection refused)"),
    ({"lookupd": "127.0.0.1:1", "topic": "t", "channel": "c"}, "nsq: option lookupd: cannot reach 127.0.0.1:1"),
    ({"nsqd": "{nsqd}", "topic": "t", "channel": "c", "maxBatchSize": "lots"}, "nsq: option maxBatchSize='lots' is not an integer"),
    ({"nsqd": "{nsqd}", "topic": "t", "channel": "c", "maxInFlight": "0"}, "nsq: option maxInFlight=0 must be >= 1"),
    ({"nsqd": "{nsqd}", "topic": "bad topic", "channel": "c"}, "nsq: option topic='bad topic' is not a valid NSQ topic name"),
    ({"nsqd": "nohost", "topic": "t", "channel": "c"}, "nsq: option nsqd has a bad address 'nohost' (want host:port)"),
])
def test_bad_source_options_fail_at_load_with_one_line(spark, options, message):
    with Broker() as broker:
        reader = spark.readStream.format("nsq")
        for key, value in options.items():
            reader = reader.option(key, value.replace("{nsqd}", broker.tcp_addr))
        with pytest.raises(Exception) as info:
            reader.load()
    if message.endswith("127.0.0.1:1"):
        assert user_line(info.value).startswith(message + " (")
    else:
        assert user_line(info.value) == message


@pytest.mark.parametrize("mode, options, message", [
    ("append", {"bodyColumn": "body"}, "nsq: option topic (or topicColumn) is required"),
    ("append", {"topic": "t", "bodyColumn": "nope"}, "nsq: option bodyColumn='nope' is not a column (columns: body)"),
    ("append", {"topic": "t", "topicColumn": "body"}, "nsq: set option topic or topicColumn, not both"),
    ("append", {"topic": "t", "deferMs": "-1"}, "nsq: option deferMs=-1 must be >= 0"),
    ("overwrite", {"topic": "t"}, "nsq: the sink only appends: use mode(\"append\")"),
])
def test_bad_sink_options_fail_at_save_with_one_line(spark, mode, options, message):
    with Broker() as broker:
        writer = spark.range(3).selectExpr("cast(id as string) as body").write.format("nsq").mode(mode)
        writer = writer.option("nsqd", broker.tcp_addr)
        for key, value in options.items():
            writer = writer.option(key, value)
        with pytest.raises(Exception) as info:
            writer.save()
        assert topic_count(broker, "t") == 0
    assert user_line(info.value) == message


def test_default_save_mode_is_refused_by_spark(spark):
    with Broker() as broker:
        with pytest.raises(Exception) as info:
            spark.range(3).write.format("nsq").option("nsqd", broker.tcp_addr).option("topic", "t").save()
    assert 'cannot be written in the "ErrorIfExists" mode' in str(info.value)


def test_batch_read_is_refused(spark):
    with Broker() as broker:
        with pytest.raises(Exception) as info:
            spark.read.format("nsq").option("nsqd", broker.tcp_addr).option("topic", "t").option("channel", "c") \
                .load().collect()
    assert user_line(info.value) == 'nsq: the source is streaming only: use spark.readStream.format("nsq")'


def test_a_batch_slower_than_msg_timeout_is_kept_alive_by_touch(spark, tmp_path):
    """TOUCH covers planned and locally queued messages: nsqd times none of them out."""
    bodies = [b"slow %03d" % i for i in range(600)]
    seen = []
    delay = threading.Event()  # never set: each batch deliberately takes 3 msg timeouts

    def slow_sink(batch, batch_id):
        rows = batch.collect()
        if rows:
            delay.wait(3.0)
        seen.extend(bytes(r.body) for r in rows)

    with Broker() as broker:
        _publish(broker.tcp_addr, "slow", bodies)
        query = (spark.readStream.format("nsq").option("nsqd", broker.tcp_addr).option("topic", "slow")
                 .option("channel", "c").option("maxBatchSize", 200).option("maxInFlight", 600)
                 .option("msgTimeoutMs", 1000).load()
                 .writeStream.foreachBatch(slow_sink).option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            wait_until(lambda: drained([broker], "slow", "c", len(bodies)), 120, "every message FINed")
        finally:
            query.stop()
        stats = channel_stats(broker, "slow", "c")
    assert stats["timeout_count"] == 0
    assert sorted(seen) == bodies


def test_source_defaults_take_half_the_in_flight_budget_per_batch():
    from nsqd_threaded.spark.options import source_options

    base = {"nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c"}
    defaults = source_options(base)
    assert defaults["maxInFlight"] == 200000 and defaults["maxBatchSize"] == 100000
    assert defaults["connectionsPerNode"] is None  # worked out from nsqd's max_rdy_count when the query starts
    assert source_options(dict(base, maxinflight="3000"))["maxBatchSize"] == 1500
    assert source_options(dict(base, maxinflight="3000", maxbatchsize="10"))["maxBatchSize"] == 10
