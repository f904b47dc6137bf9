"""Interpreter settings for a process that exists to run a broker (the ``nsqd-threaded`` command).

They are process-wide, so only the command applies them (``cli.serve``), never
:class:`~nsqd_threaded.server.nsqd.NSQD`: a program that embeds brokers keeps
its own settings.  (The one process-wide setting the daemon does make is the
futex hash width, :func:`nsqd_threaded.server.idle.widen_futex_hash`: any
process serving thousands of connections needs it, embedded or not, it is only
ever raised, and it changes nothing else the program sees.)

CPython: the cyclic garbage collector's youngest generation is collected
after 10,000 net allocations of tracked objects instead of 700.  Every queued
and in-flight Message is such an object, and none is part of a cycle; with the
default, messages still queued or in flight survive a young collection
several times a batch and are traversed again by the older generations
(docs/performance.md has the measurement).  Collections still run: cyclic
garbage is found a few thousand allocations later.

PyPy keeps its defaults: its collector is generational without this cost, and
lower JIT thresholds traded a shorter warm-up for more compilations, each a
pause, with no better latency (docs/performance.md).
"""

import gc
import platform

GC_GEN0_THRESHOLD = 10000


def tune():
    """Apply the settings above to this interpreter (a gc threshold of 0, GC off, is kept)."""
    if platform.python_implementation() != "CPython":
        return
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0:
        gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)
