"""A log sink for brokers under test."""

import io
import threading


class LogCapture(io.StringIO):
    """A thread-safe log sink for a broker under test."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()

    def write(self, s):
        with self._lock:
            return super().write(s)
