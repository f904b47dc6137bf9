"""Crash safety of the nsq source: SIGKILL the query's whole process tree mid-stream, restart from
the checkpoint, and check that no message is lost (duplicates are counted and reported)."""

import collections
import os
import shutil

import pytest

from nsqd_threaded.client import Producer
from nsqd_threaded.testing import Broker

from support.spark import StreamChild, channel_stats, drained, finished, require_spark, spark, wait_until  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

TOTAL = 4000
TOPIC, CHANNEL = "orders", "archive"
# Small batches so that there are many to kill between; a short msg_timeout so that
# what a killed query held comes back soon.
OPTIONS = {"maxBatchSize": "200", "maxInFlight": "500", "msgTimeoutMs": "3000"}


def _finished(broker):
    return finished(broker, TOPIC, CHANNEL)


def _in_flight(broker):
    c = channel_stats(broker, TOPIC, CHANNEL)
    return c["in_flight_count"] if c else 0


def test_sigkill_mid_stream_loses_nothing(spark, tmp_path, record_property):
    require_spark()
    bodies = [b"order-%05d" % i for i in range(TOTAL)]
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    local = tmp_path / "local"
    local.mkdir()
    kills = []
    restarts = []  # restarts that needed a fresh checkpoint
    with Broker() as broker:
        with Producer(broker.tcp_addr) as producer:
            for i in range(0, TOTAL, 1000):
                producer.mpub(TOPIC, bodies[i:i + 1000])

        def run(until, what):
            child = StreamChild(broker.tcp_addr, TOPIC, CHANNEL, out, checkpoint, str(local), **OPTIONS)
            wait_until(lambda: child.batches or child.proc.poll() is not None or until(child), 240, "a first batch")
            if child.proc.poll() is not None and "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY" in child.stderr_tail():
                # Killed while writing its first offset entry, Spark refuses the checkpoint. Nothing
                # was FINed before a first commit: starting afresh is safe (see docs/spark.md).
                assert _finished(broker) == 0
                restarts.append("fresh checkpoint")
                child.kill()
                shutil.rmtree(checkpoint)
                shutil.rmtree(out, ignore_errors=True)
                child = StreamChild(broker.tcp_addr, TOPIC, CHANNEL, out, checkpoint, str(local), **OPTIONS)
            try:
                wait_until(lambda: until(child) or child.proc.poll() is not None, 240,
                           lambda: "%s (batches %s, channel %s, kills so far %s); child's log: %s"
                           % (what, child.batches[-3:], channel_stats(broker, TOPIC, CHANNEL), kills,
                              child.stderr_tail()))
                assert child.proc.poll() is None, "the query exited early (%s): %s" % (
                    child.proc.returncode, child.stderr_tail())
            except BaseException:
                child.kill()
                raise
            return child

        # 1. Before the first commit: batch 0 planned (in the offset log), its messages delivered
        # to the driver, none FINed yet.
        first_offsets = os.path.join(checkpoint, "offsets", "0")
        child = run(lambda c: os.path.exists(first_offsets) and _in_flight(broker) > 0 and _finished(broker) == 0,
                    "batch 0 planned")
        child.kill()
        kills.append(("before the first commit", _finished(broker)))
        # 2. Between batches, twice: some committed and FINed, more still to come.
        for _ in range(2):
            start = _finished(broker)
            child = run(lambda c: _finished(broker) >= start + 600 and _finished(broker) < TOTAL - 600,
                        "more batches committed")
            child.kill()
            kills.append(("between batches", _finished(broker)))
        # 3. The last run drains the rest and stops cleanly.
        child = run(lambda c: drained([broker], TOPIC, CHANNEL, TOTAL), "every message FINed")
        child.stop()
    rows = spark.read.parquet(out).select("body", "nsqd", "message_id").collect()
    counts = collections.Counter(bytes(r.body) for r in rows)
    lost = set(bodies) - set(counts)
    duplicates = sum(n - 1 for n in counts.values())
    distinct_ids = len({(r.nsqd, r.message_id) for r in rows})
    report = "kills (point, FINed so far): %s; %s; rows %d, lost %d, duplicates %d" % (
        kills, restarts or "no fresh checkpoint needed", len(rows), len(lost), duplicates)
    print(report)
    record_property("spark_crash", report)
    assert not lost, report
    assert distinct_ids == len(counts)  # (nsqd, message_id) identifies a message: dedupe on it
