"""Process tuning for a broker: the gc threshold, giving memory back, the futex hash.

Three process-wide settings, each for a cost a broker with thousands of
messages and connections pays and a small program does not:

* :func:`tune_gc` (CPython): the cyclic garbage collector's youngest
  generation is collected after 500,000 net allocations of tracked objects
  instead of 700.  Every in-flight Message is such an object, and none is
  part of a cycle.  The count is net (a freed object takes its allocation
  back), so it climbs only while the objects alive grow: as a consumer's
  in-flight window fills.  Below the threshold, a window of up to a few
  hundred thousand messages is taken and FINed without one collection;
  with a low threshold every such window was traversed by each generation
  in turn as it filled: about a quarter of a broker's CPU per message at
  200,000 in flight (docs/performance.md has the measurements).  The broker's own
  paths (connections, subscriptions, HTTP requests) leave no reference
  cycles (tests/internal/test_process.py), so what waits longer for a
  collection is only what a rare error path leaves.  PyPy keeps its
  defaults: its collector is generational without this cost, and lower
  JIT thresholds traded a shorter warm-up for more compilations, each a
  pause, with no better latency (docs/performance.md).
  It changes what a whole program sees, so only the command applies it
  (``cli.serve``), never :class:`~nsqd_threaded.server.nsqd.NSQD`: a program
  that embeds brokers keeps its own settings.
* :func:`widen_futex_hash` (Linux 6.16+): the daemon itself makes this one
  (``NSQD.start``, before its listeners start its first threads; the command earlier still, in
  ``cli._prepare``): any process serving thousands of
  connections needs it, embedded or not, it is only ever raised, and it
  changes nothing else the program sees.
* :func:`malloc_trim` (glibc): the idle watcher calls it after a mass
  disconnect (see ``server.idle.IdleWatcher``).
"""

import ctypes
import gc
import platform
import sys

GC_GEN0_THRESHOLD = 500000


def tune_gc():
    """Raise this interpreter's youngest-generation gc threshold (CPython; a threshold of 0, GC off, is kept)."""
    if platform.python_implementation() != "CPython":
        return
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0:
        gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)


def _libc_function(name, argtypes, restype=ctypes.c_int):
    """A function of this process's C library through ctypes, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function


# Looked up once, at import: each ctypes.CDLL builds a class, a cost every broker paid twice as it
# started.  Constants (set here, never changed), so the brokers of one process may share them.
_MALLOC_TRIM = _libc_function("malloc_trim", [ctypes.c_size_t])  # glibc only (not musl)
_PRCTL = _libc_function("prctl", [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong])


def malloc_trim():
    """glibc's ``malloc_trim`` (ctypes releases the GIL around it), or None elsewhere."""
    return _MALLOC_TRIM


FUTEX_HASH_SLOTS = 8192  # futex hash buckets wanted for a process holding thousands of threads
_PR_FUTEX_HASH = 78  # prctl(2) option and sub-commands (linux/prctl.h, Linux 6.16+)
_PR_FUTEX_HASH_SET_SLOTS = 1
_PR_FUTEX_HASH_GET_SLOTS = 2


def widen_futex_hash(slots=FUTEX_HASH_SLOTS):
    """Give this process a futex hash table with ``slots`` buckets (Linux 6.16+; elsewhere a no-op).

    Every sleeping thread (on a lock, a Condition, the GIL) waits in a
    bucket of its process's futex hash, and every wake-up walks its bucket.
    Since Linux 6.16 a threaded process gets a private table sized by its
    CPU count, not its thread count: 16 buckets on 2 CPUs, so with 10,000
    threads each wake-up walked some 600 waiters, and a mass disconnect (a
    few wake-ups per connection) spent most of its time there in the kernel.
    Returns the slots now in use, or None where the call is not supported.
    The setting is the process's and only ever raised, so brokers sharing a
    process agree on it; 8192 buckets cost the kernel about half a MB.
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    current = prctl(_PR_FUTEX_HASH, _PR_FUTEX_HASH_GET_SLOTS, 0, 0, 0)
    if current < 0:
        return None  # before Linux 6.16: one global table, nothing to do
    if current >= slots:
        return current
    if prctl(_PR_FUTEX_HASH, _PR_FUTEX_HASH_SET_SLOTS, slots, 0, 0) < 0:
        return current
    return slots
