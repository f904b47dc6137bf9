"""Where a topic or channel puts the messages its memory queue cannot hold.

nsqd calls this the backend queue: a go-diskqueue for normal topics and
channels (its durable subclass with ``--durable``), a discard queue for
``#ephemeral`` ones.  :class:`Backend` is everything a Topic or Channel
calls; the durable-mode methods have no-op defaults, so an owner never asks
which kind of backend it has.  Where the policy of an owner must differ, the
backend says so through :attr:`Backend.acks_deliveries` and
:meth:`Backend.memory_capacity`.

Every method except :meth:`Backend.wait_synced` is called with the owner's
lock held, so implementations need no locking of their own unless they share
state with ``wait_synced`` callers.

The memory queue in front of a backend is the broker's (its ``BackedQueue``):
this module knows nothing above storage.
"""


class BackendError(Exception):
    """A write failed (disk full, file too large, ...); the text goes to the client."""


class Backend:
    """The backend interface."""

    #: Records handed out by get() stay stored until ack() (``--durable``).  Its owner
    #: then writes every message here (no inline fan-out, no memory queue for new
    #: messages), acks a message once it is done with it, and keeps requeued
    #: messages in memory (their records are still stored).
    acks_deliveries = False

    def memory_capacity(self, mem_queue_size):
        """How many new messages the owner may hold in memory before writing here."""
        return mem_queue_size

    def put(self, msgs):
        """Append messages (a list of Messages and records); raise BackendError if they cannot be stored."""
        raise NotImplementedError

    def holds_record(self, file_num, pos, msg_id):
        """Whether the record ``msg_id`` written at ``(file_num, pos)`` is stored or was consumed
        (durable mode's dead-letter check after a crash); a backend that cannot tell: False."""
        return False

    def position_of(self, msg_id):
        """``(file num, pos)`` of the record ``msg_id`` handed out by get() and not acknowledged yet
        (durable mode: where a redrive's message was); a backend that cannot tell: None."""
        return None

    def holds_undone(self, file_num, pos, msg_id):
        """Whether the record ``msg_id`` at ``(file_num, pos)`` is still stored and not acknowledged, so
        that get() hands it out again (durable mode, after a crash); a backend that cannot tell: False."""
        return False

    def get(self, n, records=False):
        """Remove and return up to ``n`` messages, oldest first, as Messages.

        ``records``: those with no delay to wait may come back as records
        (bytes), if the backend has them at hand in that form.
        """
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

    def ack(self, msg_ids, persist=False):
        """The owner is done with these messages taken by get(); returns how many were known.
        ``persist``: make the new read position reach the metadata file now (not fsynced)."""
        return 0

    def keep_attempts(self, msgs, due_ns=None):
        """These messages taken by get() go back to the owner's queue: keep their attempts where a
        restart reads them (durable mode; elsewhere they are written again with them, or lost), and
        with ``due_ns`` (Unix ns: a REQ's delay) when they are due, so a restart defers them until then."""

    def sync_point(self):
        """A token for everything put so far, for :meth:`wait_synced` (None: nothing to wait for)."""
        return None

    def wait_synced(self, token):
        """Return once everything up to ``token`` is on disk; called WITHOUT the owner's lock."""

    def maybe_sync(self, now):
        """The periodic --sync-timeout flush (``now``: time.monotonic()); True if it synced."""
        return False

    def sync(self):
        """fsync what was written and persist the metadata now; False when that failed."""
        return True

    def stored_ids(self):
        """The message IDs from the read position on, in the order ``get`` hands them out."""
        return iter(())

    def last_record_id(self):
        """The message ID of the last record written (None: none kept)."""
        return None

    def peek(self, n=None):
        """What is stored and not yet taken, without taking it: ``(queued, deferred)``.

        ``queued``: up to ``n`` (None: all) Messages in the order :meth:`get` would hand
        them out; ``deferred``: every stored Message whose delay still runs, as
        ``(message, due unix ns)``.  Nothing moves: no position, no file, no count.
        """
        return [], []

    def describe(self):
        """What the inside view (``/debug/state``) shows of this backend: a small dict of figures."""
        return {"kind": type(self).__name__, "depth": self.depth()}

    def needs_sync(self):
        """True while something written, read or acknowledged awaits the periodic flush."""
        return False


class DiscardBackend(Backend):
    """For ephemeral topics and channels: writes succeed and vanish."""

    def put(self, msgs):
        pass

    def get(self, n, records=False):
        return []

    def depth(self):
        return 0

    def empty(self):
        pass
