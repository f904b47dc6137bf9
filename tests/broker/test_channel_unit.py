"""Channel against real clients (socketpairs) and disk queues: queueing, in flight, deferred, flush, stress."""

import threading
import time

import pytest

from nsqd_threaded.broker.channel import ChannelError, FinishError
from nsqd_threaded.broker.delivery import DIRECT_DELIVERY_BYTES, DIRECT_DELIVERY_MAX, REFILL_MAX, DirectDeliveries
from nsqd_threaded.wire.message import RECORD_HEADER, Message, held_fields

from support.core import DrivenSubscriber, HoldingSubscriber, OutputClient

pytestmark = pytest.mark.timeout(60)

SECOND = 10**9


def msgs(n, start=0, defer_ns=0):
    return [Message(b"%016x" % i, b"body-%d" % i, time.time_ns(), 0, defer_ns) for i in range(start, start + n)]


def nums(batch):
    return [int(m.id, 16) for m in batch]


def channel_of(nsqd, topic="t", name="c"):
    return nsqd.get_topic(topic).get_channel(name)


def test_put_then_take_in_order_marks_in_flight(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    channel.put_messages(msgs(5))
    consumer = DrivenSubscriber(nsqd, channel, ready=3)
    got = consumer.take()
    assert nums(got) == [0, 1, 2]  # the RDY budget
    assert all(m.attempts == 1 and m.client_id == consumer.client.id for m in got)
    assert consumer.take() == []  # not ready: in flight == RDY
    assert channel.in_flight_count() == 3 and channel.depth() == 2
    consumer.fin(got[:2])
    assert nums(consumer.take()) == [3, 4]
    snap = channel.snapshot()
    assert snap.message_count == 5 and snap.global_msg_count == 5 and snap.in_flight_count == 3


def test_a_pump_that_outlives_its_client_takes_nothing(owners):
    """A client's pump may run a moment after the client left the channel: nothing goes in flight for it."""
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = DrivenSubscriber(nsqd, channel, ready=10)
    channel.remove_client(consumer.client)
    channel.put_messages(msgs(2))
    assert consumer.take() == []
    assert channel.in_flight_count() == 0 and channel.depth() == 2
    other = DrivenSubscriber(nsqd, channel, ready=10)
    assert nums(other.take()) == [0, 1]


def test_memory_overflow_goes_to_the_disk_queue_in_order(owners):
    nsqd = owners(mem_queue_size=4)
    channel = channel_of(nsqd)
    channel.put_messages(msgs(10))
    snap = channel.snapshot()
    assert (snap.memory_depth + snap.backend_depth, snap.backend_depth) == (10, 6)
    got = DrivenSubscriber(nsqd, channel).take_all(10)
    assert nums(got) == list(range(10))
    assert channel.snapshot().global_msg_count == 4  # only the memory ones


def test_in_flight_timeout_requeues_and_redelivers(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    channel.put_messages(msgs(3))
    consumer = DrivenSubscriber(nsqd, channel)
    first = consumer.take()
    now = time.time_ns()
    assert channel.process_in_flight(now) is False  # not yet expired (60 s msg timeout)
    consumer.fin(first[1:2])
    assert channel.process_in_flight(now + 3600 * SECOND) is True
    assert channel.snapshot().timeout_count == 2 and channel.in_flight_count() == 0
    again = consumer.take()
    assert nums(again) == [0, 2]
    assert [m.attempts for m in again] == [2, 2]
    channel.finish_many(consumer.client, [first[0].id])  # the redelivered one is in flight


def two_consumers_one_message_each(nsqd):
    """A channel and two consumers, each with one message in flight: ``channel, (a, [m]), (b, [m])``."""
    channel = channel_of(nsqd)
    channel.put_messages(msgs(2))
    a, b = DrivenSubscriber(nsqd, channel, ready=1), DrivenSubscriber(nsqd, channel, ready=1)
    return channel, (a, a.take()), (b, b.take())


def test_fin_of_unknown_or_foreign_ids_fails(owners):
    channel, (a, ma), (b, mb) = two_consumers_one_message_each(owners())
    with pytest.raises(FinishError) as refused:
        channel.finish_many(a.client, [mb[0].id, b"%016x" % 99, ma[0].id])
    assert refused.value.failures == [(mb[0].id, "client does not own message"), (b"%016x" % 99, "ID not in flight")]
    assert channel.in_flight_count() == 1


def test_requeue_zero_goes_to_the_tail_and_delayed_to_the_deferred_index(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    channel.put_messages(msgs(3))
    consumer = DrivenSubscriber(nsqd, channel, ready=1)
    m0 = consumer.take()[0]
    channel.requeue(consumer.client, m0.id, 0)
    assert nums(consumer.take()) == [1]
    m1_id = b"%016x" % 1
    channel.requeue(consumer.client, m1_id, 5 * SECOND)
    assert channel.deferred_count() == 1
    assert nums(consumer.take()) == [2]
    consumer.fin([Message(b"%016x" % 2, b"", 0)])
    assert nums(consumer.take()) == [0]  # REQ 0 went to the tail
    assert channel.snapshot().requeue_count == 2


def test_deferred_messages_are_released_in_due_order(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    now = time.time_ns()
    for i, delay in [(0, 30), (1, 10), (2, 20), (3, 10)]:
        channel.put_messages([Message(b"%016x" % i, b"d", now, 0, delay * SECOND)])
    channel.put_messages(msgs(1, start=9))  # immediate
    consumer = DrivenSubscriber(nsqd, channel)
    assert nums(consumer.take()) == [9]
    assert channel.deferred_count() == 4
    assert channel.process_deferred(now) is False
    assert channel.process_deferred(now + 15 * SECOND) is True
    assert nums(consumer.take()) == [1, 3]
    assert channel.process_deferred(now + 3600 * SECOND) is True
    assert nums(consumer.take()) == [2, 0]
    assert channel.deferred_count() == 0


def test_graceful_close_flushes_queued_in_flight_and_deferred_and_reload_finds_them(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    channel.put_messages(msgs(4))
    channel.put_messages(msgs(2, start=10, defer_ns=3600 * SECOND))
    consumer = DrivenSubscriber(nsqd, channel, ready=2)
    in_flight = consumer.take()
    assert nums(in_flight) == [0, 1]
    nsqd.stop()

    again = owners()
    channel = channel_of(again)
    assert channel.depth() == 6  # all on disk now
    consumer = DrivenSubscriber(again, channel)
    got = consumer.take()
    # Queued first, then in flight (attempts kept), then the deferred ones go back to the deferred index.
    assert nums(got) == [2, 3, 0, 1]
    assert [m.attempts for m in got] == [1, 1, 2, 2]
    assert channel.deferred_count() == 2 and channel.depth() == 0
    assert channel.process_deferred(time.time_ns()) is False  # the delay survived the restart


def test_delete_drops_everything(owners, tmp_path):
    nsqd = owners(mem_queue_size=1)
    topic = nsqd.get_topic("t")
    channel = topic.get_channel("c")
    channel.put_messages(msgs(3))
    topic.delete_channel("c")
    assert not [n for n in (tmp_path / "data").iterdir() if n.name.startswith("t:c.")]


def test_empty_drops_queued_in_flight_and_deferred(owners):
    nsqd = owners(mem_queue_size=1)
    channel = channel_of(nsqd)
    channel.put_messages(msgs(3))
    channel.put_messages(msgs(1, start=5, defer_ns=SECOND))
    consumer = DrivenSubscriber(nsqd, channel, ready=1)
    consumer.take()
    channel.empty()
    snap = channel.snapshot()
    assert (snap.memory_depth + snap.backend_depth, snap.in_flight_count, snap.deferred_count) == (0, 0, 0)
    assert consumer.client.in_flight_count == 0


def test_durable_channel_keeps_records_until_fin(owners):
    nsqd = owners(durable=True)
    channel = channel_of(nsqd)
    channel.put_messages(msgs(6))
    assert channel.snapshot().backend_depth == 6  # durable: no memory queue for new messages
    consumer = DrivenSubscriber(nsqd, channel)
    got = consumer.take()
    assert nums(got) == list(range(6))
    consumer.fin(got[:2])
    channel.requeue(consumer.client, got[2].id, 0)  # its record is still on disk
    nsqd.stop()  # a graceful close rewrites the unfinished ones at the tail

    again = owners(durable=True)
    channel = channel_of(again)
    got = DrivenSubscriber(again, channel).take()
    assert sorted(nums(got)) == [2, 3, 4, 5]


@pytest.mark.parametrize(
    "options",
    [dict(mem_queue_size=50), dict(mem_queue_size=0), dict(durable=True)],
    ids=["overflow", "disk", "durable"],
)
def test_concurrent_put_take_fin_loses_and_duplicates_nothing(owners, options):
    """Publishers (through the topic) and consumers that FIN most messages and
    requeue some, on one channel at once: every message is finished exactly once."""
    nsqd = owners(**options)
    topic = nsqd.get_topic("stress")
    channel = topic.get_channel("c")
    topic.start()
    publishers, per_publisher, batch = 3, 10000, 25
    total = publishers * per_publisher
    finished = []
    finished_lock = threading.Lock()  # guards finished
    errors = []
    done = threading.Event()

    def publish(p):
        try:
            for start in range(0, per_publisher, batch):
                topic.publish([b"%d-%d" % (p, i) for i in range(start, start + batch)])
        except Exception as e:  # reported by the test thread
            errors.append(e)

    def consume(ready):
        consumer = DrivenSubscriber(nsqd, channel, ready=ready)
        try:
            deadline = time.monotonic() + 40
            while not done.is_set():
                if time.monotonic() > deadline:
                    errors.append(AssertionError("consumer deadline"))
                    return
                got = consumer.take(ready)
                if not got:
                    done.wait(0.001)  # (returns at once when another consumer finished the run)
                    continue
                fin = []
                for m in got:
                    if m.attempts == 1 and m.body.endswith(b"7"):
                        channel.requeue(consumer.client, m.id, 0)  # delivered again later
                    else:
                        fin.append(m)
                consumer.fin(fin)
                with finished_lock:
                    finished.extend(m.body for m in fin)
                    if len(finished) >= total:
                        done.set()
        except Exception as e:
            errors.append(e)
            done.set()
        finally:
            consumer.close()

    threads = [threading.Thread(target=consume, args=(r,), name="test-consumer-%d" % r, daemon=True)
               for r in (1, 7, 64)]
    threads += [threading.Thread(target=publish, args=(p,), name="test-publisher-%d" % p, daemon=True)
                for p in range(publishers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
        assert not t.is_alive(), "%s did not finish" % t.name
    assert not errors, errors
    assert len(finished) == total
    assert set(finished) == {b"%d-%d" % (p, i) for p in range(publishers) for i in range(per_publisher)}
    snap = channel.snapshot()
    assert (snap.memory_depth + snap.backend_depth, snap.in_flight_count, snap.message_count) == (0, 0, total)
    assert snap.requeue_count == total // 10


# -- direct delivery: every branch of Channel._deliver_to_waiting_locked ---------


def put_direct(channel, batch):
    """A publisher's put: returns the held deliveries once released, as (client, ids)."""
    deliveries = DirectDeliveries()
    try:
        channel.put_messages(batch, True, False, deliveries)
        assert all(client.held for client, _ in deliveries)  # reserved until released
    finally:
        if deliveries:
            deliveries.release()
    return [(client, nums(batch)) for client, batch in deliveries]


def test_direct_delivery_to_a_waiting_consumer_keeps_it_waiting(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel)
    consumer.wait()
    assert put_direct(channel, msgs(3)) == [(consumer.client, [0, 1, 2])]
    assert nums(consumer.client.delivered[0]) == [0, 1, 2] and consumer.client.wakes == 0
    assert channel.in_flight_count() == 3 and channel.depth() == 0
    # Still waiting: the next put is delivered to it too, without a wake-up.
    assert put_direct(channel, msgs(1, start=3)) == [(consumer.client, [3])]
    assert consumer.client.wakes == 0


def test_a_lone_message_put_while_a_consumer_waits_is_delivered_counted_and_blocks_it_at_its_rdy(owners):
    """One message put while a consumer waits and nothing is queued (a round trip's): delivered by
    the publisher's thread, marked in flight to the consumer and counted, the consumer blocked at its RDY."""
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel, ready=1)
    consumer.wait()
    assert put_direct(channel, msgs(1)) == [(consumer.client, [0])]
    (msg,) = consumer.client.delivered[0]
    assert msg.attempts == 1 and msg.client_id == consumer.client.id
    assert channel.in_flight_count() == 1 and channel.depth() == 0
    assert channel.message_count == 1 and channel.global_msg_count == 1
    assert consumer.client.in_flight_count == 1 and consumer.client.message_count == 1
    assert consumer.client.blocked and consumer.client.wakes == 0
    # Blocked: not waiting, so the next one is queued, and its FIN wakes the pump to take it.
    assert put_direct(channel, msgs(1, start=1)) == [] and channel.depth() == 1
    assert consumer.client.wakes == 0
    consumer.fin([msg])
    assert consumer.client.wakes == 1 and nums(consumer.take()) == [1]


def test_a_lone_message_whose_id_is_in_flight_is_delivered_again_and_counted_once(owners):
    """nsqd sends a duplicate ID all the same and keeps the first in flight: the lone-message path too."""
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel, ready=2)
    consumer.wait()
    assert put_direct(channel, msgs(1)) == [(consumer.client, [0])]
    assert put_direct(channel, msgs(1)) == [(consumer.client, [0])]  # still waiting: a slot is free
    assert channel.in_flight_count() == 1 and consumer.client.in_flight_count == 1
    assert channel.message_count == 2 and consumer.client.message_count == 2
    assert not consumer.client.blocked and consumer.client.wakes == 0


def test_a_lone_message_without_a_memory_queue_goes_through_the_backend(owners):
    """--mem-queue-size 0 (not ephemeral): every message is written to disk first, as nsqd writes it,
    a waiting consumer's included, and read back for it."""
    nsqd = owners(mem_queue_size=0)
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel)
    consumer.wait()
    assert put_direct(channel, msgs(1)) == [(consumer.client, [0])]
    assert channel._backend.write_pos > 0  # (white-box: the disk queue took the write)
    assert channel.depth() == 0 and channel.in_flight_count() == 1


def test_a_lone_message_for_a_sampling_consumer_is_delivered_directly_too(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel)
    consumer.client.sample_rate = 100  # (every message kept: <= 100)
    consumer.wait()
    assert put_direct(channel, msgs(1)) == [(consumer.client, [0])]  # delivered all the same
    assert channel.global_msg_count == 1 and channel.in_flight_count() == 1


def test_a_consumer_whose_output_is_busy_is_woken_instead(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel, output_free=False)
    consumer.wait()
    assert put_direct(channel, msgs(2)) == []
    assert consumer.client.wakes == 1 and channel.depth() == 2
    assert put_direct(channel, msgs(1, start=2)) == []  # no longer waiting: not woken twice
    assert consumer.client.wakes == 1
    assert nums(consumer.take()) == [0, 1, 2]


def test_a_paused_channel_wakes_its_waiting_consumers(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel)
    consumer.wait()
    channel.pause()
    consumer.client.wakes = 0  # (pause() wakes every consumer)
    assert put_direct(channel, msgs(2)) == []
    assert consumer.client.wakes == 1 and channel.depth() == 2


def test_waiting_consumers_are_served_in_turn_and_the_rest_left_waiting(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    a, b = HoldingSubscriber(nsqd, channel), HoldingSubscriber(nsqd, channel)
    a.wait()
    b.wait()
    # One message: a takes it and waits again behind b; nothing left for b (the loop stops).
    assert put_direct(channel, msgs(1)) == [(a.client, [0])]
    assert put_direct(channel, msgs(1, start=1)) == [(b.client, [1])]
    assert put_direct(channel, msgs(1, start=2)) == [(a.client, [2])]
    assert a.client.wakes == b.client.wakes == 0


def test_a_consumer_left_blocked_is_neither_waiting_nor_woken(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    a = HoldingSubscriber(nsqd, channel, ready=2)
    b = HoldingSubscriber(nsqd, channel)
    a.wait()
    b.wait()
    # a's RDY is used up: its FINs wake it later; b takes the rest.
    assert put_direct(channel, msgs(3)) == [(a.client, [0, 1]), (b.client, [2])]
    assert a.client.blocked and a.client.wakes == 0
    assert put_direct(channel, msgs(1, start=3)) == [(b.client, [3])]  # a is not waiting


def test_a_waiting_consumer_without_a_free_slot_gets_its_output_back_with_nothing(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel)
    consumer.wait()
    consumer.client.set_ready(0)  # RDY 0 while its pump waited (which wakes it)
    consumer.client.wakes = 0
    assert put_direct(channel, msgs(1)) == [(consumer.client, [])]
    assert consumer.client.delivered == [[]] and consumer.client.blocked
    assert consumer.client.wakes == 0 and channel.depth() == 1


def test_more_than_one_delivery_worth_wakes_the_consumer_for_the_rest(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel, ready=2)
    consumer.wait()
    # Two copies of one ID fill the budget but count once in flight: a slot is
    # still free and a message is left, so the pump is woken to take it.
    dup = msgs(1) + msgs(1) + msgs(1, start=1)
    assert put_direct(channel, dup) == [(consumer.client, [0, 0])]
    assert not consumer.client.blocked and consumer.client.wakes == 1
    assert nums(consumer.take()) == [1]


def test_larger_puts_and_the_topic_pump_wake_instead_of_delivering(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    consumer = HoldingSubscriber(nsqd, channel)
    consumer.wait()
    assert put_direct(channel, msgs(DIRECT_DELIVERY_MAX + 1)) == []
    assert consumer.client.wakes == 1
    assert len(consumer.take()) == DIRECT_DELIVERY_MAX + 1
    consumer.wait()
    channel.put_messages(msgs(1, start=100))  # no deliveries: the topic pump's fan-out
    assert consumer.client.wakes == 2 and consumer.client.delivered == []


def test_a_publish_of_an_mpub_batch_is_delivered_to_every_channels_waiting_consumer(owners):
    nsqd = owners()
    topic = nsqd.get_topic("fan")
    consumers = [HoldingSubscriber(nsqd, topic.get_channel("c%d" % n)) for n in range(3)]
    for consumer in consumers:
        consumer.wait()
    topic.publish([b"m%03d" % i for i in range(200)])
    for consumer in consumers:
        assert [[m.body for m in batch] for batch in consumer.client.delivered] == [
            [b"m%03d" % i for i in range(200)]]
        assert consumer.client.wakes == 0 and consumer.channel.in_flight_count() == 200
    # Each channel has its own messages (attempts, in-flight fields).
    [a, b, c] = [consumer.client.delivered[0][0] for consumer in consumers]
    assert a is not b and b is not c and a.id == b.id == c.id


def test_a_publish_of_more_bytes_than_a_direct_delivery_takes_wakes_the_pumps(owners):
    nsqd = owners()
    topic = nsqd.get_topic("large")
    consumer = HoldingSubscriber(nsqd, topic.get_channel("c"))
    consumer.wait()
    half = b"x" * (DIRECT_DELIVERY_BYTES // 2)
    topic.publish([half, half + b"x"])
    assert consumer.client.delivered == [] and consumer.client.wakes == 1
    consumer.fin(consumer.take())  # (what its pump would do)
    consumer.wait()
    topic.publish([half + half])  # one message: delivered whatever its size
    assert [len(batch) for batch in consumer.client.delivered] == [1] and consumer.client.wakes == 1


def test_requeue_and_touch_raise_channel_error_with_nsqd_reasons(owners):
    channel, (a, ma), (b, mb) = two_consumers_one_message_each(owners())
    for call in (lambda: channel.requeue(a.client, mb[0].id, 0), lambda: channel.touch(a.client, mb[0].id)):
        with pytest.raises(ChannelError, match="^client does not own message$"):
            call()
    for call in (lambda: channel.requeue(a.client, b"%016x" % 9, 0), lambda: channel.touch(a.client, b"%016x" % 9)):
        with pytest.raises(ChannelError, match="^ID not in flight$"):
            call()
    channel.requeue(a.client, ma[0].id, SECOND)
    a.client.in_flight_count = 0
    channel.touch(b.client, mb[0].id)
    assert channel.deferred_count() == 1 and channel.in_flight_count() == 1


class SleepingPumpClient(OutputClient):
    """An OutputClient whose pump sleeps with nothing in hand (``pump_idle``), as a blocked consumer's does."""

    def pump_idle(self):
        return True


def sleeping_pump_consumer(nsqd, channel, ready, output_free=True):
    consumer = HoldingSubscriber(nsqd, channel, ready=ready, output_free=output_free)
    channel.remove_client(consumer.client)
    consumer.client = SleepingPumpClient(consumer.client.id, ("127.0.0.1", 0), nsqd.options)
    consumer.client.set_ready(ready)
    consumer.client.output_free = output_free
    channel.add_client(consumer.client)
    return consumer


def test_a_fin_refills_a_blocked_consumer_from_its_own_thread(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    channel.put_messages(msgs(6))
    consumer = sleeping_pump_consumer(nsqd, channel, ready=3)
    got = consumer.take()
    assert nums(got) == [0, 1, 2] and consumer.client.blocked
    consumer.client.wakes = 0
    channel.finish_many(consumer.client, [got[0].id])  # one slot free, messages waiting
    assert [nums(batch) for batch in consumer.client.delivered] == [[3]]
    assert consumer.client.wakes == 0 and not consumer.client.held and consumer.client.blocked
    channel.finish_many(consumer.client, [got[1].id, got[2].id])  # a run of FINs: one delivery of two
    assert [nums(batch) for batch in consumer.client.delivered] == [[3], [4, 5]]
    assert consumer.client.wakes == 0 and channel.in_flight_count() == 3


def test_a_fin_wakes_the_pump_when_the_output_is_busy_or_more_remains(owners):
    nsqd = owners()
    channel = channel_of(nsqd)
    channel.put_messages(msgs(3))
    busy = sleeping_pump_consumer(nsqd, channel, ready=1, output_free=False)
    first = busy.take()
    busy.client.wakes = 0
    channel.finish_many(busy.client, [first[0].id])
    assert busy.client.delivered == [] and busy.client.wakes == 1  # the pump takes it

    channel = channel_of(nsqd, name="more")
    channel.put_messages(msgs(3 * REFILL_MAX))
    consumer = sleeping_pump_consumer(nsqd, channel, ready=REFILL_MAX + 1)
    got = consumer.take()
    consumer.client.wakes = 0
    channel.finish_many(consumer.client, [m.id for m in got])  # every slot free: more than one refill's worth
    assert len(consumer.client.delivered[0]) == REFILL_MAX and consumer.client.wakes == 1


def test_held_fields_reads_a_record_and_a_message_alike():
    msg = Message(b"%016x" % 7, b"body", 123456789, 3)
    record = RECORD_HEADER.pack(msg.timestamp, msg.attempts, msg.id) + msg.body
    assert held_fields(record) == held_fields(msg) == (msg.id, b"body", 123456789, 3)


def test_a_redrive_holds_its_messages_in_flight_and_gives_back_what_it_did_not_publish_in_order(owners):
    nsqd = owners(mem_queue_size=4)  # (four in memory, the rest read from disk)
    channel = channel_of(nsqd)
    channel.put_messages(msgs(10))
    taken = channel.take_for_redrive(6)
    assert nums(taken) == list(range(6)) and all(m.attempts == 0 for m in taken)  # (not a delivery)
    assert channel.in_flight_count() == 6 and channel.depth() == 4
    # A consumer meanwhile gets what the redrive did not take.
    consumer = DrivenSubscriber(nsqd, channel, ready=1)
    got = consumer.take()
    assert nums(got) == [6]
    channel.finish_redrive(taken[:2])
    channel.return_redrive(taken[2:])
    assert channel.in_flight_count() == 1 and channel.snapshot().redrive_count == 2
    consumer.fin(got)
    assert nums(DrivenSubscriber(nsqd, channel, ready=10).take_all(7)) == [2, 3, 4, 5, 7, 8, 9]


def test_a_closing_channel_keeps_what_a_redrive_holds(owners, tmp_path):
    nsqd = owners(mem_queue_size=4)
    channel = channel_of(nsqd)
    channel.put_messages(msgs(3))
    taken = channel.take_for_redrive(3)
    channel.close()
    assert channel.take_for_redrive(1) is None
    channel.return_redrive(taken)  # (the flush has them already)
    nsqd.stop()
    again = owners()
    assert nums(DrivenSubscriber(again, channel_of(again), ready=10).take_all(3)) == [0, 1, 2]
