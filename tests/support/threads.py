"""The suite's thread watch: a test that leaves a thread running fails itself, naming the thread.

A thread nobody joins outlives its test; a non-daemon one keeps the whole pytest process alive after
its summary (the interpreter's shutdown joins it), and one that spins on a closed socket burns a core
meanwhile.  So every thread a test starts must have ended when the test's fixtures are torn down:

* per test (an autouse fixture, torn down after the test's other function-scoped fixtures): the
  threads started since the test's set-up began that are still running, after a short grace for
  threads that end a moment after what they served was closed;
* per module, for a test that used a module-scoped fixture (whose daemons may keep threads between
  tests): the same at the module's end, once its module-scoped fixtures are torn down;
* at the session's end, every thread but the main one and the session-scoped fixtures' is reported
  (a failure: the exit status is set).

Threads started while a module- or session-scoped fixture was set up are that fixture's (see
:func:`fixture_setup`), allowed until its scope ends.  A failure names each thread, whether it is a
daemon, and where it is now (the innermost frames of its stack).
"""

import os
import sys
import threading
import time
import traceback

# seconds a lingering thread is given to end (a loaded machine is slow to run it); NSQD_TEST_THREAD_GRACE
# shortens it for the test of the watch itself
GRACE = float(os.environ.get("NSQD_TEST_THREAD_GRACE", "5"))


def record_starts():
    """From now on each thread remembers where it was started (``_started_at``), for a failure's text."""
    start = threading.Thread.start
    if getattr(start, "_records_where", False):
        return

    def recorded_start(self):
        self._started_at = traceback.extract_stack(limit=12)[:-1]
        return start(self)

    recorded_start._records_where = True
    threading.Thread.start = recorded_start


class ThreadWatch:
    """What the session knows of threads: which belong to fixtures wider than a test.

    ``owned`` maps a scope ("module", "session") to the threads started while such a fixture was set
    up; ``deferred`` holds the threads a test left while it used a module-scoped fixture, checked at the
    module's end.  Only pytest's main thread touches these (fixtures are set up and torn down there).
    """

    def __init__(self):
        self.owned = {"module": set(), "session": set()}
        self.deferred = set()
        self.module_daemons = False  # a module-scoped fixture (other than the watch's own) is set up
        self.main = threading.current_thread()

    def allowed(self, scope):
        """The threads allowed to outlive a scope's end ("function", "module" or "session")."""
        allowed = {self.main}
        if scope == "function":
            allowed |= self.owned["module"]
        if scope in ("function", "module"):
            allowed |= self.owned["session"]
        return allowed

    def lingering(self, before, scope, grace=None):
        """The threads not in ``before`` still running after up to ``grace`` seconds, but those allowed."""
        deadline = time.monotonic() + (GRACE if grace is None else grace)
        while True:
            allowed = self.allowed(scope)
            left = [t for t in threading.enumerate() if t not in before and t not in allowed and t.is_alive()]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)


def describe(threads):
    """Each thread's name, daemon flag and innermost frames, for a failure's text."""
    frames = sys._current_frames()
    lines = []
    for t in sorted(threads, key=lambda t: t.name):
        lines.append("  %r (%s)" % (t.name, "daemon" if t.daemon else "not daemon: it keeps the process alive"))
        frame = frames.get(t.ident)
        if frame is not None:
            for entry in traceback.format_stack(frame)[-3:]:
                lines.append("    " + entry.rstrip().replace("\n", "\n    "))
        started = getattr(t, "_started_at", None)
        if started:
            lines.append("    started by:")
            for entry in traceback.format_list(started)[-6:]:
                lines.append("    " + entry.rstrip().replace("\n", "\n    "))
    return "\n".join(lines)


def leak_message(threads, what):
    return ("%d thread(s) %s are still running (every thread a test starts must end by its teardown: "
            "join it with a bound, or make the thing that runs it stop):\n%s" % (len(threads), what, describe(threads)))
