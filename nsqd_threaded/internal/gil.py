"""Giving the GIL away on purpose, between two pieces of a long CPU-bound task.

CPython hands the GIL to a waiting thread only at a blocking call or at the
forced switch (every 5 ms).  A task that walks thousands of objects (a /stats
of thousands of channels, a topic's backlog) yields between batches so that a
thread waiting for the GIL (a disconnect's teardown, a publisher) runs now.

``time.sleep(0)`` would do it too, but on Linux it sleeps for the timer slack
(about 50 us) even when nobody waits: on a /stats of 5,000 channels, yielding
every ten of them cost more than the rest of the walk.  ``sched_yield`` releases
the GIL for one system call of well under a microsecond.
"""

import os
import time


def _sleep_zero():
    time.sleep(0)


#: Release the GIL and let the kernel run a thread that waits for it, if any.
yield_gil = getattr(os, "sched_yield", _sleep_zero)
