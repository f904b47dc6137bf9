"""Throughput of the nsq data source and sink in Spark, local or on a cluster, against Go's tools on the same broker.

    scripts/bench spark source [--go-tools DIR] [--master local[2]|spark://HOST:PORT|cluster]
    scripts/bench spark sink   [--go-tools DIR] [--master ...]

A broker child process (``python -m nsqd_threaded``, or ``--broker-python``) on
127.0.0.1 ephemeral ports with a temporary data directory.

``--master``: ``local[N]`` (the default ``local[2]``: one JVM, the driver's), a running
standalone cluster's ``spark://HOST:PORT``, or ``cluster``: ``scripts/spark_cluster
start`` with ``--workers`` workers of one core in a temporary directory, stopped at the
end.  On a cluster the package reaches the executors as ``spark.submit.pyFiles`` of the
zip ``scripts/build_pyz --installed`` makes, the driver binds 127.0.0.1 and each executor
gets 512 MiB (as in the cluster tests).

``source``, in one run on one broker:

1. a warm-up query (the JVM, the Python workers and the source's code paths are
   cold in a fresh session: the first batch of the first query takes seconds, and the
   JVM compiles Spark's per-batch code over the first dozens of batches), of
   ``--warmup-messages`` (1,000,000) on another topic, unmeasured;
2. ``--messages`` bodies of ``--size`` bytes queued on the topic ``bench``, which has two
   channels, ``bench_reader`` and ``spark`` (created first, so each holds every message);
3. the reference: bench_reader (Go's from ``--go-tools``, else this project's
   ``benchmarks.reader``) drains the channel ``bench_reader`` for ``--reference-runfor``
   seconds: msg/s;
4. the source drains the channel ``spark``: the clock runs from the query's start until
   every message is FINed (i.e. committed by Spark): rows/s, and the ratio to step 3;
   also the rate over the middle half (from a quarter FINed to three quarters), which
   leaves out the query's start (Spark starting its Python source runner process) and end.

``--rounds N`` repeats steps 2-4 on a fresh topic N times (reference, source, reference,
source...) and ends with the median and range of the ratios: ``bench_reader``'s own rate
moves by a fifth between runs on one host, so one ratio is one draw.

The source runs with its DEFAULT options unless ``--batch``, ``--in-flight`` or
``--connections`` are given.  The sink is a no-op ``foreachBatch`` (``--sink
foreachbatch``: the rows are planned into partitions but no task reads them) or
Spark's ``noop`` format (``--sink noop``: every row is read by a task and turned
into an Arrow batch).

``sink``: the reference is bench_writer (Go's, else ``benchmarks.writer``: MPUBs of 200
bodies) for ``--reference-runfor`` seconds; then ``spark.range`` rows of ``--size`` bytes
in 2 partitions written by ``df.write.format("nsq")``: the clock covers the ``save()``
and the count is checked in /stats.

CPU per row: the CPU time (user + system, from /proc) over the timed part, of the
Spark side (this process, which is the driver's Python, the JVMs and every Python
worker: this process's descendants, and on a cluster the daemons' descendants) and of
the broker, each divided by the rows; for the reference, bench_reader's (or
bench_writer's) own CPU and the broker's per message.  Needs the spark extra and Java.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import BrokerProcess

from . import ROOT, reader, writer
from .common import load_average
from .tools import GoTools

SPARK_CLUSTER = os.path.join(ROOT, "scripts", "spark_cluster")
BUILD_PYZ = os.path.join(ROOT, "scripts", "build_pyz")


# -- CPU accounting from /proc -------------------------------------------------------


def _stat(pid):
    """(ppid, user + system CPU seconds of the process and its reaped children) from /proc."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return int(fields[1]), ticks / os.sysconf("SC_CLK_TCK")


