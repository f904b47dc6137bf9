"""A channel's delivery policy driven step by step (an unstarted broker: no scanner thread, the test
plays the scanner): what is taken out, when it leaves, a refused publish, a policy removed, a close."""

import time

import pytest

from nsqd_threaded.broker.policy import MOVING_MAX, NO_POLICY, Policy
from nsqd_threaded.wire.message import Message

from support.core import DrivenSubscriber

pytestmark = pytest.mark.timeout(60)


def msgs(n, timestamp=None):
    return [Message(b"%016x" % i, b"body-%d" % i, time.time_ns() if timestamp is None else timestamp)
            for i in range(n)]


def fail_once(consumer, n):
    """Deliver ``n`` messages and requeue each at once."""
    got = consumer.take(n)
    assert len(got) == n
    for msg in got:
        consumer.channel.requeue(consumer.client, msg.id, 0)
    return got


def test_taken_out_on_delivery_and_gone_only_after_the_publish(owners):
    nsqd = owners()
    channel = nsqd.get_topic("t").get_channel("c")
    channel.set_policy(Policy(1, "t-dlq", 0))
    channel.put_messages(msgs(3))
    consumer = DrivenSubscriber(nsqd, channel)
    fail_once(consumer, 3)
    assert consumer.take() == []  # all three are past max attempts
    policy = channel.policy
    assert len(policy.moving) == 3 and policy.dead_letter_count == 3
    dead = nsqd.get_topic("t-dlq").get_channel("d")
    assert dead.depth() == 0  # not yet published
    assert channel.depth() == 0 and channel.in_flight_count() == 0
    channel.move_dead_letters()  # the scanner's visit
    assert not policy.moving
    got = DrivenSubscriber(nsqd, dead).take_all(3)
    assert sorted(m.body for m in got) == [b"body-0", b"body-1", b"body-2"]
    assert all(m.attempts == 1 for m in got)  # new messages


def test_expired_messages_are_taken_out_in_the_middle_of_a_batch(owners):
    nsqd = owners()
    channel = nsqd.get_topic("t").get_channel("c")
    channel.set_policy(Policy(0, "", 10**9))
    old = msgs(2, timestamp=time.time_ns() - 5 * 10**9)
    fresh = [Message(b"%016x" % 9, b"fresh", time.time_ns())]
    channel.put_messages([old[0]] + fresh + [old[1]])
    got = DrivenSubscriber(nsqd, channel).take()
    assert [m.body for m in got] == [b"fresh"]
    assert channel.policy.expired_count == 2 and len(channel.policy.moving) == 2
    channel.move_dead_letters()  # no dead-letter topic: dropped
    assert not channel.policy.moving and [t.name for t in nsqd.topics()] == ["t"]


def test_a_refused_publish_keeps_them_for_the_next_visit(owners):
    nsqd = owners()
    channel = nsqd.get_topic("t").get_channel("c")
    channel.set_policy(Policy(1, "closing", 0))
    closing = nsqd.get_topic("closing")
    closing.close()  # exiting: every publish refused
    channel.put_messages(msgs(2))
    consumer = DrivenSubscriber(nsqd, channel)
    fail_once(consumer, 2)
    assert consumer.take() == []
    channel.move_dead_letters()
    channel.move_dead_letters()
    assert len(channel.policy.moving) == 2 and channel.policy.failing
    assert nsqd.log.stream.getvalue().count("failed to move 2 messages to dead-letter topic closing") == 1
    channel.set_policy(Policy(1, "open", 0))  # the messages being moved stay with the new policy
    channel.move_dead_letters()
    assert not channel.policy.moving and not channel.policy.failing
    assert nsqd.get_existing_topic("open").depth() == 2  # (no channel: its backlog keeps them)
    assert channel.policy.dead_letter_count == 2  # counted once


def test_removing_the_policy_puts_them_back(owners):
    nsqd = owners()
    channel = nsqd.get_topic("t").get_channel("c")
    channel.set_policy(Policy(1, "", 0))
    channel.put_messages(msgs(2))
    consumer = DrivenSubscriber(nsqd, channel)
    fail_once(consumer, 2)
    assert consumer.take() == []
    channel.set_policy(NO_POLICY)
    assert channel.policy is None
    got = consumer.take()
    assert sorted((m.body, m.attempts) for m in got) == [(b"body-0", 2), (b"body-1", 2)]


def test_an_own_policy_of_nothing_puts_them_back_and_is_kept(owners):
    """The channel's own "unlimited, drop, no TTL": nothing applies, as without a policy, but the choice is
    the channel's own (kept, shown) and what the last policy took out goes back to the queue."""
    nsqd = owners()
    channel = nsqd.get_topic("t").get_channel("c")
    channel.set_policy(Policy(1, "", 0))
    channel.put_messages(msgs(2))
    consumer = DrivenSubscriber(nsqd, channel)
    fail_once(consumer, 2)
    assert consumer.take() == []
    channel.set_policy(Policy(0, "", 0))
    assert channel.own_policy() == Policy(0, "", 0) and channel.policy.effective == Policy(0, "", 0)
    assert not channel.policy.moving
    got = consumer.take()
    assert sorted((m.body, m.attempts) for m in got) == [(b"body-0", 2), (b"body-1", 2)]


def test_a_graceful_close_keeps_the_messages_being_moved(owners):
    nsqd = owners()
    channel = nsqd.get_topic("t").get_channel("c")
    channel.set_policy(Policy(1, "t-dlq", 0))
    nsqd.persist_metadata()
    channel.put_messages(msgs(2))
    consumer = DrivenSubscriber(nsqd, channel)
    fail_once(consumer, 2)
    assert consumer.take() == [] and len(channel.policy.moving) == 2
    nsqd.stop()  # before the scanner moved them
    again = owners()
    again.load_metadata()
    channel = again.get_existing_topic("t").get_existing_channel("c")
    assert channel.own_policy() == Policy(1, "t-dlq", 0) and channel.depth() == 2
    assert DrivenSubscriber(again, channel).take() == []  # attempts kept: taken out again
    channel.move_dead_letters()
    assert again.get_existing_topic("t-dlq").depth() == 2


def test_a_backlog_of_expired_messages_moves_a_bounded_batch_at_a_time(owners):
    nsqd = owners(mem_queue_size=100)  # most of the backlog on disk
    channel = nsqd.get_topic("t").get_channel("c")
    channel.set_policy(Policy(0, "t-dlq", 10**9))
    dead = nsqd.get_topic("t-dlq").get_channel("d")
    n = MOVING_MAX * 2 + 10
    channel.put_messages(msgs(n, timestamp=time.time_ns() - 5 * 10**9))
    consumer = DrivenSubscriber(nsqd, channel, ready=100)  # (the bound is checked between batches of its RDY)
    assert consumer.take() == []  # stopped screening at the bound: the rest is still queued
    assert MOVING_MAX <= len(channel.policy.moving) < n and channel.depth() == n - len(channel.policy.moving)
    visits = 0
    while channel.depth() or channel.policy.moving:
        channel.move_dead_letters()
        assert len(channel.policy.moving) == 0
        consumer.take()
        visits += 1
    assert visits == 3 and dead.depth() == n and channel.policy.expired_count == n
