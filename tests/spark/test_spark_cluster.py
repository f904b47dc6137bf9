"""The nsq data source on a Spark standalone cluster (``scripts/spark_cluster``): a master and
two workers as separate JVMs, applications submitted to ``spark://`` from child processes.

The package reaches the executors as ``spark.submit.pyFiles`` of the zip ``scripts/build_pyz``
makes, and each test checks that the executors imported it from there.  Every figure (rows,
duplicates, seconds) is printed and recorded as a property of the test.  The worker-kill test
runs last: it leaves the module's cluster one worker short.
"""

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from nsqd_threaded.client import Consumer, Producer
from nsqd_threaded.testing import Broker

from support.spark import (LEAN_JVM, StreamChild, channel_stats, committed_rows, drained, finished,
                           spark_environment, topic_count, wait_until)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "spark_cluster")


class SparkCluster:
    def __init__(self, directory, package):
        self.dir = directory
        self.package = package  # the zip shipped to executors
        with open(os.path.join(directory, "state.json")) as f:
            self.state = json.load(f)
        self.master = self.state["master"]

    def conf(self, **more):
        """An application's settings: small executors, the driver on 127.0.0.1, the package shipped."""
        conf = {"spark.executor.memory": "512m", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1", "spark.submit.pyFiles": self.package,
                "spark.executor.extraJavaOptions": LEAN_JVM}
        conf.update(more)
        return conf

    def worker_pid(self, name):
        return [p["pid"] for p in self.state["processes"] if p["name"] == name][0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``scripts/spark_cluster start`` once for the module (2 workers of 1 core), stopped after it."""
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("no Java: the cluster tests need Java 17+")
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    directory = str(tmp_path_factory.mktemp("spark-cluster"))
    package = os.path.join(directory, "nsqd-threaded.zip")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "build_pyz"), "--installed", "-o", package],
                   check=True, timeout=120, stdout=subprocess.DEVNULL)
    command = [sys.executable, SCRIPT, "--dir", directory]
    try:
        started = subprocess.run(command + ["start", "--workers", "2", "--java-options=" + LEAN_JVM], timeout=240,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True)
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip().startswith("spark://127.0.0.1:")
        yield SparkCluster(directory, package)
    finally:
        subprocess.run(command + ["stop"], timeout=120)


def _publish(address, topic, bodies, chunk=2000):
    with Producer(address) as producer:
        for i in range(0, len(bodies), chunk):
            producer.mpub(topic, bodies[i:i + chunk])


def _executor(where, cluster, driver_pid):
    """The executor a row's ``where`` (cwd|pid|module) names: ``worker-N/EXECUTOR_ID``; checks that
    it is an executor's Python worker of this cluster that imported the shipped package."""
    cwd, pid, module = where.split("|")
    work = os.path.join(cluster.dir, "work")
    assert os.path.commonpath([cwd, work]) == work, where
    assert int(pid) != driver_pid
    assert "nsqd-threaded.zip" in module, module
    worker, _app, executor = os.path.relpath(cwd, work).split(os.sep)
    return "%s/%s" % (worker, executor)


def _report(record_property, name, text):
    print("%s: %s" % (name, text))
    record_property(name, text)


def _run_source(cluster, broker, tmp_path, name, topic, channel, conf=None, where=0, **options):
    local = tmp_path / ("local-" + name)
    local.mkdir()
    return StreamChild(broker.tcp_addr, topic, channel, str(tmp_path / ("out-" + name)),
                       str(tmp_path / ("checkpoint-" + name)), str(local), master=cluster.master,
                       conf=conf or cluster.conf(), where=where, **options)


def _wait_running(child, what):
    wait_until(lambda: child.driver_pid or child.proc.poll() is not None, 180, "%s's session" % what)
    assert child.proc.poll() is None, child.stderr_tail()


def test_source_rows_are_decoded_on_both_executors(cluster, tmp_path, record_property):
    total = 10000
    bodies = [b"event %05d" % i for i in range(total)]
    t0 = time.monotonic()
    with Broker() as broker:
        _publish(broker.tcp_addr, "events", bodies)
        child = _run_source(cluster, broker, tmp_path, "a", "events", "spark", maxBatchSize="2500",
                            maxInFlight="5000")
        try:
            wait_until(lambda: drained([broker], "events", "spark", total) or child.proc.poll() is not None, 180,
                       lambda: "every message FINed (%s)" % child.stderr_tail())
            assert child.proc.poll() is None, child.stderr_tail()
        finally:
            child.stop()
    elapsed = time.monotonic() - t0
    rows = committed_rows(str(tmp_path / "out-a"))
    counts = collections.Counter(r["body"] for r in rows)
    executors = collections.Counter(_executor(r["where"], cluster, child.driver_pid) for r in rows)
    _report(record_property, "cluster_source", "%d of %d messages, %d duplicates, %.0fs; rows per executor %s"
            % (len(counts), total, len(rows) - len(counts), elapsed, dict(executors)))
    assert set(counts) == set(bodies)
    assert len({w.split("/")[0] for w in executors}) == 2  # both worker JVMs decoded rows


def test_sink_publishes_from_executors_exactly_once(cluster, tmp_path, record_property):
    total = 30000
    local = tmp_path / "local"
    local.mkdir()
    t0 = time.monotonic()
    with Broker() as broker:
        env = spark_environment(dict(os.environ))
        env["NSQ_TEST_SPARK"] = json.dumps({"master": cluster.master, "conf": cluster.conf()})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
        env["TMPDIR"] = str(local)
        child = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "support", "spark.py"), "--sink",
                                broker.tcp_addr, "sunk", str(total), str(local)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                               timeout=240, start_new_session=True)
        assert "published %d" % total in child.stdout, child.stderr[-3000:]
        assert topic_count(broker, "sunk") == total
        got = collections.Counter()
        with Consumer(broker.tcp_addr, "sunk", "check", max_in_flight=2500) as consumer:
            for _ in range(total):
                message = consumer.get(timeout=30)
                got[message.body.decode()] += 1
                message.fin()
    elapsed = time.monotonic() - t0
    numbers = collections.Counter(int(body.split("|", 1)[0]) for body in got.elements())
    executors = collections.Counter(_executor(body.split("|", 1)[1], cluster, None) for body in got.elements())
    _report(record_property, "cluster_sink", "%d messages for %d rows, %d distinct, %.0fs; rows per executor %s"
            % (sum(got.values()), total, len(numbers), elapsed, dict(executors)))
    assert sorted(numbers) == list(range(total)) and set(numbers.values()) == {1}
    assert len({w.split("/")[0] for w in executors}) == 2


