"""Durable mode: the topic's replay after a kill (``Topic._plan_replay_locked``) is settled before a
graceful stop, so that Go nsqd started on the directory next finds every message once.

The state a SIGKILL leaves between a channel's fsync of the batch the topic was copying and the topic's
acknowledgement of it is built directly: a run that copied everything and stopped gracefully, then the
topic's metadata moved back to before the batch (the acknowledgement that was not written), and, for a
second channel, its copy cut off (a kill between the two channels' writes).  The topic is paused, so
that the pump gets no chance to settle the replay before the stop unless it must (the flaky CI failure
of test_crash_loop's Go test was a stop that came before the pump ran).
"""

import collections
import os

import pytest

from nsqd_threaded import NSQD, Options
from nsqd_threaded.storage.meta_file import format_meta, parse_meta
from nsqd_threaded.storage.records import read_records

from support.logs import LogCapture
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(60)

SENT = [b"m%d" % i for i in range(300)]


def start(data):
    options = Options(data_path=str(data), tcp_address="127.0.0.1:0", http_address="", node_id=1, durable=True)
    return NSQD(options, log_stream=LogCapture()).start()


def meta_of(data, name):
    fields, error = parse_meta((data / ("%s.diskqueue.meta.dat" % name)).read_bytes())
    assert error is None, error
    return fields


def data_file(data, name, num):
    return str(data / ("%s.diskqueue.%06d.dat" % (name, num)))


def records_of(data, name, num=0):
    return list(read_records(data_file(data, name, num), 0, None, 26, 1 << 20))


def go_reads(data, name):
    """The bodies Go nsqd's diskqueue reads of queue ``name``: from the metadata's read position, each
    file before the write file to its end, the write file up to the write position."""
    _, rf, rp, wf, wp = meta_of(data, name)
    bodies = []
    for num in range(rf, wf + 1):
        end = wp if num == wf else None
        bodies += [bytes(m.body) for _, m in read_records(data_file(data, name, num), rp if num == rf else 0,
                                                          end, 26, 1 << 20)]
    return bodies


def test_a_replay_the_channels_hold_is_acknowledged_before_a_graceful_stop(tmp_path):
    nsqd = start(tmp_path)
    try:
        topic = nsqd.get_topic("orders")
        channels = [topic.get_channel("audit"), topic.get_channel("audit2")]
        with Conn(nsqd.tcp_address) as pub:
            for body in SENT[:150]:
                pub.pub("orders", body)
            pub.mpub("orders", SENT[150:])
        wait_for(lambda: not topic.owes_fan_out() and all(c.depth() == 300 for c in channels),
                 what=lambda: "copies: %s" % [c.depth() for c in channels])
        topic.pause()
        nsqd.persist_metadata()
    finally:
        nsqd.stop()
    # The kill's state: the topic's acknowledgement of its copy of the MPUB's batch never written...
    topic_records = records_of(tmp_path, "orders")
    assert [bytes(m.body) for _, m in topic_records] == SENT
    batch_at = topic_records[150][0]
    depth, rf, rp, wf, wp = meta_of(tmp_path, "orders")
    assert (depth, rf, wf, rp) == (0, 0, 0, wp)  # (everything acknowledged, in file 0)
    (tmp_path / "orders.diskqueue.meta.dat").write_bytes(format_meta(150, 0, batch_at, 0, wp))
    # ... and the second channel's copy not written either (the pump writes one channel after the other).
    audit2 = records_of(tmp_path, "orders:audit2")
    assert [bytes(m.body) for _, m in audit2] == SENT and meta_of(tmp_path, "orders:audit2")[1:3] == [0, 0]
    os.truncate(data_file(tmp_path, "orders:audit2", 0), audit2[150][0])
    (tmp_path / "orders:audit2.diskqueue.meta.dat").write_bytes(format_meta(150, 0, 0, 0, audit2[150][0]))
    assert go_reads(tmp_path, "orders") == SENT[150:]
    assert go_reads(tmp_path, "orders:audit") == SENT and go_reads(tmp_path, "orders:audit2") == SENT[:150]

    nsqd = start(tmp_path)  # recovers: the replay is planned (audit holds all of it, audit2 none)...
    try:
        assert nsqd.get_existing_topic("orders").paused
    finally:
        nsqd.stop()  # ... and settled before the stop returns, paused or not

    assert go_reads(tmp_path, "orders") == []  # nothing left in the topic that a channel holds
    for name in ("orders:audit", "orders:audit2"):
        got = go_reads(tmp_path, name)
        assert sorted(got) == sorted(SENT), (name, collections.Counter(got).most_common(2))  # each once

    nsqd = start(tmp_path)  # and this broker, restarted once more, copies nothing again
    try:
        topic = nsqd.get_existing_topic("orders")
        topic.unpause()
        for name in ("audit", "audit2"):
            assert topic.get_existing_channel(name).depth() == 300
        assert not topic.owes_fan_out()
    finally:
        nsqd.stop()
    for name in ("orders:audit", "orders:audit2"):
        assert sorted(go_reads(tmp_path, name)) == sorted(SENT)
