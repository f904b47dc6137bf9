"""StateWatch: wake whoever waits for a broker's figures to change (a test's ``wait_until``).

A test that waits for a channel's depth, in-flight or deferred count to reach
a value could poll ``/stats``; instead it registers with the broker's
:class:`StateWatch` and is woken when a topic or channel changes.

The cost when nobody waits is one attribute test per operation (not per
message): every place that changes what ``/stats`` shows of a topic or a
channel (a publish, a fan-out, a delivery, FIN, REQ, a timeout, a deferred
message coming due, a subscription, a topic or channel made or deleted) runs,
after releasing its own lock, ``if watch.watchers: watch.notify()``.  Only a
registered waiter makes ``watchers`` non-zero, so the Condition is never
touched otherwise.

Why no change is missed: a waiter registers (``watchers`` goes up and the
current ``generation`` is noted) before it reads the figures.  A change made
before that registration is in what it reads; one made after it finds
``watchers`` non-zero and bumps ``generation``, which ends the waiter's wait.
"""

import threading
import time

# A waiter also looks again after this long without a notification: a figure
# that changes without one (a client's RDY in its /stats entry) is then seen
# late rather than never.
RECHECK_INTERVAL = 1.0


class StateWatch:
    """The broker's change notification for waiters.

    ``_changed`` (a Condition on its own lock, a leaf: nothing else is taken
    while it is held) signals that a topic or channel changed; its lock guards
    ``watchers`` and ``generation``.  ``watchers`` is also read without the
    lock, as a hint, by the places that notify.
    """

    def __init__(self):
        self._changed = threading.Condition(threading.Lock())
        self.watchers = 0  # waiters registered now
        self.generation = 0  # notifications so far (while someone waited)

    def notify(self):
        """Something changed: wake every waiter (callers test ``watchers`` first, without a lock)."""
        with self._changed:
            self.generation += 1
            self._changed.notify_all()

    def wait_for(self, check, timeout):
        """Call ``check()`` now and after each change until it returns something other than None.

        Returns that value, or None once ``timeout`` seconds have passed.
        ``check`` runs without this watch's lock (it may take topic and
        channel locks).
        """
        deadline = time.monotonic() + timeout  # real time: how long a test waits, whatever its broker skips
        with self._changed:
            self.watchers += 1
            seen = self.generation
        try:
            while True:
                found = check()
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                with self._changed:
                    if self.generation == seen:
                        self._changed.wait(min(remaining, RECHECK_INTERVAL))
                    seen = self.generation
        finally:
            with self._changed:
                self.watchers -= 1
