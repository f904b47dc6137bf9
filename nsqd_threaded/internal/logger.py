"""A per-broker logger in nsqd's format: ``[nsqd] 2026/01/02 15:04:05.000000 INFO: ...``.

Each broker owns one, so brokers in one process keep their own level and
prefix (``logging`` loggers are process-global and never freed).
"""

import sys
import threading
import time

# --log-level's names and their severities (nsqd's lg.LogLevel).
LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}

_NAMES = {1: "DEBUG", 2: "INFO", 3: "WARNING", 4: "ERROR", 5: "FATAL"}


class Logger:
    """``_lock`` serializes writes so lines from different threads never interleave."""

    def __init__(self, prefix="[nsqd] ", level="info", stream=None):
        self.prefix = prefix
        self.level = LOG_LEVELS[level.lower()]
        self.stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()  # one line at a time on the stream

    def set_level(self, name):
        self.level = LOG_LEVELS[name.lower()]

    def log(self, level, fmt, *args):
        if level < self.level:
            return
        now = time.time()
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + ".%06d" % int((now % 1) * 1e6)
        line = "%s%s %s: %s\n" % (self.prefix, stamp, _NAMES[level], fmt % args if args else fmt)
        with self._lock:
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def debug(self, fmt, *args):
        self.log(1, fmt, *args)

    def info(self, fmt, *args):
        self.log(2, fmt, *args)

    def warn(self, fmt, *args):
        self.log(3, fmt, *args)

    def error(self, fmt, *args):
        self.log(4, fmt, *args)
