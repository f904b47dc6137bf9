"""Throughput of the nsq data source in a real Spark ``local[2]``, against bench_reader on the same broker.

    scripts/bench spark source [--go-tools DIR]   # 1M queued messages -> nsq source (default options) -> sink
    scripts/bench spark sink                      # spark.range -> nsq sink (2 tasks)

A broker child process (``python -m nsqd_threaded``, or ``--broker-python``) on
127.0.0.1 ephemeral ports with a temporary data directory.

``source``, in one run on one broker:

1. the reference: ``--messages`` bodies of ``--size`` bytes queued on a topic, then
   drained by bench_reader (Go's from ``--go-tools``, else this project's
   ``benchmarks.reader``) for ``--reference-runfor`` seconds: msg/s;
2. a warm-up query (the JVM, the Python workers and the source's code paths are
   cold in a fresh session: the first batch of the first query takes seconds), on
   another topic, unmeasured;
3. ``--messages`` queued again, and the clock runs from the query's start until every
   message is FINed (i.e. committed by Spark): rows/s, and the ratio to step 1.

The source runs with its DEFAULT options unless ``--batch``, ``--in-flight`` or
``--connections`` are given.  The sink is a no-op ``foreachBatch`` (``--sink
foreachbatch``: the rows are planned into partitions but no task reads them) or
Spark's ``noop`` format (``--sink noop``: every row is read by a task and turned
into an Arrow batch).  ``sink``: the clock covers the ``save()`` and the result is
checked in /stats.  Needs the spark extra and Java.
"""

import argparse
import os
import sys
import tempfile
import time

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import BrokerProcess

from . import reader
from .tools import GoTools


