"""Spark for the tests: one session-scoped SparkSession, helpers, and a child-process query.

pyspark is imported lazily: the CI matrix collects these modules with ``-m "not spark"``
where only the ``test`` extra is installed.  A missing Java or pyspark FAILS the spark
tests with how to install it (never a silent skip).

Run as a script (``python tests/support/spark.py NSQD TOPIC CHANNEL OUT CHECKPOINT``) it is
the crash tests' child: a streaming query from nsq to Parquet that prints each finished
batch (``batch <id> <rows>``) on stdout and stops cleanly when its stdin closes.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

JAVA_HELP = ("the spark tests need Java 17+ (`java` on PATH or JAVA_HOME): "
             "apt-get install openjdk-17-jre-headless (Debian/Ubuntu), then run scripts/test again")
PYSPARK_HELP = "the spark tests need the spark extra: pip install -e '.[test,spark]' (scripts/test does)"


def spark_environment(env=None):
    """``env`` (default os.environ) made ready for Spark: workers run this interpreter."""
    env = os.environ if env is None else env
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def require_spark():
    """Fail (not skip) with instructions when Java or pyspark is missing."""
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.fail(JAVA_HELP, pytrace=False)
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        pytest.fail("%s (%s)" % (PYSPARK_HELP, e), pytrace=False)


# The tests' JVMs (drivers, executors, the cluster's daemons) compile with C1 only and collect with one
# thread: they run seconds on small data, where C2's compilations and G1's threads cost the machine
# more CPU than they give back (on two cores shared with the rest of the suite: about a third of it).
# What the tests check (rows, messages, failures) does not depend on the JIT or the collector.
LEAN_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def new_session(local_dir, app="nsqd-threaded-tests", master="local[2]", conf=None):
    """A SparkSession (``local[2]`` unless ``master`` says otherwise, more settings in ``conf``)
    with the nsq data source registered; its scratch files in ``local_dir``."""
    spark_environment()
    from pyspark.sql import SparkSession

    from nsqd_threaded.spark import NsqDataSource

    builder = SparkSession.builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = (
        builder
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", local_dir)
        .config("spark.driver.extraJavaOptions", "-Djava.io.tmpdir=%s %s" % (local_dir, LEAN_JVM))
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NsqDataSource)
    return spark


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """The tests' one SparkSession (Spark start-ups are slow: share it)."""
    require_spark()
    session = new_session(str(tmp_path_factory.mktemp("spark-local")))
    yield session
    session.stop()


def wait_until(predicate, timeout, what, interval=0.2):
    """:func:`support.wire.wait_for` polling every 0.2 s: Spark and nsqd are observed from outside."""
    from support.wire import wait_for  # (here: this file also runs as a script, where support is not a package)

    return wait_for(predicate, timeout, interval=interval, what=what)


def channel_stats(broker, topic, channel):
    """The channel's /stats dict (None if it does not exist yet)."""
    for t in broker.stats(topic=topic)["topics"] or ():
        if t["topic_name"] == topic:
            for c in t["channels"] or ():
                if c["channel_name"] == channel:
                    return c
    return None


def topic_count(broker, topic):
    for t in broker.stats(topic=topic)["topics"] or ():
        if t["topic_name"] == topic:
            return t["message_count"]
    return 0


def finished(broker, topic, channel):
    """Messages of the channel FINed so far, by any client past or present (what left for good)."""
    c = channel_stats(broker, topic, channel)
    if c is None:
        return 0
    return c["message_count"] - c["depth"] - c["in_flight_count"] - c["deferred_count"]


def drained(brokers, topic, channel, total):
    """Every message of the channel FINed on these brokers (``total`` in all), none left."""
    done = 0
    for broker in brokers:
        c = channel_stats(broker, topic, channel)
        if c is None or c["depth"] or c["in_flight_count"] or c["deferred_count"]:
            return False
        done += finished(broker, topic, channel)
    return done >= total


def query_state(query, brokers, topic, channel):
    """What a stuck query and its channels look like (for a timeout's message): the query's status
    and last progress, and per broker the channel's counts and each client's RDY and in-flight."""
    parts = ["query status %s, last progress %s" % (query.status, json.dumps(query.lastProgress)[:1500])]
    for broker in brokers:
        c = channel_stats(broker, topic, channel)
        if c is None:
            parts.append("%s: no channel" % broker.tcp_addr)
            continue
        clients = sorted("%s rdy %d inflight %d fin %d" % (k["client_id"], k["ready_count"], k["in_flight_count"],
                                                             k["finish_count"]) for k in c["clients"])
        parts.append("%s: depth %d in flight %d deferred %d finished %d; %d clients: %s" % (
            broker.tcp_addr, c["depth"], c["in_flight_count"], c["deferred_count"], finished(broker, topic, channel),
            len(clients), "; ".join(clients)))
    return " | ".join(parts)


def total_rows(query):
    return sum(p["numInputRows"] for p in query.recentProgress)


def user_line(error):
    """The line a user reads in a Spark error from the data source: ``nsq: ...``."""
    for line in str(error).splitlines():
        marker = "NsqOptionError: "
        if marker in line:
            return line.split(marker, 1)[1].strip()
    raise AssertionError("no NsqOptionError in %r" % str(error)[:2000])


# -- the crash tests' child ----------------------------------------------------------------


