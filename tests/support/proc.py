"""A command run in a child process, its stderr read line by line, for the CLI tests."""

import os
import queue
import re
import subprocess
import threading
import time

import nsqd_threaded

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(nsqd_threaded.__file__)))


class CommandProcess:
    """``argv`` in a child process (this checkout importable); a reader thread collects its stderr lines."""

    def __init__(self, argv, cwd=None):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            universal_newlines=True,
        )
        self.log = []
        self._lines = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="stderr-reader", daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, pattern, timeout=20.0):
        """The match of the first new stderr line matching ``pattern``; fails at the deadline or at exit."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("no %r within %ss; log: %r" % (pattern, timeout, self.log)) from None
            if line is None:
                raise AssertionError("exited (%s) before %r; log: %r" % (self.proc.poll(), pattern, self.log))
            self.log.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=15)
        self._reader.join(timeout=15)
        self.proc.stderr.close()
