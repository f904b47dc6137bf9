"""What Topic and Channel share: a memory queue up to a capacity, then the backend.

The flush to the backend on close, the health record of every backend write
and the queue's place in the broker's scan set (:mod:`.scan`) live here; the
backend itself is :class:`~nsqd_threaded.storage.backend.Backend`.
"""

import collections
import threading

from ..storage.backend import BackendError
from ..wire.message import from_records


class BackedQueue:
    """A memory queue up to a capacity, then the backend: what Topic and Channel share.

    Lock contract (as in CPython's ``queue.Queue``): ``_lock`` guards
    ``_memory``, ``_backend`` and every attribute a subclass adds to it.
    Public methods take it; methods named ``*_locked`` must be called with it
    held.  Every write to the backend goes through :meth:`_write_backend_locked`,
    which records the broker's health (nsqd's SetHealth after each write).
    Subclasses set ``exiting`` and may override :meth:`_room_locked`,
    :meth:`_from_backend_locked` and :meth:`_take_locked`.  The memory queue
    holds records and Messages alike (see :mod:`nsqd_threaded.wire.message`).
    """

    def __init__(self, nsqd, backend, mem_queue_size):
        self._nsqd = nsqd
        self._lock = threading.Lock()  # guards the memory queue, the backend and the subclass's state
        self._memory = collections.deque()  # the memory queue: records and Messages
        self._backend = backend
        self._mem_capacity = backend.memory_capacity(mem_queue_size)
        self._scan_listed = False  # in the broker's ScanSet (the queue scanner visits it)
        self._watch = nsqd.watch  # the broker's StateWatch: notified of changes while someone waits

    def depth(self):
        """Messages waiting: memory plus backend (not in flight, not deferred)."""
        with self._lock:
            return len(self._memory) + self._backend.depth()

    def sync_backend(self, now):
        """Periodic fsync of the backend once --sync-timeout has passed (queue-scan loop)."""
        with self._lock:
            if not self.exiting:
                self._backend.maybe_sync(now)
            self._unlist_if_idle_locked()

    def sync_backend_now(self):
        """fsync the backend and persist its metadata now (BrokerCore.sync); False when that failed."""
        with self._lock:
            if self.exiting:
                return True
            return self._backend.sync()

    def scan(self, now_ns, now):
        """The queue scanner's visit (``now_ns``: the broker's clock, ``now``: time.monotonic())."""
        self.sync_backend(now)

    def mark_scan_locked(self):
        """Something for the scanner (in flight, deferred, a backend to sync): be in its set.

        Called on every such change; only the first since the queue was
        last idle touches the set.
        """
        if not self._scan_listed:
            self._scan_listed = True
            self._nsqd.scan_set.add(self)

    def _scan_idle_locked(self):
        """Nothing left for the scanner (subclasses add their indexes)."""
        return self.exiting or not self._backend.needs_sync()

    def _unlist_if_idle_locked(self):
        if self._scan_listed and self._scan_idle_locked():
            self._scan_listed = False
            self._nsqd.scan_set.discard(self)

    def _room_locked(self):
        """How many more messages the memory queue takes."""
        return self._mem_capacity - len(self._memory)

    def _put_locked(self, msgs):
        """Memory queue up to capacity, the rest to the backend (may raise BackendError,
        in which case the messages that went to memory stay there)."""
        room = self._room_locked()
        if room >= len(msgs):
            self._memory.extend(msgs)
            return
        if room > 0:
            self._memory.extend(msgs[:room])
            msgs = msgs[room:]
        self._write_backend_locked(msgs)

    def _write_backend_locked(self, msgs):
        """The one way messages reach the backend: the write and its health record."""
        self.mark_scan_locked()  # to be synced by the scanner
        self._nsqd.backend_put(self._backend, msgs)

    def _take_locked(self, n):
        """Up to ``n`` messages, oldest first: the memory queue, then the backend."""
        memory = self._memory
        if len(memory) > n:
            if n == 1:  # (a consumer at RDY 1: once per FIN)
                return [memory.popleft()]
            return [memory.popleft() for _ in range(n)]
        msgs = list(memory)
        memory.clear()
        if len(msgs) < n and self._backend.depth():
            self.mark_scan_locked()  # a read moves the disk queue's metadata
            msgs.extend(self._from_backend_locked(n - len(msgs)))
        return msgs

    def _from_backend_locked(self, n):
        return self._backend.get(n)

    def _queued_messages_locked(self):
        """The memory queue as a new list of Messages."""
        return from_records(self._memory)

    def _flush_locked(self, extra=()):
        """Graceful close: the memory queue (then ``extra``) to the backend, then close it.

        A flushed message is written again at the tail, so its old record (a
        backend that acks deliveries still holds it) is done.  A failed write
        is logged: there is nowhere else to keep them.
        """
        flush = self._queued_messages_locked()
        self._memory.clear()
        flush.extend(extra)
        if flush:
            try:
                self._write_backend_locked(flush)
                self._backend.ack([m.id for m in flush])
            except BackendError as e:
                self._nsqd.log.error("%r: failed to flush %d messages - %s", self, len(flush), e)
        self._backend.close()

    def _drop_locked(self):
        """Delete: drop the memory queue and the backend's data, release the backend."""
        self._memory.clear()
        self._backend.empty()
        self._backend.delete()
