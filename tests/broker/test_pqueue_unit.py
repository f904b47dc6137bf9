"""TimedIndex (in-flight and deferred index): add/remove/reschedule/pop-due/drain semantics."""

import gc
import random

import pytest

from nsqd_threaded.broker.pqueue import TimedIndex
from nsqd_threaded.wire.message import Message

pytestmark = pytest.mark.timeout(30)


def msg(i):
    return Message(b"%016x" % i, b"body-%d" % i, 0, 0)


def first_deadline(index):
    """The earliest deadline in the index (None when empty), read through its public values."""
    deadlines = [m.expiry_ns for m in index.values()]
    return min(deadlines) if deadlines else None


def ids(msgs):
    return [int(m.id, 16) for m in msgs]


def test_add_indexes_by_id_and_sets_the_deadline():
    index = TimedIndex()
    m = msg(1)
    assert index.add(m, 500) is True
    assert len(index) == 1 and m.id in index and index.get(m.id) is m
    assert m.expiry_ns == 500
    assert first_deadline(index) == 500


def test_add_of_an_id_already_indexed_keeps_the_first():
    index = TimedIndex()
    first, again = msg(1), msg(1)
    assert index.add(first, 100)
    assert index.add(again, 50) is False
    assert index.get(first.id) is first and len(index) == 1
    assert first_deadline(index) == 100
    assert again.expiry_ns == 0  # untouched


def test_add_many_skips_duplicates_and_returns_those_added():
    index = TimedIndex()
    index.add(msg(2), 10)
    batch = [msg(1), msg(2), msg(3), msg(3)]
    added = index.add_many(batch, 70)
    assert added == [batch[0], batch[2]]
    assert len(index) == 3
    assert ids(index.pop_due(100)) == [2, 1, 3]


def test_remove_returns_the_message_or_none():
    index = TimedIndex()
    a, b = msg(1), msg(2)
    index.add(a, 10)
    index.add(b, 20)
    assert index.remove(a.id) is a
    assert index.remove(a.id) is None
    assert a.id not in index and len(index) == 1
    assert first_deadline(index) == 20
    assert index.pop_due(100) == [b]


def owned(i, owner):
    m = msg(i)
    m.client_id = owner
    return m


def test_remove_owned_takes_a_run_of_the_owners_ids():
    index = TimedIndex()
    batch = [owned(i, 7) for i in range(5)]
    index.add_many(batch, 10)
    removed, refused = index.remove_owned([m.id for m in batch[1:4]], 7)
    assert removed == batch[1:4] and refused == []
    assert sorted(ids(index.values())) == [0, 4]


def test_remove_owned_refuses_each_other_id_in_order_and_leaves_it_in_place():
    index = TimedIndex()
    mine, theirs = [owned(1, 7), owned(2, 7)], owned(3, 8)
    index.add_many(mine + [theirs], 10)
    run = [mine[0].id, theirs.id, b"%016x" % 9, mine[0].id, mine[1].id, theirs.id]
    removed, refused = index.remove_owned(run, 7)
    assert removed == mine
    # the repeated ID: gone by then, so not in flight (as answering each FIN in turn)
    assert refused == [(theirs.id, theirs), (b"%016x" % 9, None), (mine[0].id, None), (theirs.id, theirs)]
    assert index.get(theirs.id) is theirs and len(index) == 1
    assert ids(index.pop_due(10)) == [3]  # still indexed at its deadline


def test_pop_due_takes_deadlines_up_to_and_including_now_earliest_first():
    index = TimedIndex()
    for i, deadline in [(1, 30), (2, 10), (3, 20), (4, 40)]:
        index.add(msg(i), deadline)
    assert index.pop_due(9) == []
    assert ids(index.pop_due(20)) == [2, 3]  # 20 itself is due
    assert len(index) == 2 and first_deadline(index) == 30
    assert ids(index.pop_due(10**18)) == [1, 4]
    assert len(index) == 0 and first_deadline(index) is None
    assert index.pop_due(10**18) == []


def test_equal_deadlines_pop_in_id_order():
    index = TimedIndex()
    for i in (5, 3, 9, 1):
        index.add(msg(i), 100)
    assert ids(index.pop_due(100)) == [1, 3, 5, 9]


def test_reschedule_moves_a_message():
    index = TimedIndex()
    a, b = msg(1), msg(2)
    index.add(a, 10)
    index.add(b, 20)
    index.reschedule(a, 30)
    assert a.expiry_ns == 30
    assert first_deadline(index) == 20
    assert index.pop_due(25) == [b]
    assert index.pop_due(30) == [a]


def test_reschedule_earlier():
    index = TimedIndex()
    a, b = msg(1), msg(2)
    index.add(a, 50)
    index.add(b, 20)
    index.reschedule(a, 5)
    assert ids(index.pop_due(60)) == [1, 2]


