"""Topic against real channels and disk queues: fan-out, backlog, overflow, flush, start/stop."""

import os
import socket
import threading

import pytest

from nsqd_threaded import NSQD, Options
from nsqd_threaded.broker.topic import TopicError

from support.core import DrivenSubscriber, make_owner, wait_until
from support.logs import LogCapture

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def owners(tmp_path):
    """Factory of unstarted brokers on ``tmp_path/data`` (or ``path``); all stopped at teardown."""
    made = []

    def make(path=None, **options):
        nsqd = make_owner(path or tmp_path / "data", **options)
        made.append(nsqd)
        return nsqd

    yield make
    for nsqd in made:
        nsqd.stop()


def bodies(n, tag=b"m"):
    return [b"%s-%d" % (tag, i) for i in range(n)]


def pump_threads(topic_names):
    names = {"nsqd-topic-pump[%s]" % t for t in topic_names}
    return [t for t in threading.enumerate() if t.name in names]


def test_fan_out_every_channel_gets_every_message_in_order_as_copies(owners):
    nsqd = owners()
    topic = nsqd.get_topic("fan")
    a, b = topic.get_channel("a"), topic.get_channel("b")
    topic.publish(bodies(20))
    topic.publish([b"last"])
    ca, cb = DrivenSubscriber(nsqd, a), DrivenSubscriber(nsqd, b)
    got_a, got_b = ca.take_all(21), cb.take_all(21)
    assert [m.body for m in got_a] == bodies(20) + [b"last"]
    assert [m.body for m in got_b] == [m.body for m in got_a]
    assert [m.id for m in got_b] == [m.id for m in got_a]
    assert len({m.id for m in got_a}) == 21
    assert all(x is not y for x, y in zip(got_a, got_b))  # each channel owns its messages
    assert topic.snapshot()[2:4] == (21, sum(len(x) for x in bodies(20)) + 4)


def test_fan_out_queues_one_shared_record_per_message_inline_and_from_the_backlog(owners):
    """A queued message is its record, the same bytes object in every channel; a Message only once taken."""
    nsqd = owners()
    nsqd.start()
    topic = nsqd.get_topic("shared")
    a, b = topic.get_channel("a"), topic.get_channel("b")
    topic.publish([b"inline"])
    topic.pause()
    topic.publish([b"backlog"])
    topic.unpause()
    wait_until(lambda: a.depth() == 2 and b.depth() == 2, what="the backlog fanned out")
    queued_a, queued_b = a.inside(10)["memory"], b.inside(10)["memory"]
    assert all(type(r) is bytes for r in queued_a)
    assert [r[26:] for r in queued_a] == [b"inline", b"backlog"]
    assert all(x is y for x, y in zip(queued_a, queued_b))
    got = DrivenSubscriber(nsqd, a).take_all(2)
    assert [(m.body, m.attempts) for m in got] == [(b"inline", 1), (b"backlog", 1)]


def test_a_deferred_publish_is_deferred_in_every_channel_inline_or_from_the_backlog(owners):
    # (The first channel's put clears its originals' deferral once indexed: the others'
    # copies must not be made from them afterwards.)
    nsqd = owners()
    topic = nsqd.get_topic("later")
    channels = [topic.get_channel(name) for name in "abc"]
    topic.publish([b"x", b"y"], defer_ns=3600 * 10**9)
    topic.publish([b"now"])
    assert [(c.deferred_count(), c.depth()) for c in channels] == [(2, 1)] * 3

    topic = nsqd.get_topic("later-backlog")
    channels = [topic.get_channel(name) for name in "abc"]
    topic.pause()
    topic.publish([b"x", b"y"], defer_ns=3600 * 10**9)
    topic.publish([b"now"])
    topic.start()
    topic.unpause()
    wait_until(lambda: [(c.deferred_count(), c.depth()) for c in channels] == [(2, 1)] * 3,
               what="the pump to fan out the backlog, deferral kept in every channel")


