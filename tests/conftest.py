import io
import threading

import pytest

from nsqd_threaded import NSQD, Options


class LogCapture(io.StringIO):
    """A thread-safe log sink for a broker under test."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()

    def write(self, s):
        with self._lock:
            return super().write(s)


@pytest.fixture
def make_nsqd(tmp_path):
    """Factory: start brokers on ephemeral ports with their own data dirs; all stopped at teardown."""
    started = []

    def make(**kwargs):
        data = tmp_path / ("data%d" % len(started))
        data.mkdir()
        kwargs.setdefault("tcp_address", "127.0.0.1:0")
        kwargs.setdefault("http_address", "127.0.0.1:0")
        kwargs.setdefault("data_path", str(data))
        kwargs.setdefault("node_id", 1)
        nsqd = NSQD(Options(**kwargs), log_stream=LogCapture())
        nsqd.start()
        started.append(nsqd)
        return nsqd

    yield make
    for nsqd in started:
        nsqd.stop()


@pytest.fixture
def nsqd(make_nsqd):
    return make_nsqd()
