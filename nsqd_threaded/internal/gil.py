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
"""

import time

PACE_INTERVAL = 0.001  # seconds of walking between two hand-offs


class GILPacer:
    """Call :meth:`tick` between two pieces of a walk: it sleeps (handing the GIL
    to a waiting thread) once :data:`PACE_INTERVAL` has passed since the last
    hand-off.  One per walk, used by one thread: no lock."""

    __slots__ = ("_next",)

    def __init__(self):
        self._next = time.monotonic() + PACE_INTERVAL  # real time: paces the walk, no message waits on it

    def tick(self):
        if time.monotonic() >= self._next:  # real time (see __init__)
            time.sleep(0)  # (a hand-off, not a wait)
            self._next = time.monotonic() + PACE_INTERVAL  # real time (see __init__)
