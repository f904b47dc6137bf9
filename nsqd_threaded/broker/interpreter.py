"""Interpreter settings for a process that exists to run a broker (the ``nsqd-threaded`` command).

They are process-wide, so only the command applies them (``cli.serve``), never
:class:`~nsqd_threaded.broker.nsqd.NSQD`: a program that embeds brokers keeps
its own settings.

* CPython: the cyclic garbage collector's youngest generation is collected
  after 10,000 net allocations of tracked objects instead of 700.  Every
  queued and in-flight Message is such an object, and none is part of a
  cycle; with the default, messages still queued or in flight survive a young
  collection several times a batch and get traversed again by the older
  generations (a fan-out to ten channels spent about 15 % of the broker's CPU
  in the collector, with 16 ms full collections).  Collections still run:
  cyclic garbage is found a few thousand allocations later.
* PyPy: the JIT compiles a loop after 100 iterations (default 1,039), a
  function after 150 calls (1,619), a bridge after 20 failures of a guard
  (200).  A broker's per-message paths are few and hot, so compiling them
  sooner shortens the interpreted warm-up that a fresh broker's first
  thousands of messages go through (publish-to-delivery p50 and p99).
"""

import gc
import platform

GC_GEN0_THRESHOLD = 10000
PYPY_JIT_PARAMS = "threshold=100,function_threshold=150,trace_eagerness=20"


def tune():
    """Apply the settings above to this interpreter (a gc threshold of 0, GC off, is kept)."""
    if platform.python_implementation() == "PyPy":
        try:
            import pypyjit
        except ImportError:  # a PyPy built without the JIT
            return
        pypyjit.set_param(PYPY_JIT_PARAMS)
        return
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0:
        gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)