def _tree_cpu(roots, exclude=()):
    """{pid: CPU seconds} of ``roots`` and every process below them, minus the trees under ``exclude``."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                table[int(entry)] = _stat(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid in exclude or pid in found:
            continue
        found[pid] = table[pid][1]
        todo.extend(children.get(pid, ()))
    return found


class CpuMeter:
    """CPU used by two groups of processes between :meth:`start` and :meth:`stop`: the Spark
    side (``spark_roots`` and their descendants, the broker excluded) and the broker.  A
    process that ends in between counts through its parent's reaped-children time."""

    def __init__(self, spark_roots, broker_pid):
        self.spark_roots = list(spark_roots)
        self.broker_pid = broker_pid

    def _sample(self):
        return (_tree_cpu(self.spark_roots, exclude={self.broker_pid}), _tree_cpu([self.broker_pid]))

    def start(self):
        self._before = self._sample()

    def stop(self):
        """(Spark side, broker) CPU seconds since :meth:`start`."""
        after = self._sample()
        self.by_process = sorted(((v - self._before[0].get(pid, 0.0), pid, _command(pid))
                                  for pid, v in after[0].items()), reverse=True)
        return tuple(sum(v - b.get(pid, 0.0) for pid, v in a.items()) for a, b in zip(after, self._before))

    def print_breakdown(self, rows):
        """The Spark side's CPU per row, process by process (the largest first)."""
        for seconds, pid, command in self.by_process:
            if seconds > 0:
                print("    %6.2f µs/row  pid %d  %s" % (_per_row_us(seconds, rows), pid, command))