def test_no_channel_keeps_a_backlog_that_the_pump_drains_once_one_exists(owners):
    nsqd = owners()
    topic = nsqd.get_topic("backlog")
    topic.start()
    topic.publish(bodies(5))
    assert topic.depth() == 5
    channel = topic.get_channel("c")
    wait_until(lambda: channel.depth() == 5, what="the pump to drain the backlog")
    assert topic.depth() == 0
    assert [m.body for m in DrivenSubscriber(nsqd, channel).take_all(5)] == bodies(5)


def test_paused_topic_keeps_its_backlog_until_unpaused(owners):
    nsqd = owners()
    topic = nsqd.get_topic("paused")
    topic.start()
    channel = topic.get_channel("c")
    topic.pause()
    topic.publish(bodies(7))
    assert topic.depth() == 7 and channel.depth() == 0
    topic.unpause()
    wait_until(lambda: channel.depth() == 7, what="the pump after unpause")
    assert topic.depth() == 0
    # Fan-out is inline again once the backlog is empty.
    topic.publish([b"inline"])
    assert channel.depth() == 8


def test_backlog_waits_for_start(owners):
    nsqd = owners()
    topic = nsqd.get_topic("unstarted")  # the broker is not started: neither is the topic
    assert pump_threads(["unstarted"]) == []
    topic.pause()
    channel = topic.get_channel("c")
    topic.publish(bodies(3))
    topic.unpause()
    assert channel.depth() == 0 and topic.depth() == 3  # no pump yet
    topic.start()
    wait_until(lambda: channel.depth() == 3, what="the pump after start")
    topic.start()  # once only
    assert len(pump_threads(["unstarted"])) == 1


def test_close_before_start_and_start_after_close(owners):
    nsqd = owners()
    topic = nsqd.get_topic("never")
    topic.close()
    topic.start()
    assert pump_threads(["never"]) == []
    with pytest.raises(TopicError, match="exiting"):
        topic.publish([b"x"])


def _through_a_new_channel(nsqd, topic, n):
    """The topic's backlog of ``n``, handed by its pump to a new channel ``c`` and taken from it."""
    channel = topic.get_channel("c")
    topic.start()
    wait_until(lambda: channel.depth() == n, what="the pump")
    return DrivenSubscriber(nsqd, channel).take_all(n)


def test_memory_overflow_goes_to_the_disk_queue(owners, tmp_path):
    nsqd = owners(mem_queue_size=3)
    topic = nsqd.get_topic("overflow")
    topic.publish(bodies(10))
    depth, backend_depth = topic.snapshot()[:2]
    assert (depth, backend_depth) == (10, 7)
    assert os.path.exists(tmp_path / "data" / "overflow.diskqueue.000000.dat")
    got = _through_a_new_channel(nsqd, topic, 10)
    assert sorted(m.body for m in got) == sorted(bodies(10))
    assert topic.snapshot()[:2] == (0, 0)


def test_graceful_close_flushes_the_memory_backlog_and_reload_finds_it(owners, tmp_path):
    nsqd = owners()
    topic = nsqd.get_topic("flush")
    topic.publish(bodies(12))
    assert topic.snapshot()[:2] == (12, 0)  # all in memory
    nsqd.stop()
    again = owners()
    topic = again.get_topic("flush")
    assert topic.snapshot()[:2] == (12, 12)
    channel = topic.get_channel("c")
    topic.start()
    got = DrivenSubscriber(again, channel).take_all(12)
    assert [m.body for m in got] == bodies(12)