class StreamChild:
    """A streaming query nsq -> Parquet in a child process (its own process group, so that a
    SIGKILL takes the JVM and its Python workers with it)."""

    def __init__(self, nsqd, topic, channel, out, checkpoint, local_dir, master="local[2]", conf=None, where=None,
                 **options):
        """``master``/``conf``: the session's; ``where`` (seconds per row, or 0): add a column
        ``where`` that says which process handled each row (see :func:`where_column`)."""
        env = spark_environment(dict(os.environ))
        env["NSQ_TEST_SPARK"] = json.dumps({"master": master, "conf": conf or {}, "where": where})
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        env["TMPDIR"] = local_dir
        args = [sys.executable, os.path.abspath(__file__), nsqd, topic, channel, out, checkpoint, local_dir]
        args += ["%s=%s" % kv for kv in sorted(options.items())]
        self.stderr_path = os.path.join(local_dir, "child-%d.err" % time.monotonic_ns())
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, env=env, start_new_session=True,
                                         universal_newlines=True)
        self.batches = []  # (batch id, rows) the child reported
        self.driver_pid = None  # the driver's pid, once the child's session started
        self._reader = threading.Thread(target=self._read, name="spark-child-stdout", daemon=True)
        self._reader.start()

    def stderr_text(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def stderr_tail(self, n=15):
        """The last lines the child wrote on stderr (Spark's log, tracebacks), for failure messages."""
        with open(self.stderr_path, errors="replace") as f:
            lines = [line for line in f if not line.lstrip().startswith("at ")]
        return "".join(lines[-n:])

    def _read(self):
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "batch":
                self.batches.append((int(parts[1]), int(parts[2])))
            elif len(parts) == 2 and parts[0] == "driver":
                self.driver_pid = int(parts[1])

    def kill(self):
        """SIGKILL the child and every process under it: its group (driver, JVM) and the Python
        worker daemon, which Spark puts in a group of its own."""
        victims = _descendants(self.proc.pid)
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        for pid in victims:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        self._close_pipes()

    def stop(self, timeout=60):
        """Close stdin: the child stops its query and Spark and exits; killed if it does not."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.kill()
        return self.proc.returncode

    def _close_pipes(self):
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


def _descendants(pid):
    """The pids of every process below ``pid`` (from /proc; empty where there is none)."""
    children = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def where_column(delay=0.0):
    """A column naming the process that computed each row, ``cwd|pid|module``: the working
    directory (a standalone executor runs in ``WORK_DIR/APP_ID/EXECUTOR_ID``, and so do its
    Python workers), the pid, and the file ``nsqd_threaded`` was imported from there.
    Each row takes ``delay`` seconds more (so that tasks last long enough to be killed)."""
    from pyspark.sql import functions as F

    def where():
        import time

        import nsqd_threaded

        if delay:
            time.sleep(delay)
        return "%s|%d|%s" % (os.getcwd(), os.getpid(), nsqd_threaded.__file__)

    return F.udf(where).asNondeterministic()()


def _child_setup():
    setup = json.loads(os.environ.get("NSQ_TEST_SPARK") or "{}")
    return setup.get("master", "local[2]"), setup.get("conf") or {}, setup.get("where")


def _child_main(argv):
    nsqd, topic, channel, out, checkpoint, local_dir = argv[:6]
    options = dict(a.split("=", 1) for a in argv[6:])
    master, conf, where = _child_setup()
    spark = new_session(local_dir, "nsq-child", master, conf)
    print("driver %d" % os.getpid(), flush=True)
    reader = spark.readStream.format("nsq").option("nsqd", nsqd).option("topic", topic).option("channel", channel)
    for key, value in options.items():
        reader = reader.option(key, value)
    frame = reader.load()
    if where is not None:
        frame = frame.withColumn("where", where_column(where))
    query = (frame.writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds").start())
    done = threading.Event()

    def watch_stdin():
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
    seen = -1
    while not done.wait(0.1):
        if not query.isActive:
            print("query ended: %s" % query.exception(), file=sys.stderr, flush=True)
            spark.stop()
            sys.exit(1)
        for progress in query.recentProgress:
            if progress["batchId"] > seen:
                seen = progress["batchId"]
                print("batch %d %d" % (seen, progress["numInputRows"]), flush=True)
    query.stop()
    spark.stop()


def _sink_main(argv):
    """``--sink NSQD TOPIC ROWS LOCAL_DIR``: ROWS rows ``n|where`` in 4 partitions, written by the
    nsq sink; prints ``published ROWS`` once ``save()`` returned."""
    nsqd, topic, rows, local_dir = argv
    master, conf, _ = _child_setup()
    spark = new_session(local_dir, "nsq-sink-child", master, conf)
    from pyspark.sql import functions as F

    frame = spark.range(int(rows)).repartition(4).select(F.concat_ws("|", F.col("id").cast("string"),
                                                                     where_column()).alias("body"))
    frame.write.format("nsq").mode("append").option("nsqd", nsqd).option("topic", topic) \
        .option("bodyColumn", "body").save()
    print("published %s" % rows, flush=True)
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sink"]:
        _sink_main(sys.argv[2:])
    else:
        _child_main(sys.argv[1:])


def committed_rows(out):
    """The rows a streaming Parquet sink committed to ``out`` (read with pyarrow, so no
    SparkSession is needed): only the files its ``_spark_metadata`` log lists, as Spark reads
    them (a task killed half-way leaves a file no batch committed)."""
    import pyarrow.parquet as pq

    log = os.path.join(out, "_spark_metadata")
    paths = set()
    for name in os.listdir(log):
        if name.startswith(".") or name.endswith(".tmp"):
            continue
        with open(os.path.join(log, name)) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    entry = json.loads(line)
                    if entry.get("action", "add") == "add":
                        paths.add(entry["path"])
    rows = []
    for path in sorted(paths):
        rows.extend(pq.read_table(path.replace("file://", "", 1)).to_pylist())
    return rows
