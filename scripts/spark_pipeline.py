#!/usr/bin/env python3
"""An example Spark pipeline on NSQ: archive a topic to Parquet and count its messages per minute.

    scripts/run                                   # the broker, in another terminal
    .venv/bin/pip install -e '.[spark]'           # once; Java 17+ must be installed
    .venv/bin/python scripts/spark_pipeline.py --topic events --publish 50000

Two streaming queries read the same topic on two channels (each channel gets every
message): ``archive`` writes every message to ``--out``/archive as Parquet (append),
``counts`` keeps a per-minute count (by the message's NSQ timestamp) in an in-memory
table, printed with the progress and written to ``--out``/per_minute as Parquet at exit.  The script prints progress
every few seconds until Ctrl-C.  ``--publish N`` publishes N test messages once both queries run.
Restarting it resumes from the checkpoints in ``--out``: messages are FINed only after
Spark committed them, so nothing is lost; dedupe the archive on (nsqd, message_id).

On a standalone cluster (``scripts/spark_cluster start`` prints its URL)::

    scripts/build_pyz --installed -o nsqd-threaded.zip   # the package, for the executors
    .venv/bin/python scripts/spark_pipeline.py --master spark://127.0.0.1:PORT --py-files nsqd-threaded.zip

The driver (this process) consumes; the executors decode the partitions and write the
archive.  ``--out`` must be a path every executor and the driver see (a shared
filesystem; on one host any local path).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def publish(args):
    """``--publish`` test messages (small JSON documents) to the topic."""
    from nsqd_threaded.client import Producer

    with Producer(args.nsqd.split(",")) as producer:
        for start in range(0, args.publish, 1000):
            producer.mpub(args.topic, [b'{"n": %d}' % i for i in range(start, min(start + 1000, args.publish))])
    print("published %d messages to %s" % (args.publish, args.topic), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nsqd", default="127.0.0.1:4150", help="nsqd TCP address(es), comma-separated")
    parser.add_argument("--lookupd", default=None, help="nsqlookupd HTTP address(es) instead of --nsqd")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--out", default="spark-out", help="archive, counts and checkpoints go here")
    parser.add_argument("--publish", type=int, default=0, help="publish this many test messages once both queries run")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until Ctrl-C)")
    parser.add_argument("--master", default="local[2]", help="Spark master URL, e.g. spark://127.0.0.1:7077")
    parser.add_argument("--py-files", default=None,
                        help="comma-separated .zip files the executors put on their Python path (the package)")
    parser.add_argument("--executor-memory", default="512m", help="each executor's heap (spark.executor.memory)")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from nsqd_threaded.spark import NsqDataSource

    builder = SparkSession.builder.master(args.master).appName("nsq-pipeline").config("spark.ui.enabled", "false") \
        .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2") \
        .config("spark.executor.memory", args.executor_memory)
    if args.py_files:
        builder = builder.config("spark.submit.pyFiles", ",".join(os.path.abspath(p) for p in args.py_files.split(",")))
    if args.master.startswith(("spark://127.0.0.1:", "spark://localhost:")):
        # A cluster on this host: the executors call the driver back on 127.0.0.1 (Spark would
        # otherwise pick the host's first non-loopback address).
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NsqDataSource)  # the one line that makes format("nsq") known

    def source(channel):
        reader = spark.readStream.format("nsq").option("topic", args.topic).option("channel", channel)
        if args.lookupd:
            reader = reader.option("lookupd", args.lookupd)
        else:
            reader = reader.option("nsqd", args.nsqd)
        return reader.option("maxBatchSize", 2000).load()

    out = os.path.abspath(args.out)
    archive = (source("archive").writeStream.format("parquet").option("path", os.path.join(out, "archive"))
               .option("checkpointLocation", os.path.join(out, "checkpoints", "archive")).start())

    counts = (source("counts").groupBy(F.window("timestamp", "1 minute").start.alias("minute")).count()
              .writeStream.outputMode("complete").format("memory").queryName("per_minute")
              .option("checkpointLocation", os.path.join(out, "checkpoints", "counts")).start())
    started = time.monotonic()
    if args.publish:
        # Only once both queries have subscribed: nsqd gives a topic's backlog to the channels that
        # exist when the first one is created, so a channel made later would miss it.
        while not (archive.recentProgress and counts.recentProgress):
            time.sleep(0.5)
        publish(args)
    try:
        while args.seconds <= 0 or time.monotonic() - started < args.seconds:
            time.sleep(5)
            for query in (archive, counts):
                if query.exception() is not None:
                    raise SystemExit("query failed: %s" % query.exception())
            done = sum(p["numInputRows"] for p in archive.recentProgress)
            last = archive.lastProgress or {}
            print("%5.0fs archived %d rows (last batch %s: %s rows, %.0f rows/s)" % (
                time.monotonic() - started, done, last.get("batchId"), last.get("numInputRows"),
                last.get("processedRowsPerSecond") or 0), flush=True)
            for row in spark.sql("SELECT * FROM per_minute ORDER BY minute DESC LIMIT 3").collect()[::-1]:
                print("       %s  %d messages" % (row.minute, row["count"]))
    except KeyboardInterrupt:
        pass
    finally:
        archive.stop()
        counts.stop()
        spark.table("per_minute").write.mode("overwrite").parquet(os.path.join(out, "per_minute"))
        print("archive: %s, per-minute counts: %s" % (os.path.join(out, "archive"), os.path.join(out, "per_minute")))
        spark.stop()


if __name__ == "__main__":
    main()
