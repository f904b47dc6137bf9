"""The time the client's own timers run on: real time, or (``clock=``) a broker's clock in a test.

A :class:`~nsqd_threaded.testing.Broker` (or its ``Lookupd`` or ``Cluster``) skips its clock forward
when a test says so, or by itself (``auto_skip``).  A Consumer or Producer given ``clock=`` that daemon
waits on the same clock for its reconnect delays and its backoff, so a test of them waits no real
time either: ``delay`` seconds pass when the clock says they have.
"""

import threading
import time

SLICE = 0.05  # real seconds between two looks at a clock that may have been moved


def clock_of(source):
    """The object with ``monotonic()`` that ``source`` stands for (None: real time).

    ``source``: a clock (anything with ``monotonic()``) or a testing daemon with a ``clock``."""
    if source is None:
        return None
    if callable(getattr(source, "monotonic", None)):
        return source
    clock = getattr(source, "clock", None)
    if clock is not None and callable(getattr(clock, "monotonic", None)):
        return clock
    raise TypeError("clock= takes a clock (with monotonic()) or a testing Broker, Lookupd or Cluster, not %r"
                    % (source,))


class ClientClock:
    """Waits of a client, in seconds of its clock: :meth:`wait` and :meth:`timer`."""

    def __init__(self, source=None):
        self._clock = clock_of(source)

    def monotonic(self):
        return time.monotonic() if self._clock is None else self._clock.monotonic()

    def wait(self, event, seconds):
        """Wait ``seconds`` of the clock unless ``event`` is set first; True when it was (as Event.wait)."""
        if self._clock is None:
            return event.wait(seconds)
        deadline = self._clock.monotonic() + seconds
        hold = getattr(self._clock, "hold_deadline", None)
        token = hold(deadline) if hold is not None else None  # the daemon's next deadline counts it
        try:
            while True:
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    return event.is_set()
                if event.wait(min(remaining, SLICE)):  # (in slices: a skip moves the clock, not the event)
                    return True
        finally:
            if token is not None:
                self._clock.release_deadline(token)

    def timer(self, seconds, function, name):
        """A started daemon thread named ``name`` that calls ``function()`` after ``seconds`` of the clock,
        unless ``cancel()``-ed first (as threading.Timer)."""
        timer = _ClockTimer(self, seconds, function, name)
        timer.start()
        return timer


class _ClockTimer(threading.Thread):
    """threading.Timer on a :class:`ClientClock`; ``finished`` is set by :meth:`cancel` or at the end."""

    def __init__(self, clock, seconds, function, name):
        super().__init__(name=name, daemon=True)
        self._client_clock = clock
        self.seconds = seconds
        self.function = function
        self.finished = threading.Event()

    def cancel(self):
        self.finished.set()

    def run(self):
        if not self._client_clock.wait(self.finished, self.seconds):
            self.function()
        self.finished.set()
