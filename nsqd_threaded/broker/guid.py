"""Message IDs: nsqd's time/node/sequence layout, rendered as 16 hex bytes.

``id = ((ts - EPOCH) << 22) | (node_id << 12) | sequence`` with ``ts`` in units
of 2**20 ns.  One factory per topic, as in nsqd: IDs are unique per topic.

The sequence is the low 12 bits, exactly the last 3 hex digits: the IDs of
one clock tick share their first 13 digits (a *prefix*) and differ in a
*suffix* taken from :data:`SEQUENCE_HEX`.  An MPUB's IDs are made as blocks
of (prefix, suffixes), one per tick, and an ID is one concatenation instead
of a formatting of a 64-bit number (a third of the cost).
"""

import threading
import time

TWEPOCH = 1288834974288
NODE_ID_BITS = 10
SEQUENCE_BITS = 12
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
TIMESTAMP_SHIFT = NODE_ID_BITS + SEQUENCE_BITS

#: The 3 hex digits of each sequence number: an ID's suffix.
SEQUENCE_HEX = tuple(b"%03x" % seq for seq in range(SEQUENCE_MASK + 1))


def _prefix_of(id_number):
    """The first 13 hex digits of an ID: those its tick's IDs share."""
    return b"%013x" % (id_number >> SEQUENCE_BITS)


class GUIDFactory:
    """Generates increasing IDs.  ``_lock`` guards the last timestamp, sequence, ID and prefix.

    ``_lock`` is a leaf: :meth:`Topic.publish` may call :meth:`new_ids` holding
    ``Topic._lock``, and nothing is acquired while ``_lock`` is held.
    """

    def __init__(self, node_id, clock=time.time_ns):
        """``clock``: Unix ns, the broker's (:class:`~nsqd_threaded.internal.clock.Clock`), read per tick."""
        self.node_id = node_id
        self._clock = clock
        self._lock = threading.Lock()  # guards last timestamp, sequence, ID and prefix
        self._last_ts = -1
        self._sequence = 0
        self._last_id = 0
        self._prefix = b""  # the first 13 hex digits of the last ID

    def new_id_blocks(self, n):
        """``n`` IDs in increasing order, as ``[(prefix, suffixes)]``: one block per clock
        tick, whose IDs are ``prefix + suffix`` for each of its ``suffixes`` (a tuple).

        One clock read per tick, not per ID.  Like nsqd, when the clock goes
        back or a tick's 4096 sequence numbers are used up, it retries every
        millisecond.
        """
        blocks = []
        with self._lock:
            if n == 1:
                # One ID in the tick of the last one (a stream of PUBs): the next
                # sequence number, which is the last ID plus one.
                ts = self._clock() >> 20
                if ts == self._last_ts and self._sequence < SEQUENCE_MASK:
                    self._sequence += 1
                    self._last_id += 1
                    return [(self._prefix, SEQUENCE_HEX[self._sequence : self._sequence + 1])]
            while n > 0:
                ts = self._clock() >> 20
                if ts < self._last_ts:
                    time.sleep(0.001)  # time has gone backwards
                    continue
                start = self._sequence + 1 if ts == self._last_ts else 0
                count = min(SEQUENCE_MASK + 1 - start, n)
                if count <= 0:
                    time.sleep(0.001)  # sequence expired for this tick
                    continue
                first = self._id_number(ts, start)
                if first <= self._last_id:
                    time.sleep(0.001)  # ID went backward
                    continue
                if ts != self._last_ts:
                    self._prefix = _prefix_of(first)
                blocks.append((self._prefix, SEQUENCE_HEX[start : start + count]))
                n -= count
                self._last_ts = ts
                self._sequence = start + count - 1
                self._last_id = first + count - 1
        return blocks

    def _id_number(self, ts, sequence):
        """The ID of ``sequence`` in tick ``ts`` (units of 2**20 ns), as a number."""
        return ((ts - TWEPOCH) << TIMESTAMP_SHIFT) | (self.node_id << SEQUENCE_BITS) | sequence

    def new_ids(self, n):
        """``n`` IDs as 16-byte hex strings, in increasing order."""
        blocks = self.new_id_blocks(n)
        if len(blocks) == 1:
            prefix, suffixes = blocks[0]
            return [prefix + s for s in suffixes]
        return [prefix + s for prefix, suffixes in blocks for s in suffixes]

    def new_id(self, now_ns=None):
        """One ID as a 16-byte hex string (a PUB's): the same ID ``new_ids(1)`` makes.

        ``now_ns``: the clock's time, if the caller has just read it (for the
        message's timestamp: one read, not two).  In the tick of the last ID it is the last one plus
        one, made here with no intermediate list or slice; otherwise
        :meth:`new_id_blocks` reads the clock again and starts a tick (or waits
        as it does).
        """
        if now_ns is None:
            now_ns = self._clock()
        ts = now_ns >> 20
        with self._lock:
            if ts == self._last_ts and self._sequence < SEQUENCE_MASK:
                sequence = self._sequence = self._sequence + 1
                self._last_id += 1
                return self._prefix + SEQUENCE_HEX[sequence]
            if ts > self._last_ts:
                # The first ID of a new tick (time moves on): sequence 0, its prefix made
                # here, under the same lock and clock read (what new_id_blocks(1) would make).
                first = self._id_number(ts, 0)
                if first > self._last_id:
                    self._last_ts = ts
                    self._sequence = 0
                    self._last_id = first
                    prefix = self._prefix = _prefix_of(first)
                    return prefix + SEQUENCE_HEX[0]
        prefix, suffixes = self.new_id_blocks(1)[0]  # (the clock went back, or the tick is used up)
        return prefix + suffixes[0]