def test_two_applications_share_one_channel(cluster, tmp_path, record_property):
    """Two applications (one executor each, on different workers) consume one channel: nsqd
    balances the messages between their drivers, every message lands in exactly one of them."""
    total = 10000
    bodies = [b"shared %05d" % i for i in range(total)]
    conf = cluster.conf(**{"spark.cores.max": "1"})
    options = {"maxInFlight": "2000", "maxBatchSize": "1000"}
    t0 = time.monotonic()
    with Broker() as broker:
        children = [_run_source(cluster, broker, tmp_path, name, "shared", "spark", conf, **options)
                    for name in ("a", "b")]
        try:
            for child in children:
                _wait_running(child, "an application")
            # Both subscribed (one connection each) before anything is published: otherwise the
            # first one takes the whole backlog up to its maxInFlight.
            wait_until(lambda: (channel_stats(broker, "shared", "spark") or {}).get("client_count") == 2, 180,
                       lambda: "both applications subscribed (%s)" % [c.stderr_tail(5) for c in children])
            _publish(broker.tcp_addr, "shared", bodies)
            wait_until(lambda: drained([broker], "shared", "spark", total)
                       or any(c.proc.poll() is not None for c in children), 180, "every message FINed")
            assert all(c.proc.poll() is None for c in children), [c.stderr_tail() for c in children]
        finally:
            for child in children:
                child.stop()
    elapsed = time.monotonic() - t0
    outputs = [committed_rows(str(tmp_path / ("out-" + name))) for name in ("a", "b")]
    split = [len(rows) for rows in outputs]
    counts = collections.Counter(r["body"] for rows in outputs for r in rows)
    workers = [{_executor(r["where"], cluster, c.driver_pid).split("/")[0] for r in rows}
               for rows, c in zip(outputs, children)]
    _report(record_property, "cluster_two_apps", "%d of %d messages, split %s, %d duplicates, %.0fs; workers %s"
            % (len(counts), total, split, sum(split) - len(counts), elapsed, workers))
    assert set(counts) == set(bodies)
    assert all(split), split  # each application got a share
    assert len(workers[0]) == len(workers[1]) == 1 and workers[0] != workers[1]


def test_a_worker_killed_mid_query_loses_nothing(cluster, tmp_path, record_property):
    """SIGKILL one worker JVM with its executor and Python workers while batches run (each row
    takes a millisecond, so tasks are running): Spark reruns the lost tasks on the other
    executor from the partitions the driver still holds; nothing is lost."""
    total = 10000
    bodies = [b"order %05d" % i for i in range(total)]
    t0 = time.monotonic()
    with Broker() as broker:
        _publish(broker.tcp_addr, "orders", bodies)
        child = _run_source(cluster, broker, tmp_path, "k", "orders", "spark", where=0.001,
                            maxBatchSize="1000", maxInFlight="2000")
        try:
            wait_until(lambda: finished(broker, "orders", "spark") >= 2000 or child.proc.poll() is not None, 180,
                       "the first batches committed")
            assert child.proc.poll() is None, child.stderr_tail()
            worker = cluster.worker_pid("worker-1")
            victims = [worker] + _descendants(worker)
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed_at = finished(broker, "orders", "spark")
            wait_until(lambda: drained([broker], "orders", "spark", total) or child.proc.poll() is not None, 180,
                       lambda: "every message FINed after the kill (%s)" % child.stderr_tail())
            assert child.proc.poll() is None, child.stderr_tail()
        finally:
            child.stop()
        requeued = channel_stats(broker, "orders", "spark")["requeue_count"]
    elapsed = time.monotonic() - t0
    rows = committed_rows(str(tmp_path / "out-k"))
    counts = collections.Counter(r["body"] for r in rows)
    lost = set(bodies) - set(counts)
    lost_executors = child.stderr_text().count("Lost executor")
    _report(record_property, "cluster_worker_kill",
            "killed worker-1 (%d processes) at %d FINed; %d of %d messages, %d lost, %d duplicates, requeued %d, "
            "executors lost (driver's log) %d, %.0fs"
            % (len(victims), killed_at, len(counts), total, len(lost), len(rows) - len(counts), requeued,
               lost_executors, elapsed))
    assert not lost
    assert lost_executors >= 1


def _descendants(pid):
    from support.spark import _descendants as below

    return below(pid)
