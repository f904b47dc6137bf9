"""Where a topic or channel puts the messages its memory queue cannot hold.

nsqd calls this the backend queue: a go-diskqueue for normal topics and
channels, a discard queue for ``#ephemeral`` ones.  The interface below is
all a Topic or Channel uses; the file diskqueue implements it too.

Every method is called with the owner's lock held, so implementations need
no locking of their own unless they run threads.
"""

import collections


class BackendError(Exception):
    """A write failed (disk full, file too large, ...); the text goes to the client."""


class Backend:
    """The backend interface."""

    def put(self, msgs):
        """Append messages (a list); raise BackendError if they cannot be stored."""
        raise NotImplementedError

    def get(self, n):
        """Remove and return up to ``n`` messages, oldest first."""
        raise NotImplementedError

    def depth(self):
        """Messages stored and not yet taken."""
        raise NotImplementedError

    def empty(self):
        """Drop everything stored."""
        raise NotImplementedError

    def close(self):
        """Make what is stored durable and release resources (graceful shutdown)."""

    def delete(self):
        """Release resources without persisting (after empty(), on delete)."""


class BackedQueue:
    """What Topic and Channel share: a memory deque and a backend for the overflow.

    Subclasses set ``_lock`` (guarding both), ``_memory``, ``_backend`` and ``exiting``.
    """

    def depth(self):
        """Messages waiting: memory plus backend (not in flight, not deferred)."""
        with self._lock:
            return len(self._memory) + self._backend.depth()

    def sync_backend(self, now):
        """Periodic fsync of the backend once --sync-timeout has passed (queue-scan loop)."""
        with self._lock:
            maybe_sync = getattr(self._backend, "maybe_sync", None)
            if maybe_sync is not None and not self.exiting:
                maybe_sync(now)


class MemoryBackend(Backend):
    """An unbounded in-process overflow queue.

    The stand-in until the file diskqueue lands: correct (nothing is dropped,
    order is kept, attempts and deferral survive) but not durable.
    """

    def __init__(self):
        self._msgs = collections.deque()

    def put(self, msgs):
        self._msgs.extend(msgs)

    def get(self, n):
        q = self._msgs
        if n >= len(q):
            out = list(q)
            q.clear()
            return out
        return [q.popleft() for _ in range(n)]

    def depth(self):
        return len(self._msgs)

    def empty(self):
        self._msgs.clear()


class DiscardBackend(Backend):
    """For ephemeral topics and channels: writes succeed and vanish."""

    def put(self, msgs):
        pass

    def get(self, n):
        return []

    def depth(self):
        return 0

    def empty(self):
        pass
