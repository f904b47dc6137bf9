#!/usr/bin/env python3
"""Throughput of the nsq data source in a real Spark ``local[2]``.

    scripts/bench_spark.py source --messages 1000000   # topic -> nsq source -> no-op sink
    scripts/bench_spark.py sink --messages 1000000     # spark.range -> nsq sink (2 tasks)

A broker child process (``python -m nsqd_threaded``) on 127.0.0.1 ephemeral ports with
a temporary data directory.  ``source``: the topic is filled with ``--messages`` bodies
of ``--size`` bytes first, then the clock runs from the query's start until the
channel is drained (every message FINed, i.e. committed by Spark).  ``sink``: the clock
covers the ``save()`` and the result is checked in /stats.  Needs the spark extra and Java.
"""

import argparse
import os
import sys
import tempfile
import time

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import BrokerProcess


def session(local_dir):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from nsqd_threaded.spark import NsqDataSource

    spark = (SparkSession.builder.master("local[2]").appName("bench_spark")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.local.dir", local_dir).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NsqDataSource)
    return spark


def channel(broker, topic, name):
    for t in broker.stats(topic=topic)["topics"] or ():
        for c in t["channels"] or ():
            if c["channel_name"] == name:
                return c
    return None


def bench_source(spark, broker, args):
    body = b"x" * args.size
    t0 = time.monotonic()
    with Producer(broker.tcp_addr) as producer:
        futures = [producer.mpub_async("bench", [body] * 1000) for _ in range(args.messages // 1000)]
        for f in futures:
            f.result(60)
    print("filled %d messages of %d bytes in %.1fs" % (args.messages, args.size, time.monotonic() - t0))
    reader = (spark.readStream.format("nsq").option("nsqd", broker.tcp_addr).option("topic", "bench")
              .option("channel", "spark").option("maxBatchSize", args.batch).option("maxInFlight", args.in_flight)
              .option("connectionsPerNode", args.connections).option("numPartitions", 2))
    t0 = time.monotonic()
    query = reader.load().writeStream.format("noop").option("checkpointLocation", args.tmp + "/ck").start()
    last = 0
    while True:
        c = channel(broker, "bench", "spark")
        done = c["message_count"] - c["depth"] - c["in_flight_count"] if c else 0
        if done >= args.messages:
            break
        if query.exception() is not None:
            raise SystemExit("query failed: %s" % query.exception())
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            print("  %.0fs: %d FINed" % (last - t0, done), flush=True)
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    query.stop()
    print("source: %d messages in %.1fs = %.0f rows/s (maxBatchSize %d, maxInFlight %d, connectionsPerNode %d;"
          " includes the first batch's warm-up)" % (args.messages, elapsed, args.messages / elapsed,
                                                    args.batch, args.in_flight, args.connections))


def bench_sink(spark, broker, args):
    df = spark.range(0, args.messages, 1, 2).selectExpr("concat(cast(id as string), repeat('x', %d)) as body"
                                                          % max(0, args.size - 7))
    df.write.format("noop").mode("overwrite").save()  # warm-up: the same plan without nsq
    t0 = time.monotonic()
    df.write.format("nsq").mode("append").option("nsqd", broker.tcp_addr).option("topic", "sunk") \
        .option("bodyColumn", "body").save()
    elapsed = time.monotonic() - t0
    count = [t for t in broker.stats(topic="sunk")["topics"] if t["topic_name"] == "sunk"][0]["message_count"]
    assert count == args.messages, count
    print("sink: %d rows in %.1fs = %.0f rows/s (2 tasks, %d-byte bodies)"
          % (args.messages, elapsed, args.messages / elapsed, args.size))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["source", "sink"])
    parser.add_argument("--messages", type=int, default=1000000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch", type=int, default=20000, help="maxBatchSize")
    parser.add_argument("--in-flight", type=int, default=50000, help="maxInFlight")
    parser.add_argument("--connections", type=int, default=20, help="connectionsPerNode")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        args.tmp = tmp
        spark = session(tmp)
        try:
            with BrokerProcess("--mem-queue-size=1000000", "--max-rdy-count=2500", tmp_dir=tmp) as broker:
                (bench_source if args.what == "source" else bench_sink)(spark, broker, args)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
