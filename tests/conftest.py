import faulthandler
import os
import signal
import threading

import pytest

from nsqd_threaded import NSQD, Options
from nsqd_threaded.internal.logger import Logger
from nsqd_threaded.lookupd import NSQLookupd

from support.logs import LogCapture
from support.threads import ThreadWatch, leak_message, record_starts

THREADS = ThreadWatch()
record_starts()  # a leaked thread's failure says where it was started


def pytest_configure(config):
    """``NSQD_TEST_STACKS=FILE`` (set by scripts/bounded.py): SIGUSR1 writes every thread's stack there,
    which is how a hung or over-budget run shows where it was before it is killed."""
    path = os.environ.get("NSQD_TEST_STACKS")
    if path:
        config._nsqd_stacks = open(path, "w")  # kept open: faulthandler writes to its descriptor
        faulthandler.register(signal.SIGUSR1, file=config._nsqd_stacks, all_threads=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Threads started while a module- or session-scoped fixture is set up are that fixture's."""
    if fixturedef.scope not in ("module", "session"):
        yield
        return
    before = set(threading.enumerate())
    yield
    THREADS.owned[fixturedef.scope] |= set(threading.enumerate()) - before
    if fixturedef.scope == "module" and fixturedef.argname != "_module_threads":
        THREADS.module_daemons = True  # (until the module ends: its daemons may start threads lazily)


@pytest.fixture(scope="module", autouse=True)
def _module_threads(request):
    """The threads a module's tests left while its module-scoped fixtures ran end with the module."""
    before = set(threading.enumerate())
    yield
    # (torn down after the module's other module-scoped fixtures: autouse ones are set up first)
    THREADS.owned["module"].clear()
    THREADS.module_daemons = False
    suspects = THREADS.deferred
    THREADS.deferred = set()
    if suspects:
        left = [t for t in THREADS.lingering(before, "module") if t in suspects]
        if left:
            pytest.fail(leak_message(left, "started by tests of %s" % request.module.__name__), pytrace=False)


@pytest.fixture(autouse=True)
def _test_threads(request):
    """A test that leaves a thread running fails in its teardown, naming the thread."""
    before = set(threading.enumerate())
    yield
    defs = request.node._fixtureinfo.name2fixturedefs
    if any(defs[name][-1].scope in ("class", "module", "package") for name in request.fixturenames
           if name in defs and name != "_module_threads"):
        # A module-scoped daemon may keep threads between tests (started lazily, serving a connection the
        # next test reuses): what this test left is checked at the module's end, with the grace there.
        THREADS.deferred.update(THREADS.lingering(before, "function", grace=0))
        return
    left = THREADS.lingering(before, "function")
    if any(defs[name][-1].scope == "session" for name in request.fixturenames if name in defs):
        # A session-scoped daemon (a SparkSession's py4j gateway) starts daemon threads lazily, and keeps
        # them as long as it lives: they end with the process.
        left = [t for t in left if not t.daemon]
    elif THREADS.module_daemons:
        # A module-scoped fixture's daemon (another test's) may start a daemon thread lazily while this
        # test runs (a listener's idle-connection watcher): daemon threads are checked at the module's end.
        THREADS.deferred.update(t for t in left if t.daemon)
        left = [t for t in left if not t.daemon]
    if left:
        pytest.fail(leak_message(left, "started by this test"), pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    """Whatever is still running when the session ends is named, and fails the run: a non-daemon thread
    would keep the process alive after the summary."""
    left = [t for t in THREADS.lingering(set(), "session") if not t.daemon]  # (daemon ones end with the process)
    if left:
        session.config._nsqd_leaked = leak_message(left, "at the end of the session")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    leaked = getattr(config, "_nsqd_leaked", None)
    if leaked:
        terminalreporter.write_sep("=", "threads left running", red=True)
        terminalreporter.write_line(leaked)


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
        # NSQD_TEST_CONNECTION_THREADS=1 runs the suite with a thread per connection (scripts/test does
        # for one runtime), the model of hosts without epoll.
        kwargs.setdefault("connection_threads", os.environ.get("NSQD_TEST_CONNECTION_THREADS") == "1")
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
