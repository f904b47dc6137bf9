"""Message IDs: nsqd's time/node/sequence layout, rendered as 16 hex bytes.

``id = ((ts - EPOCH) << 22) | (node_id << 12) | sequence`` with ``ts`` in units
of 2**20 ns.  One factory per topic, as in nsqd: IDs are unique per topic.
"""

import threading
import time

TWEPOCH = 1288834974288
NODE_ID_BITS = 10
SEQUENCE_BITS = 12
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
TIMESTAMP_SHIFT = NODE_ID_BITS + SEQUENCE_BITS


class GUIDFactory:
    """Generates increasing IDs.  ``_lock`` guards the last timestamp/sequence/id.

    ``_lock`` is a leaf: :meth:`Topic.publish` may call :meth:`new_ids` holding
    ``Topic._lock``, and nothing is acquired while ``_lock`` is held.
    """

    def __init__(self, node_id, clock=time.time_ns):
        self.node_id = node_id
        self._clock = clock
        self._lock = threading.Lock()  # guards last timestamp, sequence and ID
        self._last_ts = -1
        self._sequence = 0
        self._last_id = 0

    def new_ids(self, n):
        """``n`` IDs as 16-byte hex strings, in increasing order.

        IDs of one clock tick are handed out as a block (one clock read per
        tick, not per ID).  Like nsqd, when the clock goes back or a tick's 4096
        sequence numbers are used up, it retries every millisecond.
        """
        out = []
        prefix = self.node_id << SEQUENCE_BITS
        with self._lock:
            if n == 1:
                # One ID in the tick of the last one (a stream of PUBs): the next
                # sequence number, which is the last ID plus one.
                ts = self._clock() >> 20
                if ts == self._last_ts and self._sequence < SEQUENCE_MASK:
                    self._sequence += 1
                    self._last_id += 1
                    return [b"%016x" % self._last_id]
            while len(out) < n:
                ts = self._clock() >> 20
                if ts < self._last_ts:
                    time.sleep(0.001)  # time has gone backwards
                    continue
                start = self._sequence + 1 if ts == self._last_ts else 0
                count = min(SEQUENCE_MASK + 1 - start, n - len(out))
                if count <= 0:
                    time.sleep(0.001)  # sequence expired for this tick
                    continue
                first = ((ts - TWEPOCH) << TIMESTAMP_SHIFT) | prefix | start
                if first <= self._last_id:
                    time.sleep(0.001)  # ID went backward
                    continue
                out += map(b"%016x".__mod__, range(first, first + count))
                self._last_ts = ts
                self._sequence = start + count - 1
                self._last_id = first + count - 1
        return out

    def new_id(self):
        return self.new_ids(1)[0]