def test_drain_returns_everything_and_empties():
    index = TimedIndex()
    batch = [msg(i) for i in range(5)]
    for i, m in enumerate(batch):
        index.add(m, 100 - i)
    out = index.drain()
    assert sorted(ids(out)) == [0, 1, 2, 3, 4]
    assert len(index) == 0 and first_deadline(index) is None
    assert index.pop_due(10**18) == [] and index.values() == []
    assert index.add(batch[0], 1)  # usable again


def test_values_is_a_snapshot():
    index = TimedIndex()
    index.add(msg(1), 1)
    values = index.values()
    index.remove(msg(1).id)
    assert ids(values) == [1] and len(index) == 0


def test_removed_and_rescheduled_messages_never_come_due_twice_across_rebuilds():
    index = TimedIndex()
    msgs = [msg(i) for i in range(5000)]
    for k in range(0, 5000, 100):  # batches, most removed again (FIN), enough to force rebuilds
        index.add_many(msgs[k : k + 100], 1000 + k)
        for m in msgs[k : k + 90]:
            assert index.remove(m.id) is m
    kept = [m for k in range(0, 5000, 100) for m in msgs[k + 90 : k + 100]]
    index.reschedule(kept[0], 10**9)  # moved later: its old entry is stale
    assert len(index) == len(kept)
    due = index.pop_due(10**6)
    assert due == sorted(kept[1:], key=lambda m: (m.expiry_ns, m.id))
    assert index.pop_due(10**9) == [kept[0]]
    assert len(index) == 0 and index.pop_due(10**18) == []


def test_earliest_lists_live_messages_in_deadline_order_and_leaves_them():
    index = TimedIndex()
    index.add_many([msg(5), msg(4)], 300)  # one batch, one entry: ID order within it
    index.add(msg(1), 100)
    index.add(msg(2), 200)
    index.add(msg(3), 50)
    index.remove(msg(3).id)  # its entry goes stale
    index.reschedule(index.get(msg(1).id), 400)  # its old entry at 100 goes stale
    assert ids(index.earliest(10)) == [2, 4, 5, 1]
    assert ids(index.earliest(2)) == [2, 4]
    assert index.earliest(0) == []
    assert len(index) == 4 and ids(index.pop_due(1000)) == [2, 4, 5, 1]


def test_deadlines_in_order_and_out_of_order_come_due_merged_in_deadline_order():
    """In-order adds go to the tail (a deque), earlier ones to the sorted list: read merged."""
    rng = random.Random(7)
    index = TimedIndex()
    deadlines = {}
    clock = 0
    for i in range(2000):
        clock += rng.randrange(3)
        # mostly rising deadlines (one message timeout), some shorter ones behind them
        deadline = clock + (1000 if rng.random() < 0.8 else rng.randrange(1000))
        index.add(msg(i), deadline)
        deadlines[i] = deadline
    for i in range(0, 2000, 7):  # FINs: stale entries in both sequences
        assert index.remove(msg(i).id) is not None
        del deadlines[i]
    expected = sorted(deadlines, key=lambda i: (deadlines[i], i))
    assert ids(index.earliest(50)) == expected[:50]
    popped = []
    for now in range(0, 6000, 250):  # a scanner's passes
        due = index.pop_due(now)
        assert all(m.expiry_ns <= now for m in due)
        popped += due
    assert ids(popped) == expected
    assert len(index) == 0 and index.pop_due(10**18) == []


class TracedMessage(Message):
    __slots__ = ("__weakref__",)  # (so that the test sees which finished messages are still referenced)


@pytest.mark.parametrize("live", [100, 3000])
def test_finished_messages_are_let_go_as_thousands_at_rdy_1_finish_in_order(live):
    """Consumers at RDY 1 (an entry per delivery), finished in about the order they came, with
    some TOUCHed (a later deadline) and some put back under an earlier deadline: the index keeps
    only a bounded number of finished messages alive, and what comes due is exactly what is live."""
    import weakref

    rng = random.Random(live)
    index = TimedIndex()
    in_flight = []
    finished = []
    now = 0
    for i in range(20 * live):
        now += 1
        m = TracedMessage(b"%016x" % i, b"", 0, 0)
        index.add(m, now + 10**6)
        in_flight.append(m)
        if len(in_flight) > live:
            victim = in_flight.pop(0 if rng.random() < 0.9 else rng.randrange(len(in_flight)))
            assert index.remove(victim.id) is victim
            finished.append(weakref.ref(victim))
        if rng.random() < 0.01:
            index.reschedule(rng.choice(in_flight), now + 2 * 10**6)  # TOUCH
        if rng.random() < 0.01:
            index.reschedule(rng.choice(in_flight), now + 10**5)  # earlier: to the sorted entries
    del victim
    gc.collect()  # (PyPy frees what nothing references at its next collection, not at once)
    still_referenced = sum(1 for ref in finished if ref() is not None)
    assert still_referenced <= 2 * live + 1024
    assert len(index) == live
    expected = sorted(in_flight, key=lambda m: (m.expiry_ns, m.id))
    assert index.earliest(live) == expected
    assert index.pop_due(10**12) == expected and len(index) == 0
