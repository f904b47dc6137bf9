"""GILPacer: a long CPU-bound walk gives the GIL away every so often, on purpose.

CPython hands the GIL to a waiting thread at a blocking call, or when the
waiter has waited a whole switch interval (5 ms) and asks for it.  A walk over
thousands of objects (a /stats of thousands of channels) holds it in between,
and a thread that wants it (a disconnect's teardown, a publisher) waits that
long after each of its system calls.  So the walk sleeps now and then.

``time.sleep(0)`` is that hand-off: the sleeper is off the GIL for Linux's
timer slack (about 50 us, even when nobody waits), long enough for a waiter on
another core to wake and take it.  ``sched_yield`` would be cheaper, but the
yielder takes the GIL back before a waiter on another core has even woken.
Sleeping after every few objects made a 5,000-channel /stats spend more time
asleep than walking; after every :data:`PACE_INTERVAL` of walking it costs a
few per cent, and no waiter waits longer than that.

A thread that serves many clients at once (the network poller) loses more
than most by waiting: each of its system calls gives the GIL away, and it
waits for it again after each one, while the walk holds it up to a millisecond.
A walk told of such a thread (``yield_to``) therefore waits at each hand-off
while that thread is serving, up to :data:`YIELD_LIMIT`: the walk takes longer,
but at most a fifth of the time is taken from the thread that others wait on.
"""

import time

PACE_INTERVAL = 0.001  # seconds of walking between two hand-offs
YIELD_LIMIT = 0.004  # at most this long a hand-off waits for the yield_to thread to finish serving
YIELD_STEP = 0.0002  # how often the waiting walk looks again


class GILPacer:
    """Call :meth:`tick` between two pieces of a walk: it sleeps (handing the GIL
    to a waiting thread) once :data:`PACE_INTERVAL` has passed since the last
    hand-off, and then, while ``yield_to()`` is true, until :data:`YIELD_LIMIT` has
    passed.  One per walk, used by one thread: no lock."""

    __slots__ = ("_next", "_yield_to")

    def __init__(self, yield_to=None):
        self._next = time.monotonic() + PACE_INTERVAL  # real time: paces the walk, no message waits on it
        self._yield_to = yield_to

    def tick(self):
        if time.monotonic() >= self._next:  # real time (see __init__)
            time.sleep(0)  # (a hand-off, not a wait)
            yield_to = self._yield_to
            if yield_to is not None and yield_to():
                limit = time.monotonic() + YIELD_LIMIT  # real time (see __init__)
                while yield_to() and time.monotonic() < limit:  # real time (see __init__)
                    time.sleep(YIELD_STEP)
            self._next = time.monotonic() + PACE_INTERVAL  # real time (see __init__)