def session(local_dir):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from nsqd_threaded.spark import NsqDataSource

    spark = (SparkSession.builder.master("local[2]").appName("bench_spark")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
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


def fill(broker, topic, messages, size):
    body = b"x" * size
    t0 = time.monotonic()
    with Producer(broker.tcp_addr) as producer:
        futures = [producer.mpub_async(topic, [body] * 1000) for _ in range(messages // 1000)]
        for f in futures:
            f.result(60)
    print("queued %d messages of %d bytes on %s in %.1fs" % (messages, size, topic, time.monotonic() - t0),
          flush=True)


def reference(broker, args):
    """bench_reader's rate on the same broker: msg/s."""
    fill(broker, "reference", args.messages, args.size)
    if args.go_tools and GoTools.available(args.go_tools):
        tool = GoTools(args.go_tools)
        name = "Go's bench_reader"
        rate = tool.consume(broker.tcp_addr, "reference", "ch", args.reference_runfor)
    else:
        name = "benchmarks.reader (no --go-tools)"
        rate = reader.run(broker.tcp_addr, "reference", "ch", 2500, args.reference_runfor)[0]
    if rate * args.reference_runfor >= 0.98 * args.messages:
        print("  (the reference ran dry: its rate is a lower bound; give more --messages or a shorter"
              " --reference-runfor)")
    broker.http("POST", "/topic/delete?topic=reference")
    return name, rate


def run_query(spark, broker, args, topic, messages, checkpoint):
    """Start the source on ``topic`` with the options asked for; seconds until ``messages`` are FINed."""
    reader_ = spark.readStream.format("nsq").option("nsqd", broker.tcp_addr).option("topic", topic) \
        .option("channel", "spark")
    for option, value in (("maxBatchSize", args.batch), ("maxInFlight", args.in_flight),
                          ("connectionsPerNode", args.connections)):
        if value is not None:
            reader_ = reader_.option(option, value)
    stream = reader_.load().writeStream.option("checkpointLocation", checkpoint)
    if args.sink == "noop":
        stream = stream.format("noop")
    else:
        stream = stream.foreachBatch(_nothing)
    t0 = time.monotonic()
    query = stream.start()
    last = t0
    try:
        while True:
            c = channel(broker, topic, "spark")
            done = c["message_count"] - c["depth"] - c["in_flight_count"] if c else 0
            if done >= messages:
                break
            if query.exception() is not None:
                raise SystemExit("query failed: %s" % query.exception())
            if time.monotonic() - last >= 5:
                last = time.monotonic()
                print("  %.0fs: %d FINed" % (last - t0, done), flush=True)
            time.sleep(0.05)  # polling /stats, bounded by the query's progress
        return time.monotonic() - t0
    finally:
        if args.progress:
            print_progress(query.recentProgress)
        query.stop()


def print_progress(progress):
    """Where a query's batches spent their time (Spark's own durationMs per batch).

    numInputRows counts the rows a task read: 0 with the foreachBatch sink, whose
    batches no task reads.
    """
    if not progress:
        return
    keys = sorted({k for p in progress for k in p.get("durationMs", {})})
    print("  %d batches (%d rows read by tasks); mean ms per batch: %s" % (
        len(progress), sum(p.get("numInputRows", 0) for p in progress),
        ", ".join("%s %.0f" % (k, sum(p["durationMs"].get(k, 0) for p in progress) / len(progress)) for k in keys)))
    for p in progress[:30]:
        print("    batch %s: %s" % (p.get("batchId"), " ".join("%s=%s" % kv for kv in sorted(p["durationMs"].items()))))


def _nothing(df, batch_id):
    """The no-op foreachBatch sink."""


def bench_source(spark, broker, args):
    start_load = os.getloadavg()[0]
    name, ref = reference(broker, args)
    print("reference: %s %.0f msg/s" % (name, ref), flush=True)
    if not args.no_warmup:
        fill(broker, "warm", args.warmup_messages, args.size)
        elapsed = run_query(spark, broker, args, "warm", args.warmup_messages, args.tmp + "/ck-warm")
        print("warm-up query: %d messages in %.1fs (unmeasured)" % (args.warmup_messages, elapsed), flush=True)
    fill(broker, "bench", args.messages, args.size)
    elapsed = run_query(spark, broker, args, "bench", args.messages, args.tmp + "/ck")
    options = ", ".join("%s %s" % (o, v) for o, v in (("maxBatchSize", args.batch), ("maxInFlight", args.in_flight),
                                                      ("connectionsPerNode", args.connections)) if v is not None)
    rate = args.messages / elapsed
    print("source: %d messages in %.1fs = %.0f rows/s (%s; sink %s)"
          % (args.messages, elapsed, rate, options or "default options", args.sink))
    print("reference: %s %.0f msg/s on the same broker; source / reference = %.2f; load average %.2f at the"
          " start, %.2f at the end" % (name, ref, rate / ref, start_load, os.getloadavg()[0]))
    if start_load > 1.0:
        print("LOADED: the run started with the load average above 1.0: indicative only")


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
    parser = argparse.ArgumentParser(prog="scripts/bench spark", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["source", "sink"])
    parser.add_argument("--messages", type=int, default=1000000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch", type=int, help="the source's maxBatchSize (default: the source's default)")
    parser.add_argument("--in-flight", type=int, help="the source's maxInFlight (default: the source's default)")
    parser.add_argument("--connections", type=int, help="the source's connectionsPerNode (default: the source's)")
    parser.add_argument("--sink", choices=["foreachbatch", "noop"], default="foreachbatch")
    parser.add_argument("--go-tools", metavar="DIR", help="Go's bench_reader from DIR for the reference")
    parser.add_argument("--reference-runfor", type=float, default=1.5,
                        help="seconds of bench_reader (short enough not to drain --messages)")
    parser.add_argument("--no-warmup", action="store_true", help="time the session's first query")
    parser.add_argument("--progress", action="store_true", help="print where Spark's batches spent their time")
    parser.add_argument("--warmup-messages", type=int, default=100000)
    parser.add_argument("--broker-python", default=sys.executable, help="the interpreter that runs the broker")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        args.tmp = tmp
        spark = session(tmp)
        try:
            command = [args.broker_python, "-m", "nsqd_threaded"]
            with BrokerProcess("--mem-queue-size=%d" % max(args.messages, args.warmup_messages),
                               command=command, tmp_dir=tmp) as broker:
                (bench_source if args.what == "source" else bench_sink)(spark, broker, args)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
