"""pytest plugin: real nsqd brokers as fixtures.

Registered through the ``pytest11`` entry point named after this module
(``nsqd_threaded.pytest_plugin``), so ``-p nsqd_threaded.pytest_plugin`` is harmless
when it is installed and enables it when it is not; ``-p no:nsqd_threaded.pytest_plugin``
disables it.

Fixtures:

* ``nsqd``: a fresh in-process broker for the test (:class:`~nsqd_threaded.testing.Broker`).
* ``nsqd_session``: one broker shared by the whole session.
* ``nsqd_factory``: ``nsqd_factory(*flags, **options)`` starts more brokers for the test.
* ``nsqd_process``: a broker in a child process
  (:class:`~nsqd_threaded.testing.BrokerProcess`), to ``kill()`` and ``restart()``.
* ``nsqlookupd``: an in-process nsqlookupd for the test (:class:`~nsqd_threaded.testing.Lookupd`);
  ``@pytest.mark.nsqlookupd(**overrides)`` sets its options (e.g. ``inactive_producer_timeout=1``).
* ``fault_proxy``: ``fault_proxy(target, **toxics)`` puts a
  :class:`~nsqd_threaded.testing.FaultProxy` in front of a broker (ours or Go's): the test
  gives ``proxy.addr`` to its clients and stalls, delays or cuts their connections; closed
  (every thread joined) at the end of the test.
* ``nsq_cluster``: a lookupd and brokers registered with it (:class:`~nsqd_threaded.testing.Cluster`,
  three in-process brokers unless ``@pytest.mark.nsq_cluster(n=2, processes=True)`` says otherwise;
  the brokers take the ``nsqd`` flags and options, the lookupd the ``nsqlookupd`` marker's).

Broker flags and options, later ones winning (keyword options over flags):
``nsqd_flags`` in the ini file, then ``--nsqd-flag=FLAG`` on the command line (these two
apply to every broker, the session one included), then the test's
``@pytest.mark.nsqd(*flags, **options)`` markers (module, class, then function), then
the arguments given to ``nsqd_factory``.

When a test fails, the log of each broker it used is attached to its report
("Captured nsqd log ..." sections, next to the captured output).
"""

import pytest

from .testing import Broker, BrokerProcess, Cluster, FaultProxy, Lookupd

_BROKERS = pytest.StashKey()  # item -> [(broker, log position at its start)]
_SESSION = pytest.StashKey()  # config -> the session broker
_SESSION_START = pytest.StashKey()  # item -> session broker's log position when the item began


def pytest_addoption(parser):
    group = parser.getgroup("nsqd", "nsqd-threaded test brokers")
    group.addoption(
        "--nsqd-flag",
        action="append",
        default=[],
        dest="nsqd_flags",
        metavar="FLAG",
        help="an nsqd flag for every broker the nsqd fixtures start (repeatable), "
        "e.g. --nsqd-flag=--mem-queue-size=100",
    )
    parser.addini("nsqd_flags", type="args", default=[], help="nsqd flags for every broker the nsqd fixtures start")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "nsqd(*flags, **options): nsqd flags (e.g. '--msg-timeout=1s') and Options fields "
        "(e.g. mem_queue_size=0) for the brokers of the nsqd, nsqd_factory, nsqd_process and nsq_cluster fixtures",
    )
    config.addinivalue_line(
        "markers", "nsqlookupd(**overrides): LookupdOptions fields for the nsqlookupd and nsq_cluster fixtures"
    )
    config.addinivalue_line(
        "markers", "nsq_cluster(n=3, processes=False): the size and kind of the nsq_cluster fixture's brokers"
    )


def _config_flags(config):
    return list(config.getini("nsqd_flags")) + list(config.getoption("nsqd_flags") or [])


def _marker_args(node):
    """Flags and options of the ``nsqd`` markers, farthest (module) first so the closest wins."""
    flags, options = [], {}
    for mark in reversed(list(node.iter_markers("nsqd"))):
        flags.extend(mark.args)
        options.update(mark.kwargs)
    return flags, options


def _track(node, broker, position=None):
    position = broker.log_position() if position is None else position
    node.stash.setdefault(_BROKERS, []).append((broker, position))


