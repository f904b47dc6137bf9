"""Helpers of the --durable tests: messages, an Env owning a queue, an fsync wrapper, test threads."""

import io
import os
import stat
import threading

import pytest

from nsqd_threaded.internal.logger import Logger
from nsqd_threaded.storage.diskqueue import DiskQueue
from nsqd_threaded.storage.durable import DurableDiskQueue
from nsqd_threaded.wire.message import Message

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


TS = 0x18EA4C4C68FDBFED


REC = 44  # bytes of one record with a 14-byte body: 4 + 26 + 14


JOIN = 20  # seconds any test thread may take


def mid(i):
    return b"%016x" % i


def msg(i, body=b"x" * 14, deferred_ns=0):
    return Message(mid(i), body, TS + i, 0, deferred_ns)


def ids(msgs):
    return [m.id for m in msgs]


class Env:
    def __init__(self, path):
        self.path = str(path)
        self.log_stream = io.StringIO()
        self.logger = Logger(level="debug", stream=self.log_stream)

    def open(self, name="t", durable=True, **kw):
        kw.setdefault("max_bytes_per_file", 100)  # two 44-byte records per file
        cls = DurableDiskQueue if durable else DiskQueue
        return cls(name, self.path, logger=self.logger, **kw)

    def data(self, n, name="t"):
        return os.path.join(self.path, "%s.diskqueue.%06d.dat" % (name, n))

    def meta(self, name="t"):
        return os.path.join(self.path, "%s.diskqueue.meta.dat" % name)

    def read_meta(self, name="t"):
        with open(self.meta(name), "rb") as f:
            return f.read()

    def files(self):
        return sorted(os.listdir(self.path))

    def data_files(self):
        return [f for f in self.files() if f.startswith("t.diskqueue.0")]


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


def drain(q, n=1000):
    out = []
    while True:
        got = q.get(n)
        if not got:
            return out
        out.extend(got)


class FsyncWrapper:
    """Replaces os.fsync: records what was fsynced ("dir"/"file"), can fail, can hold one call."""

    def __init__(self, monkeypatch):
        self.real = os.fsync
        self.calls = []
        self.fail = None  # errno to raise for regular files
        self._hold = False
        self._lock = threading.Lock()
        self.entered = threading.Event()
        self.release = threading.Event()
        monkeypatch.setattr(os, "fsync", self)

    def hold_next(self):
        """The next fsync of a regular file blocks until ``release`` is set."""
        with self._lock:
            self._hold = True

    def __call__(self, fd):
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        with self._lock:
            self.calls.append(kind)
            hold = self._hold and kind == "file"
            if hold:
                self._hold = False
        if kind == "file" and self.fail is not None:
            raise OSError(self.fail, os.strerror(self.fail))
        if hold:
            self.entered.set()
            assert self.release.wait(JOIN)
        return self.real(fd)


def run_threads(targets):
    """Start threads, join them (bounded); re-raise the first exception of any."""
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: B902 - reported to the test
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(fn), name="test-%s" % getattr(fn, "__name__", "worker"), daemon=True)
               for fn in targets]
    for t in threads:
        t.start()
    return threads, errors


def join_all(threads, errors):
    for t in threads:
        t.join(JOIN)
        assert not t.is_alive(), "thread did not finish"
    if errors:
        raise errors[0]
