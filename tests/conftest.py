import threading

import pytest

from nsqd_threaded import NSQD, Options
from nsqd_threaded.internal.logger import Logger
from nsqd_threaded.lookupd import NSQLookupd

from support.logs import LogCapture


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


@pytest.fixture
def make_lookupd():
    """Factory of started lookupds on 127.0.0.1 ephemeral ports; all stopped (threads joined) at teardown.

    ``lookupd.log_text()`` is what one has logged (at debug) so far.
    """
    started = []

    def make(**overrides):
        capture = LogCapture()
        lookupd = NSQLookupd.local(logger=Logger("[nsqlookupd] ", "debug", capture), **overrides)
        lookupd.log_text = capture.getvalue  # what it logged so far
        lookupd.start()
        started.append(lookupd)
        return lookupd

    yield make
    for lookupd in started:
        lookupd.stop()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("nsqlookupd")]


@pytest.fixture
def lookupd(make_lookupd):
    return make_lookupd()