@pytest.fixture
def nsqd_factory(request):
    """``nsqd_factory(*flags, **options)``: start another in-process broker for this test."""
    started = []
    base_flags = _config_flags(request.config)
    marker_flags, marker_options = _marker_args(request.node)

    def factory(*flags, **options):
        all_flags = base_flags + marker_flags + list(flags)

        def make():
            broker = Broker(*all_flags, **dict(marker_options, **options))
            _track(request.node, broker)
            started.append(broker)
            return broker.start()

        return _start(all_flags, make)

    yield factory
    errors = []
    for broker in reversed(started):
        try:
            broker.stop()
        except Exception as e:  # stop the others anyway
            errors.append(e)
    if errors:
        raise errors[0]


@pytest.fixture
def nsqd(nsqd_factory):
    """A fresh broker for this test, on 127.0.0.1 ephemeral ports with a temporary data directory."""
    return nsqd_factory()


@pytest.fixture(scope="session")
def nsqd_session(request):
    """One broker for the whole session (ini and --nsqd-flag flags only; markers do not apply)."""
    flags = _config_flags(request.config)

    def make():
        broker = Broker(*flags)
        request.config.stash[_SESSION] = broker
        return broker.start()

    yield from _running(flags, make)


@pytest.fixture
def nsqd_process(request):
    """A broker in a child process (``nsqd-threaded``), ready when returned; stopped at the end."""
    marker_flags, marker_options = _marker_args(request.node)
    flags = _config_flags(request.config) + marker_flags

    def make():
        broker = BrokerProcess(*flags, **marker_options)
        _track(request.node, broker)
        return broker.start()

    yield from _running(flags, make)


@pytest.fixture
def fault_proxy():
    """``fault_proxy(target, **toxics)``: a started FaultProxy to ``target`` (``"host:port"`` or a tuple)."""
    proxies = []

    def factory(target, **toxics):
        proxy = FaultProxy(target, **toxics)
        proxies.append(proxy)
        return proxy.start()

    yield factory
    for proxy in reversed(proxies):
        proxy.close()


def _marker_kwargs(node, name):
    """The keyword arguments of every ``name`` marker on the test, the closest one winning."""
    kwargs = {}
    for mark in reversed(list(node.iter_markers(name))):
        kwargs.update(mark.kwargs)
    return kwargs


@pytest.fixture
def nsqlookupd(request):
    """An nsqlookupd on 127.0.0.1 ephemeral ports (broadcast address 127.0.0.1); stopped at the end."""
    lookupd = Lookupd(**_marker_kwargs(request.node, "nsqlookupd"))
    _track(request.node, lookupd)
    lookupd.start()
    try:
        yield lookupd
    finally:
        lookupd.stop()


@pytest.fixture
def nsq_cluster(request):
    """A lookupd and brokers registered with it (three in-process ones unless the nsq_cluster marker says)."""
    marker_flags, marker_options = _marker_args(request.node)
    flags = _config_flags(request.config) + marker_flags
    shape = _marker_kwargs(request.node, "nsq_cluster")
    cluster = Cluster(
        shape.get("n", 3), *flags, processes=shape.get("processes", False),
        lookupd=_marker_kwargs(request.node, "nsqlookupd"), **marker_options
    )
    _track(request.node, cluster.lookupd)

    def make():
        try:
            return cluster.start()
        finally:
            for broker in cluster.brokers:
                _track(request.node, broker, 0)

    yield from _running(flags, make)


def _running(flags, make):
    """A fixture's body (``yield from``): :func:`_start` it, yield it, stop it at the end."""
    started = _start(flags, make)
    try:
        yield started
    finally:
        started.stop()


def _start(flags, make):
    """``make()`` the broker; one that cannot start fails the test with one line, not a traceback."""
    try:
        return make()
    except (ValueError, OSError, RuntimeError) as e:
        error = e
    given = " (flags: %s)" % " ".join(flags) if flags else ""
    pytest.fail("nsqd did not start%s: %s: %s" % (given, type(error).__name__, error), pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    session_broker = item.config.stash.get(_SESSION, None)
    item.stash[_SESSION_START] = session_broker.log_position() if session_broker is not None else 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the log of each broker a failing test used to its report."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    logs = list(item.stash.get(_BROKERS, []))
    session_broker = item.config.stash.get(_SESSION, None)
    if session_broker is not None and "nsqd_session" in getattr(item, "fixturenames", ()):
        logs.append((session_broker, item.stash.get(_SESSION_START, 0)))
    for broker, start in logs:
        text = broker.log_since(start)
        if broker.tcp_addr is None and not text:
            continue  # never started: the error says why
        where = broker.tcp_addr or "not started"
        kind = getattr(broker, "log_name", "nsqd")
        report.sections.append(("Captured %s log %s (%s)" % (kind, report.when, where), text or "(nothing logged)\n"))
