"""LogBuffer: where a test's daemons log, in memory, with a wait for a line to appear."""

import threading
import time

__all__ = ["LogBuffer"]


class LogBuffer:
    """A thread-safe, in-memory log sink (a write-only text stream), optionally teed to ``tee``.

    ``_cond`` (with its lock) guards ``_parts`` and ``_size``; writers notify it so
    a reader can wait for a line to appear (:meth:`wait_for`).
    """

    def __init__(self, tee=None):
        self._cond = threading.Condition(threading.Lock())
        self._parts = []
        self._size = 0
        self._closed = False
        self.tee = tee

    def write(self, text):
        with self._cond:
            self._parts.append(text)
            self._size += len(text)
            self._cond.notify_all()
        if self.tee is not None:
            try:
                self.tee.write(text)
                self.tee.flush()
            except (OSError, ValueError):
                pass
        return len(text)

    def flush(self):
        pass

    def tell(self):
        """The current length in characters: pass it to :meth:`getvalue` to read only what follows."""
        with self._cond:
            return self._size

    def getvalue(self, start=0):
        with self._cond:
            if len(self._parts) > 1:
                self._parts = ["".join(self._parts)]
            text = self._parts[0] if self._parts else ""
        return text[start:]

    def close(self):
        """No more writes will come (a child's stderr reached EOF): wakes :meth:`wait_for`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self):
        with self._cond:
            return self._closed

    def reopen(self):
        """Expect writes again (the next child process)."""
        with self._cond:
            self._closed = False

    def wait_for(self, predicate, timeout):
        """Wait until ``predicate(text)`` is true or the buffer is closed; returns its last value."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if len(self._parts) > 1:
                    self._parts = ["".join(self._parts)]
                result = predicate(self._parts[0] if self._parts else "")
                remaining = deadline - time.monotonic()
                if result or self._closed or remaining <= 0:
                    return result
                self._cond.wait(remaining)