def _command(pid):
    """A short name for a process: its program and the argument that tells Spark's apart."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    name = os.path.basename(argv[0])
    for a in argv[1:]:
        if a.startswith("org.apache.spark.") or a.startswith("pyspark.") or a.endswith(".py") or a == "-m":
            return name + " " + a if a != "-m" else name + " -m " + argv[argv.index(a) + 1]
    return name


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _per_row_us(seconds, rows):
    return 1e6 * seconds / rows if rows else float("nan")


# -- the session, local or on a cluster ------------------------------------------------


class Cluster:
    """The standalone cluster ``--master`` names: a running one (``spark://``), or one
    started here by ``scripts/spark_cluster`` (``cluster``) and stopped by :meth:`stop`."""

    def __init__(self, master, workers, tmp):
        self.dir = None
        self.daemon_pids = []
        if master == "cluster":
            self.dir = os.path.join(tmp, "spark-cluster")
            started = subprocess.run([sys.executable, SPARK_CLUSTER, "--dir", self.dir, "start", "--workers",
                                      str(workers)], stdout=subprocess.PIPE, universal_newlines=True, timeout=300)
            if started.returncode != 0:
                raise SystemExit("scripts/spark_cluster start failed")
            self.master = started.stdout.strip().splitlines()[-1]
            with open(os.path.join(self.dir, "state.json")) as f:
                self.daemon_pids = [p["pid"] for p in json.load(f)["processes"]]
        else:
            self.master = master
            self.daemon_pids = self._local_daemons(master)
        self.package = os.path.join(tmp, "nsqd-threaded.zip")
        subprocess.run([sys.executable, BUILD_PYZ, "--installed", "-o", self.package], check=True, timeout=300,
                       stdout=subprocess.DEVNULL)

    @staticmethod
    def _local_daemons(master):
        """The pids of a running cluster's master and workers on this host (the JVMs whose command
        line names the Master or Worker class and, for workers, this master's URL): their CPU
        counts as the Spark side's."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"org.apache.spark.deploy.master.Master" in argv or (
                    b"org.apache.spark.deploy.worker.Worker" in argv and master.encode() in argv):
                pids.append(int(entry))
        return pids

    def conf(self):
        return {"spark.executor.memory": "512m", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1", "spark.submit.pyFiles": self.package}

    def stop(self):
        if self.dir:
            subprocess.run([sys.executable, SPARK_CLUSTER, "--dir", self.dir, "stop"], timeout=120)


def session(local_dir, master, conf):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from nsqd_threaded.spark import NsqDataSource

    builder = SparkSession.builder.master(master).appName("bench_spark")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = (builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.local.dir", local_dir).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NsqDataSource)
    return spark


# -- the broker's side -------------------------------------------------------------


def channel(broker, topic, name):
    for t in broker.stats(topic=topic)["topics"] or ():
        for c in t["channels"] or ():
            if c["channel_name"] == name:
                return c
    return None


def fill(broker, topic, messages, size, channels=()):
    """``messages`` bodies of ``size`` bytes on ``topic``, whose ``channels`` exist first."""
    broker.http("POST", "/topic/create?topic=" + topic)
    for name in channels:
        broker.http("POST", "/channel/create?topic=%s&channel=%s" % (topic, name))
    body = b"x" * size
    t0 = time.monotonic()
    with Producer(broker.tcp_addr) as producer:
        futures = [producer.mpub_async(topic, [body] * 1000) for _ in range(messages // 1000)]
        for f in futures:
            f.result(60)
    print("queued %d messages of %d bytes on %s (channels %s) in %.1fs"
          % (messages, size, topic, ", ".join(channels) or "none yet", time.monotonic() - t0), flush=True)


def reference(broker, args, topic, what):
    """bench_reader (``consume``: draining ``topic``/bench_reader) or bench_writer (``publish``)
    for --reference-runfor seconds: (name, msg/s, the tool's CPU µs/msg, the broker's CPU µs/msg)."""
    go = args.go_tools and GoTools.available(args.go_tools)
    broker_cpu0, tool_cpu0 = _tree_cpu([broker.proc.pid]), _children_cpu()
    if what == "consume":
        if go:
            name = "Go's bench_reader"
            rate = GoTools(args.go_tools).consume(broker.tcp_addr, topic, "bench_reader", args.reference_runfor)
        else:
            name = "benchmarks.reader (no --go-tools)"
            rate = reader.run(broker.tcp_addr, topic, "bench_reader", 2500, args.reference_runfor)[0]
    else:
        if go:
            name = "Go's bench_writer"
            rate = GoTools(args.go_tools).mpub(broker.tcp_addr, topic, args.reference_runfor)
        else:
            name = "benchmarks.writer (no --go-tools)"
            rate = writer.run(broker.tcp_addr, topic, 200, 200, args.reference_runfor)[0]
    count = rate * args.reference_runfor
    broker_cpu = sum(v - broker_cpu0.get(p, 0.0) for p, v in _tree_cpu([broker.proc.pid]).items())
    tool_cpu = _children_cpu() - tool_cpu0 if go else float("nan")  # ours runs in this process
    if what == "consume" and count >= 0.98 * args.messages:
        print("  (the reference ran dry: its rate is a lower bound; give more --messages or a shorter"
              " --reference-runfor)")
    return name, rate, _per_row_us(tool_cpu, count), _per_row_us(broker_cpu, count)


# -- the measurements ----------------------------------------------------------------


def run_query(spark, broker, args, topic, messages, checkpoint, meter=None):
    """Start the source on ``topic``/spark with the options asked for; ``(seconds until
    ``messages`` are FINed, the CPU ``meter``'s reading over them, the middle half)``: the
    middle half is ``(seconds, messages)`` from the first /stats poll that found a quarter
    of them FINed to the first that found three quarters, the steady flow without the
    query's start (Spark starting its Python source runner, the connections being made)
    or its end, or None."""
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
    if meter:
        meter.start()
    t0 = time.monotonic()
    query = stream.start()
    last = t0
    quarters = {}  # 1 and 3: (seconds since the start, FINed) when /stats first showed a quarter, three
    try:
        while True:
            c = channel(broker, topic, "spark")
            done = c["message_count"] - c["depth"] - c["in_flight_count"] if c else 0
            for q in (1, 3):
                if q not in quarters and done * 4 >= q * messages:
                    quarters[q] = (time.monotonic() - t0, done)
            if done >= messages:
                break
            if query.exception() is not None:
                raise SystemExit("query failed: %s" % query.exception())
            if time.monotonic() - last >= 5:
                last = time.monotonic()
                print("  %.0fs: %d FINed" % (last - t0, done), flush=True)
            time.sleep(0.05)  # polling /stats, bounded by the query's progress
        elapsed = time.monotonic() - t0
        middle = None
        if 1 in quarters and 3 in quarters and quarters[3][0] > quarters[1][0]:
            middle = (quarters[3][0] - quarters[1][0], quarters[3][1] - quarters[1][1])
        return elapsed, (meter.stop() if meter else None), middle
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


def report(args, what, rate, spark_us, broker_us, ref, start_load):
    name, ref_rate, tool_us, ref_broker_us = ref
    print("%s (%s): %.0f rows/s; CPU per row: Spark side %.1f µs, broker %.1f µs"
          % (what, args.master, rate, spark_us, broker_us))
    print("reference: %s %.0f msg/s; CPU per message: the tool %.1f µs, broker %.1f µs"
          % (name, ref_rate, tool_us, ref_broker_us))
    print("RESULT %s master=%s rows/s=%.0f ratio=%.2f (to %s) spark_cpu_us_per_row=%.1f broker_cpu_us_per_row=%.1f"
          " load=%.2f..%.2f" % (what, args.master, rate, rate / ref_rate, name, spark_us, broker_us, start_load,
                               load_average()))
    if start_load > 1.0:
        print("LOADED: the run started with the load average above 1.0: indicative only")


def bench_source(spark, broker, args, meter):
    start_load = load_average()
    if not args.no_warmup:
        fill(broker, "warm", args.warmup_messages, args.size)
        elapsed, _, _ = run_query(spark, broker, args, "warm", args.warmup_messages, args.tmp + "/ck-warm")
        print("warm-up query: %d messages in %.1fs (unmeasured)" % (args.warmup_messages, elapsed), flush=True)
        broker.http("POST", "/topic/delete?topic=warm")  # (its messages: memory for the measured rounds)
    ratios = []
    for n in range(1, args.rounds + 1):
        topic = "bench" if args.rounds == 1 else "bench%d" % n
        fill(broker, topic, args.messages, args.size, channels=("bench_reader", "spark"))
        ref = reference(broker, args, topic, "consume")
        print("reference: %s %.0f msg/s" % (ref[0], ref[1]), flush=True)
        elapsed, (spark_cpu, broker_cpu), middle = run_query(spark, broker, args, topic, args.messages,
                                                            "%s/ck-%d" % (args.tmp, n), meter)
        options = ", ".join("%s %s" % (o, v) for o, v in (("maxBatchSize", args.batch), ("maxInFlight", args.in_flight),
                                                          ("connectionsPerNode", args.connections)) if v is not None)
        print("source: %d messages in %.1fs (%s; sink %s)" % (args.messages, elapsed, options or "default options",
                                                             args.sink))
        if middle:
            print("  the middle half (a quarter to three quarters FINed): %d rows in %.2fs, %.0f rows/s (%.2f of the"
                  " reference)" % (middle[1], middle[0], middle[1] / middle[0], middle[1] / middle[0] / ref[1]),
                  flush=True)
        if args.cpu_breakdown:
            meter.print_breakdown(args.messages)
        report(args, "source", args.messages / elapsed, _per_row_us(spark_cpu, args.messages),
               _per_row_us(broker_cpu, args.messages), ref, start_load)
        ratios.append(args.messages / elapsed / ref[1])
        if args.rounds > 1:
            broker.http("POST", "/topic/delete?topic=" + topic)  # (its messages: memory for the next round)
    if args.rounds > 1:
        ratios.sort()
        print("RESULT source rounds=%d ratio median=%.2f range=%.2f..%.2f (each round: the reference, then the source)"
              % (args.rounds, ratios[len(ratios) // 2] if len(ratios) % 2 else
                 (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2, ratios[0], ratios[-1]))


def bench_sink(spark, broker, args, meter):
    start_load = load_average()
    df = spark.range(0, args.messages, 1, 2).selectExpr("concat(cast(id as string), repeat('x', %d)) as body"
                                                          % max(0, args.size - 7))
    df.write.format("noop").mode("overwrite").save()  # warm-up: the same plan without nsq
    df.limit(10000).write.format("nsq").mode("append").option("nsqd", broker.tcp_addr).option("topic", "warm") \
        .option("bodyColumn", "body").save()  # warm-up: the sink's code paths in the Python workers
    ref = reference(broker, args, "reference", "publish")
    broker.http("POST", "/topic/delete?topic=reference")
    print("reference: %s %.0f msg/s" % (ref[0], ref[1]), flush=True)
    meter.start()
    t0 = time.monotonic()
    df.write.format("nsq").mode("append").option("nsqd", broker.tcp_addr).option("topic", "sunk") \
        .option("bodyColumn", "body").save()
    elapsed = time.monotonic() - t0
    spark_cpu, broker_cpu = meter.stop()
    count = [t for t in broker.stats(topic="sunk")["topics"] if t["topic_name"] == "sunk"][0]["message_count"]
    assert count == args.messages, count
    print("sink: %d rows in %.1fs (2 tasks, %d-byte bodies)" % (args.messages, elapsed, args.size))
    if args.cpu_breakdown:
        meter.print_breakdown(args.messages)
    report(args, "sink", args.messages / elapsed, _per_row_us(spark_cpu, args.messages),
           _per_row_us(broker_cpu, args.messages), ref, start_load)


def main():
    parser = argparse.ArgumentParser(prog="scripts/bench spark", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["source", "sink"])
    parser.add_argument("--master", default="local[2]",
                        help="local[N], spark://HOST:PORT (a running cluster) or cluster (started with"
                             " scripts/spark_cluster here, stopped at the end); default local[2]")
    parser.add_argument("--workers", type=int, default=2, help="with --master cluster: worker JVMs of one core")
    parser.add_argument("--messages", type=int, default=1000000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch", type=int, help="the source's maxBatchSize (default: the source's default)")
    parser.add_argument("--in-flight", type=int, help="the source's maxInFlight (default: the source's default)")
    parser.add_argument("--connections", type=int, help="the source's connectionsPerNode (default: the source's)")
    parser.add_argument("--sink", choices=["foreachbatch", "noop"], default="foreachbatch")
    parser.add_argument("--go-tools", metavar="DIR", help="Go's bench_reader/bench_writer from DIR for the reference")
    parser.add_argument("--reference-runfor", type=float, default=1.5,
                        help="seconds of bench_reader (short enough not to drain --messages) or bench_writer")
    parser.add_argument("--rounds", type=int, default=1,
                        help="source: the reference and the source one after the other, this many times on fresh"
                             " topics (the ratio's median and range at the end)")
    parser.add_argument("--no-warmup", action="store_true", help="time the session's first query")
    parser.add_argument("--progress", action="store_true", help="print where Spark's batches spent their time")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (again for more)")
    parser.add_argument("--cpu-breakdown", action="store_true", help="print the Spark side's CPU process by process")
    parser.add_argument("--warmup-messages", type=int, default=1000000,
                        help="rows of the warm-up query (the JVM compiles Spark's per-batch code over its first dozens of batches)")
    parser.add_argument("--broker-flag", action="append", default=[], metavar="--FLAG=VALUE",
                        help="a flag for the broker, such as --max-rdy-count=25000 (again for more)")
    parser.add_argument("--broker-python", default=sys.executable, help="the interpreter that runs the broker")
    args = parser.parse_args()
    if not (args.master.startswith("local") or args.master.startswith("spark://") or args.master == "cluster"):
        parser.error("--master: local[N], spark://HOST:PORT or cluster")
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        args.tmp = tmp
        cluster = None if args.master.startswith("local") else Cluster(args.master, args.workers, tmp)
        try:
            if cluster:
                args.master = cluster.master if args.master == "cluster" else args.master
            conf = cluster.conf() if cluster else {}
            conf.update(item.split("=", 1) for item in args.conf)
            spark = session(tmp, args.master, conf)
            try:
                command = [args.broker_python, "-m", "nsqd_threaded"]
                with BrokerProcess("--mem-queue-size=%d" % max(args.messages, args.warmup_messages),
                                   *args.broker_flag, command=command, tmp_dir=tmp) as broker:
                    meter = CpuMeter([os.getpid()] + (cluster.daemon_pids if cluster else []), broker.proc.pid)
                    (bench_source if args.what == "source" else bench_sink)(spark, broker, args, meter)
            finally:
                spark.stop()
        finally:
            if cluster:
                cluster.stop()


if __name__ == "__main__":
    main()
