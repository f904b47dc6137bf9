import os
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


def pytest_collection_modifyitems(config, items):
    """``NSQD_TEST_SHARD=K/N`` (set by scripts/test): keep the K-th of N shards of the collected tests.

    A shard is whole test files, every N-th in path order from the K-th, so that each directory's
    files (browser pages, clusters, codecs) are spread over the shards and their times come out close;
    a file's module-scoped fixtures are set up once.  Unset, every test runs.
    """
    shard = os.environ.get("NSQD_TEST_SHARD")
    if not shard:
        return
    k, n = (int(part) for part in shard.split("/"))
    if not 1 <= k <= n:
        raise pytest.UsageError("NSQD_TEST_SHARD=%s: want K/N with 1 <= K <= N" % shard)
    files = sorted({item.nodeid.split("::", 1)[0] for item in items})
    mine = set(files[k - 1::n])
    kept = [item for item in items if item.nodeid.split("::", 1)[0] in mine]
    dropped = [item for item in items if item.nodeid.split("::", 1)[0] not in mine]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """``NSQD_TEST_CPU_LOG=FILE``: append each test's wall and CPU seconds (this process's threads,
    and its children waited for meanwhile) to FILE, a line each: what makes the suite's time, found."""
    path = os.environ.get("NSQD_TEST_CPU_LOG")
    if not path:
        yield
        return
    import resource
    import time

    def cpu():
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    wall, used = time.monotonic(), cpu()
    yield
    with open(path, "a") as f:
        f.write("%.2f %.2f %s\n" % (time.monotonic() - wall, cpu() - used, item.nodeid))