def test_backlog_keeps_ids_timestamps_and_deferral_in_memory_and_across_a_flush(owners):
    """The memory backlog stores records, not Messages: what comes out is what went in."""
    nsqd = owners()
    topic = nsqd.get_topic("records")
    topic.publish(bodies(3))
    topic.publish([b"later"], defer_ns=3600 * 10**9)  # deferred: stays a Message in the backlog
    topic.publish([b"x" * 5000])
    assert topic.snapshot()[:2] == (5, 0)
    queued = topic._queued_messages_locked()  # (a read-only look; nothing else runs on this topic)
    assert [m.body for m in queued] == bodies(3) + [b"later", b"x" * 5000]
    assert [m.deferred_ns for m in queued] == [0, 0, 0, 3600 * 10**9, 0]
    assert all(len(m.id) == 16 and m.attempts == 0 and m.timestamp > 0 for m in queued)
    immediate = [(m.id, m.body, m.timestamp) for m in queued if not m.deferred_ns]
    channel = topic.get_channel("c")
    topic.start()
    wait_until(lambda: channel.depth() == 4, what="the pump")
    got = DrivenSubscriber(nsqd, channel).take_all(4)
    assert [(m.id, m.body, m.timestamp) for m in got] == immediate
    assert channel.snapshot().deferred_count == 1

    topic = nsqd.get_topic("records-flush")
    topic.publish([b"a"], defer_ns=3600 * 10**9)
    topic.publish([b"b"])
    before = {m.body: (m.id, m.timestamp) for m in topic._queued_messages_locked()}
    nsqd.stop()
    again = owners()
    topic = again.get_topic("records-flush")
    channel = topic.get_channel("c")
    topic.start()
    got = DrivenSubscriber(again, channel).take_all(1)
    assert [(m.body, m.id, m.timestamp) for m in got] == [(b"b",) + before[b"b"]]
    wait_until(lambda: channel.snapshot().deferred_count == 1, what="the deferred message in its channel")


def test_delete_drops_the_backlog_and_its_files(owners, tmp_path):
    nsqd = owners(mem_queue_size=1)
    topic = nsqd.get_topic("gone")
    topic.publish(bodies(4))
    assert nsqd.delete_topic("gone")
    assert not [n for n in os.listdir(tmp_path / "data") if n.startswith("gone.")]


def test_backend_write_failure_is_recorded_as_health_also_on_the_flush_path(owners, tmp_path):
    nsqd = owners(mem_queue_size=2, max_msg_size=64)
    topic = nsqd.get_topic("health")
    topic.publish([b"small"] * 2)  # memory
    assert nsqd.health() == "OK"
    with pytest.raises(TopicError, match="invalid message write size"):
        topic.publish([b"x" * 100])  # past --max-msg-size: the disk queue refuses it
    assert nsqd.health().startswith("NOK - invalid message write size")
    topic.publish([b"fits"])
    assert nsqd.health() == "OK"
    # The flush on close writes too, and records its outcome.
    nsqd.health_error = "stale"
    topic.close()
    assert nsqd.health() == "OK"


def test_durable_topic_acknowledges_only_after_fsync_and_fans_out_from_disk(owners, tmp_path):
    nsqd = owners(durable=True)
    topic = nsqd.get_topic("durable")
    channel = topic.get_channel("c")
    topic.start()
    topic.publish(bodies(30))
    consumer = DrivenSubscriber(nsqd, channel)
    got = consumer.take_all(30)
    assert sorted(m.body for m in got) == sorted(bodies(30))
    consumer.fin(got)
    wait_until(lambda: topic.snapshot()[:2] == (0, 0), what="the topic's disk queue to drain")
    nsqd.stop()
    again = owners()
    assert again.get_topic("durable").get_channel("c").depth() == 0  # FINed: not delivered again


# -- NSQD.start: topics from nsqd.dat start after the listeners, and a failed start leaks nothing ----


def _write_metadata(path, topics):
    nsqd = make_owner(path)
    for name in topics:
        nsqd.get_topic(name).get_channel("ch")
    nsqd.stop()
    assert os.path.exists(path / "nsqd.dat")


