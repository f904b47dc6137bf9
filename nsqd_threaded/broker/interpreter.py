"""Interpreter settings for a process that exists to run a broker (the ``nsqd-threaded`` command).

They are process-wide, so only the command applies them (``cli.serve``), never
:class:`~nsqd_threaded.broker.nsqd.NSQD`: a program that embeds brokers keeps
its own settings.

CPython: the cyclic garbage collector's youngest generation is collected
after 10,000 net allocations of tracked objects instead of 700.  Every queued
and in-flight Message is such an object, and none is part of a cycle; with the
default, messages still queued or in flight survive a young collection
several times a batch and are traversed again by the older generations (a
fan-out to ten channels spent about 15 % of the broker's CPU in the collector,
with full collections of 16 ms).  Collections still run: cyclic garbage is
found a few thousand allocations later.

PyPy keeps its defaults: its collector is generational without this cost, and
lower JIT thresholds (tried: compile after 100 loop iterations instead of
1,039) shortened the warm-up but tripled the compilations, each a pause of
milliseconds, with no better publish-to-delivery p99.
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
