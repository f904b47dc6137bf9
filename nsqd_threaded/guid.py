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


class GUIDError(Exception):
    pass


class GUIDFactory:
    """Generates increasing IDs.  ``_lock`` guards the last timestamp/sequence/id."""

    def __init__(self, node_id, clock=time.time_ns):
        self.node_id = node_id
        self._clock = clock
        self._lock = threading.Lock()
        self._last_ts = -1
        self._sequence = 0
        self._last_id = 0

    def _next(self, ts):
        """One raw ID for timestamp ``ts`` (2**20 ns units); caller holds the lock."""
        if ts < self._last_ts:
            raise GUIDError("time has gone backwards")
        if ts == self._last_ts:
            self._sequence = (self._sequence + 1) & SEQUENCE_MASK
            if self._sequence == 0:
                raise GUIDError("sequence expired")
        else:
            self._sequence = 0
        self._last_ts = ts
        new_id = ((ts - TWEPOCH) << TIMESTAMP_SHIFT) | (self.node_id << SEQUENCE_BITS) | self._sequence
        if new_id <= self._last_id:
            raise GUIDError("ID went backward")
        self._last_id = new_id
        return new_id

    def new_ids(self, n):
        """``n`` IDs as 16-byte hex strings.

        Like nsqd, a failure (clock went back, 4096 IDs in one tick) is retried
        every millisecond until it succeeds.
        """
        out = []
        with self._lock:
            while len(out) < n:
                try:
                    out.append(b"%016x" % self._next(self._clock() >> 20))
                except GUIDError:
                    time.sleep(0.001)
        return out

    def new_id(self):
        return self.new_ids(1)[0]