@pytest.mark.parametrize("which", ["tcp", "http"])
def test_failed_start_closes_the_loaded_topics_and_releases_the_data_path(tmp_path, which):
    names = ["leak-%s-%d" % (which, i) for i in range(3)]
    data = tmp_path / "data"
    _write_metadata(data, names)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = "127.0.0.1:%d" % busy.getsockname()[1]
    try:
        options = dict(data_path=str(data), node_id=1, tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")
        options[which + "_address"] = taken
        nsqd = NSQD(Options(**options), log_stream=LogCapture())
        with pytest.raises(OSError, match="listen"):
            nsqd.start()
    finally:
        busy.close()
    assert pump_threads(names) == []
    assert nsqd.topics() == []
    nsqd.stop()  # harmless after a failed start: nsqd.dat keeps its topics
    # The data path is unlocked and nsqd.dat intact: a second broker starts on it.
    second = NSQD(Options(data_path=str(data), node_id=1, tcp_address="127.0.0.1:0", http_address=""),
                  log_stream=LogCapture())
    second.start()
    try:
        assert sorted(t.name for t in second.topics()) == sorted(names)
        assert len(pump_threads(names)) == len(names)
    finally:
        second.stop()
    assert pump_threads(names) == []


def test_topics_created_after_start_start_at_once(make_nsqd):
    nsqd = make_nsqd()
    topic = nsqd.get_topic("late")
    assert len(pump_threads(["late"])) == 1
    topic.publish([b"x"])
    channel = topic.get_channel("c")
    wait_until(lambda: channel.depth() == 1, what="the pump")


def test_publish_one_queues_a_record_counts_it_and_spills_past_the_memory_queue(owners, tmp_path):
    """A PUB into a channel-less topic: memory up to --mem-queue-size, then the disk queue, in order."""
    nsqd = owners(mem_queue_size=3)
    topic = nsqd.get_topic("one")
    for body in bodies(5):
        topic.publish_one(bytearray(body))  # (what the PUB fast path passes: a slice of its read buffer)
    assert topic.snapshot()[:4] == (5, 2, 5, sum(len(b) for b in bodies(5)))
    assert os.path.exists(tmp_path / "data" / "one.diskqueue.000000.dat")
    got = _through_a_new_channel(nsqd, topic, 5)
    assert sorted(m.body for m in got) == sorted(bodies(5))
    assert all(type(m.body) is bytes for m in got)
    assert len({m.id for m in got}) == 5


def test_publish_one_with_a_channel_delivers_bytes_and_refuses_once_exiting(owners):
    nsqd = owners()
    topic = nsqd.get_topic("one-chan")
    channel = topic.get_channel("c")
    consumer = DrivenSubscriber(nsqd, channel)
    topic.start()
    topic.publish_one(bytearray(b"hello"))
    [msg] = consumer.take_all(1)
    assert msg.body == b"hello" and type(msg.body) is bytes
    assert topic.snapshot()[2:4] == (1, 5)
    topic.close()
    with pytest.raises(TopicError, match="exiting"):
        topic.publish_one(bytearray(b"late"))
    assert topic.snapshot()[2:4] == (1, 5)


def test_publish_one_into_a_durable_topic_goes_through_the_disk_queue(owners, tmp_path):
    nsqd = owners(durable=True)
    topic = nsqd.get_topic("one-durable")
    topic.publish_one(bytearray(b"kept"))
    assert topic.snapshot()[:3] == (1, 1, 1)  # acknowledged only once on disk: nothing in memory


def test_concurrent_creations_of_one_channel_keep_one_and_a_deletion_is_not_undone(owners):
    # A burst of SUBs to one new channel: every caller gets the same channel, and one
    # created again after a deletion is a fresh one.
    nsqd = owners()
    topic = nsqd.get_topic("burst")
    topic.start()
    n = 8
    start = threading.Barrier(n)
    got = []

    def create():
        start.wait()
        got.append(topic.get_channel("c"))

    threads = [threading.Thread(target=create, name="test-creator-%d" % i, daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == n and all(c is got[0] for c in got)
    assert topic.channels() == [got[0]]
    topic.delete_channel("c")
    assert topic.channels() == []
    again = topic.get_channel("c")  # a fresh channel, not the deleted one
    assert again is not got[0] and not again.exiting and again.depth() == 0

