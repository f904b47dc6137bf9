"""Helpers of the DiskQueue tests: Go-format records, messages, and an Env owning a queue's directory."""

import io
import os
import struct

import pytest

from nsqd_threaded.internal.logger import Logger
from nsqd_threaded.storage.diskqueue import DiskQueue
from nsqd_threaded.wire.message import Message

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


TS = 0x18EA4C4C68FDBFED  # the timestamp of the spec's verified record


def go_record(msg_id, body, timestamp=TS, attempts=0):
    """A record assembled from the spec's table (§3), independently of our encoder."""
    payload = struct.pack(">q", timestamp) + struct.pack(">H", attempts) + msg_id + body
    return struct.pack(">i", len(payload)) + payload


def mid(i):
    return b"%016x" % i


def msg(i, body=b"x" * 14, attempts=0, deferred_ns=0):
    """Body of 14 bytes -> a 44-byte record (4 + 26 + 14), as in the spec's roll example."""
    return Message(mid(i), body, TS + i, attempts, deferred_ns)


class Env:
    def __init__(self, path):
        self.path = path
        self.log_stream = io.StringIO()
        self.logger = Logger(level="debug", stream=self.log_stream)

    def open(self, name="t", **kw):
        kw.setdefault("max_bytes_per_file", 100)
        kw.setdefault("min_msg_size", 26)
        kw.setdefault("max_msg_size", 1024 * 1024 + 26)
        kw.setdefault("sync_every", 2500)
        kw.setdefault("sync_timeout", 2.0)
        return DiskQueue(name, str(self.path), logger=self.logger, **kw)

    def data(self, n, name="t"):
        return os.path.join(str(self.path), "%s.diskqueue.%06d.dat" % (name, n))

    def meta(self, name="t"):
        return os.path.join(str(self.path), "%s.diskqueue.meta.dat" % name)

    def read(self, path):
        with open(path, "rb") as f:
            return f.read()

    def write(self, path, data):
        with open(path, "wb") as f:
            f.write(data)

    def files(self):
        return sorted(os.listdir(str(self.path)))

    @property
    def log(self):
        return self.log_stream.getvalue()


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


def ids(msgs):
    return [m.id for m in msgs]
