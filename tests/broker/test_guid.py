"""Message IDs: nsqd's layout, order and retry rules, with a controlled clock."""

from nsqd_threaded.broker.guid import TWEPOCH, GUIDFactory


class Clock:
    def __init__(self, ticks):
        self.ticks = list(ticks)  # successive values in 2**20 ns units

    def __call__(self):
        t = self.ticks[0] if len(self.ticks) == 1 else self.ticks.pop(0)
        return t << 20


def test_layout_matches_nsqd():
    ts = TWEPOCH + 123456
    f = GUIDFactory(617, Clock([ts]))
    ids = f.new_ids(3)
    assert all(len(i) == 16 for i in ids)
    values = [int(i, 16) for i in ids]
    assert [v & 0xFFF for v in values] == [0, 1, 2]
    assert all((v >> 12) & 0x3FF == 617 for v in values)
    assert all(v >> 22 == 123456 for v in values)


def test_spec_example_digits():
    # internals.md: node 617 (0x269) shows as "269" or "669" in hex digits 4-6 from the right.
    f = GUIDFactory(617, Clock([TWEPOCH + 1]))
    assert f.new_id()[-6:] in (b"269000", b"669000")


def test_sequence_exhaustion_waits_for_the_next_tick():
    ts = TWEPOCH + 10
    f = GUIDFactory(1, Clock([ts, ts, ts + 1]))
    ids = f.new_ids(4096 + 5)
    values = [int(i, 16) for i in ids]
    assert values == sorted(set(values))
    assert values[4095] >> 22 == 10 and values[4096] >> 22 == 11
    assert values[4096] & 0xFFF == 0


def test_clock_going_backwards_is_waited_out():
    ts = TWEPOCH + 50
    f = GUIDFactory(1, Clock([ts]))
    first = f.new_ids(2)
    f._clock = Clock([ts - 5, ts - 1, ts])
    later = f.new_ids(1)
    assert int(later[0], 16) > int(first[-1], 16)


def test_ids_increase_across_calls():
    f = GUIDFactory(3)
    ids = [i for _ in range(50) for i in f.new_ids(37)]
    assert ids == sorted(set(ids))


def test_blocks_are_the_ids_formatted_in_full():
    """prefix + suffix is the ID's 16 hex digits, across a tick boundary and for single IDs."""
    ts = TWEPOCH + 77
    f = GUIDFactory(1023, Clock([ts, ts, ts + 1, ts + 1]))
    blocks = f.new_id_blocks(4096 + 3)
    assert [len(suffixes) for _, suffixes in blocks] == [4096, 3]
    ids = [prefix + s for prefix, suffixes in blocks for s in suffixes]
    ids += f.new_ids(1) + f.new_ids(2)
    values = [(77 << 22) | (1023 << 12) | seq for seq in range(4096)]
    values += [(78 << 22) | (1023 << 12) | seq for seq in range(6)]
    assert ids == [b"%016x" % v for v in values]


def test_new_id_is_the_id_new_ids_would_make_within_a_tick_across_ticks_and_after_exhaustion():
    """new_id's shortcut (the last ID plus one) and its fallback give new_ids(1)'s IDs exactly."""
    ts = TWEPOCH + 500
    ticks = [ts] * 4100 + [ts + 1] * 3 + [ts + 3]
    one, many = GUIDFactory(7, Clock(ticks)), GUIDFactory(7, Clock(ticks))
    for _ in range(len(ticks) - 1):
        a, b = one.new_id(), many.new_ids(1)[0]
        assert a == b and type(a) is bytes and len(a) == 16
    values = [int(i, 16) for i in (one.new_id() for _ in range(5))]
    assert values == sorted(set(values))
    assert one.new_ids(2)[0] > b"%016x" % values[-1]


def test_new_id_shortcut_follows_an_mpub_block():
    ts = TWEPOCH + 42
    f = GUIDFactory(3, Clock([ts]))
    ids = f.new_ids(10) + [f.new_id() for _ in range(3)]
    values = [int(i, 16) for i in ids]
    assert [v & 0xFFF for v in values] == list(range(13))
    assert all(v >> 22 == 42 and (v >> 12) & 0x3FF == 3 for v in values)


def test_new_id_starts_a_tick_from_the_time_its_caller_read():
    """A PUB's message timestamp and its ID's tick come from one clock read (the factory's own
    clock is not read again), and a time behind the last ID's is waited out as new_ids does."""
    ts = TWEPOCH + 900
    f = GUIDFactory(5, Clock([ts + 10]))  # (read only by the fallback)
    assert int(f.new_id(ts << 20), 16) == (900 << 22) | (5 << 12)
    assert int(f.new_id(ts << 20), 16) == (900 << 22) | (5 << 12) | 1
    assert int(f.new_id((ts + 2) << 20), 16) == (902 << 22) | (5 << 12)
    assert int(f.new_id(ts << 20), 16) == (910 << 22) | (5 << 12)  # behind: the fallback's clock
