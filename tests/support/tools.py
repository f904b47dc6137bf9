"""A tool run as the user runs it: a child process, its stdout collected as bytes, its stderr as lines."""

import os
import signal
import subprocess
import sys
import threading
import time

from support.proc import REPO_ROOT

GO_BIN = os.environ.get("NSQ_GO_BIN", "/work/shared/reference/go-nsq-1.3.0")


def go_tool(name):
    """The path of Go's tool, or None when the reference binaries are not here."""
    path = os.path.join(GO_BIN, name)
    return path if os.access(path, os.X_OK) else None


class Tool:
    """``python -m nsqd_threaded <command> args`` (or ``argv`` as given) with pipes; readers collect both outputs."""

    def __init__(self, *args, argv=None, stdin=subprocess.DEVNULL, cwd=None):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        argv = list(argv) if argv is not None else [sys.executable, "-m", "nsqd_threaded"] + list(args)
        self.proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     cwd=cwd)
        self._lock = threading.Lock()  # guards out and err
        self._grew = threading.Condition(self._lock)
        self.out = b""
        self.err = b""
        # daemon: a grandchild holding a pipe open keeps its reader past wait()'s bound
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, "out"), name="tool-stdout",
                                          daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, "err"), name="tool-stderr",
                                          daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, name):
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                return
            with self._grew:
                setattr(self, name, getattr(self, name) + chunk)
                self._grew.notify_all()

    def wait_output(self, predicate, timeout=20.0, what="output"):
        """Wait until ``predicate(stdout bytes, stderr bytes)`` holds."""
        with self._grew:
            if not self._grew.wait_for(lambda: predicate(self.out, self.err) or self.proc.poll() is not None, timeout) \
                    or not predicate(self.out, self.err):
                raise AssertionError("no %s within %ss (exit %s); stdout %r; stderr %r"
                                     % (what, timeout, self.proc.poll(), self.out[-500:], self.err[-2000:]))

    def signal(self, signum=signal.SIGTERM):
        self.proc.send_signal(signum)

    def wait(self, timeout=30.0):
        """The exit code, once both outputs are read to the end."""
        code = self.proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        return code

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        if self.proc.stdin:
            self.proc.stdin.close()


def run(*args, argv=None, input=None, timeout=60):
    """Run to the end: ``(exit code, stdout bytes, stderr text)``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    argv = list(argv) if argv is not None else [sys.executable, "-m", "nsqd_threaded"] + list(args)
    result = subprocess.run(argv, input=input, stdin=None if input is not None else subprocess.DEVNULL,
                            capture_output=True, env=env, timeout=timeout)
    return result.returncode, result.stdout, result.stderr.decode("utf-8", "replace")


# -- a broker's channels, as the tools' tests set them up and read them -----------------


def make_channels(broker, topic, *names):
    """Create the channels (before publishing: a channel gets only what is published after it exists)."""
    for name in names:
        broker.nsqd.get_topic(topic).get_channel(name)


def channel_counts(broker, topic, name):
    """``(depth, in flight, deferred)`` of a channel from /stats, None if it does not exist."""
    for t in broker.stats(topic=topic)["topics"] or ():
        for c in t["channels"] or ():
            if c["channel_name"] == name:
                return c["depth"], c["in_flight_count"], c["deferred_count"]
    return None


def drain(broker, topic, channel, n=None):
    """The bodies of ``n`` messages of the channel (every one left, if None), FINed as read."""
    from nsqd_threaded.client import Consumer

    if n is None:
        n = channel_counts(broker, topic, channel)[0]
    got = []
    if n:
        with Consumer(broker.tcp_addr, topic, channel, max_in_flight=200) as consumer:
            while len(got) < n:
                msg = consumer.get(timeout=20)
                got.append(msg.body)
                msg.fin()
    return got
