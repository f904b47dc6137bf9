"""Clock: the time of one broker (or one nsqlookupd), which a test may move forward.

Everything a daemon schedules by the clock of its messages reads this object,
never the ``time`` module: message timestamps and IDs, in-flight timeouts,
deferred and REQ-delayed due times, e2e latency, nsqlookupd's producer
inactivity and tombstones.  What keeps connections alive (heartbeats, read
and write deadlines, IDENTIFY and AUTH timeouts, the HTTP server's deadlines)
stays on the ``time`` module: moving a clock forward never disconnects a
healthy client.

A clock is real time plus an offset that only grows.  Without time skipping
the offset is always 0 and :attr:`Clock.time_ns`, :attr:`Clock.time` and
:attr:`Clock.monotonic` *are* the ``time`` module's functions (bound as
attributes), so reading the clock costs what reading ``time`` cost.  With
time skipping (``--time-skipping``, or a testing broker) :meth:`Clock.skip`
moves it forward and wakes whoever sleeps on :attr:`Clock.moved`: the
queue scanner then looks at once for what fell due.

One clock per daemon: many brokers in one process each have their own.
"""

import threading
import time

from .gocompat import parse_duration_ns

NS = 1_000_000_000


class TimeSkippingDisabled(RuntimeError):
    """A skip was asked of a clock made without time skipping."""


class Clock:
    """Real time, plus (time skipping) an offset that :meth:`skip` grows.

    ``_lock`` guards ``_offset_ns``, ``skips`` and ``_waiters``.  ``moved`` (a Condition on
    ``_lock``) signals that the clock jumped forward, or that a sleeper must
    look at its own state again (:meth:`wake`, e.g. the scanner's stop).
    The readers (``time_ns``, ``time``, ``monotonic``) take no lock: the
    offset is one int, read atomically, and only grows.
    """

    def __init__(self, skipping=False):
        self.skipping = bool(skipping)
        self._lock = threading.Lock()  # guards _offset_ns and skips
        self.moved = threading.Condition(self._lock)  # signals: the clock jumped forward (or: look again)
        self._offset_ns = 0
        self.skips = 0  # how many skips so far (a sleeper compares it with the count it saw)
        self._waiters = {}  # token -> monotonic deadline of someone else waiting on this clock (a client)
        if self.skipping:
            self.time_ns = self._skipped_time_ns
            self.time = self._skipped_time
            self.monotonic = self._skipped_monotonic
        else:
            # The time module's own functions: no wrapper call on the message path.
            self.time_ns = time.time_ns
            self.time = time.time
            self.monotonic = time.monotonic

    def __repr__(self):
        return "Clock(skipping=%s, skipped=%gs)" % (self.skipping, self.skipped)

    # -- reading (with skipping on: the time module's value plus the offset) ------

    def _skipped_time_ns(self):
        return time.time_ns() + self._offset_ns

    def _skipped_time(self):
        return time.time() + self._offset_ns / NS

    def _skipped_monotonic(self):
        return time.monotonic() + self._offset_ns / NS

    @property
    def skipped(self):
        """Seconds skipped so far (0.0 without time skipping)."""
        return self._offset_ns / NS

    # -- moving ------------------------------------------------------------------

    def skip(self, seconds):
        """Move the clock forward by ``seconds`` (>= 0) and wake the sleepers on :attr:`moved`.

        Returns the number of this skip (:attr:`skips` after it).  Raises
        :class:`TimeSkippingDisabled` on a clock made without time skipping.
        """
        return self.skip_ns(int(round(seconds * NS)))

    def skip_ns(self, ns):
        """:meth:`skip` by ``ns`` nanoseconds."""
        if not self.skipping:
            raise TimeSkippingDisabled("time skipping is off (start the daemon with --time-skipping)")
        if ns < 0:
            raise ValueError("a clock only moves forward (asked to skip %dns)" % ns)
        with self._lock:
            self._offset_ns += ns
            self.skips += 1
            self.moved.notify_all()
            return self.skips

    # -- others waiting on this clock ----------------------------------------------

    def hold_deadline(self, monotonic_deadline):
        """Someone outside the daemon (a test's client: its reconnect delay, its backoff) waits on this
        clock until ``monotonic_deadline``: the daemon counts it among its deadlines (an advance to the
        next deadline, an automatic skip, stop there).  Returns the token :meth:`release_deadline` takes."""
        token = object()
        with self._lock:
            self._waiters[token] = monotonic_deadline
        return token

    def release_deadline(self, token):
        with self._lock:
            self._waiters.pop(token, None)

    def next_waiter_ns(self):
        """The earliest deadline held by :meth:`hold_deadline`, as this clock's Unix ns; None if none."""
        with self._lock:
            if not self._waiters:
                return None
            earliest = min(self._waiters.values())
        return self.time_ns() + int((earliest - self.monotonic()) * NS)

    def wake(self):
        """Wake every sleeper on :attr:`moved` without moving the clock (it re-checks its own state)."""
        with self._lock:
            self.moved.notify_all()


def parse_skip_ns(text):
    """The ``by`` of ``POST /debug/time/skip``: a Go duration (``61s``, ``1h30m``) as nanoseconds.

    Raises ValueError (Go's wording) for anything else, and for a negative duration.
    """
    ns = parse_duration_ns(text)
    if ns < 0:
        raise ValueError("time: negative duration %s" % text)
    return ns
