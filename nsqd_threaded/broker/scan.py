"""ScanSet: the topics and channels the queue scanner has work in.

An idle channel (nothing in flight, nothing deferred, its disk queue synced)
is not in the set, so the scanner's cost follows the channels with work, not
the number of channels.  A channel adds itself on the transition from idle
(see ``BackedQueue.mark_scan_locked``: one flag test on the hot path) and
the scanner removes it, under the channel's lock, once a visit leaves it idle.
"""

import threading


class ScanSet:
    """A set of :class:`~nsqd_threaded.broker.backed_queue.BackedQueue` with work for the scanner.

    ``_lock`` guards ``_members``.  Lock order: Topic._lock / Channel._lock ->
    ScanSet._lock (members add and discard themselves holding their own
    lock; the scanner copies the set under ``_lock`` alone, then visits).
    """

    def __init__(self):
        self._lock = threading.Lock()  # guards _members
        self._members = set()

    def add(self, queue):
        with self._lock:
            self._members.add(queue)

    def discard(self, queue):
        with self._lock:
            self._members.discard(queue)

    def snapshot(self):
        """The members now, as a list the scanner iterates without the lock."""
        with self._lock:
            return list(self._members)

    def __len__(self):
        with self._lock:
            return len(self._members)
