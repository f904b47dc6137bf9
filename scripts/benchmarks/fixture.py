"""How long the test fixtures take to start and stop a broker.

Three measurements, each printed as median / p90 / max in milliseconds:

1. ``Broker().start()`` and ``.stop()`` from nsqd_threaded.testing, N cycles in one process
   (start includes making the temporary data directory, stop includes removing it);
2. the pytest plugin's ``nsqd`` fixture: a generated test file with N tests that each ask for
   it, run in-process by pytest; the fixture's share of each test's setup and teardown is timed
   from inside the fixture chain (pytest's own per-test overhead is reported separately);
3. ``BrokerProcess`` (a child ``nsqd-threaded``, forked by the fork server), fewer cycles: start =
   fork until it listens, stop = SIGTERM until reaped; then Go's nsqd the same way
   (``BrokerProcess(command=[go_nsqd])``) when its binary is found, side by side: the median of
   ``--process`` cycles after a first one, with the CPU time of this process and of the broker's.

The goal is a median under 50 ms for the first two.  ``--check`` exits 1 if it is missed.
"""

import argparse
import os
import platform
import resource
import statistics
import sys
import tempfile
import textwrap
import time

from nsqd_threaded.testing import Broker, BrokerProcess

GOAL_MS = 50.0


def summary(name, samples):
    ms = sorted(s * 1000 for s in samples)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    print("%-34s n=%-4d median %7.2f ms   p90 %7.2f ms   max %7.2f ms" % (name, len(ms), statistics.median(ms), p90, ms[-1]))
    return statistics.median(ms)


def bench_broker(n):
    Broker().start().stop()  # imports and first-use caches
    starts, stops = [], []
    for _ in range(n):
        broker = Broker()
        t0 = time.perf_counter()
        broker.start()
        t1 = time.perf_counter()
        broker.stop()
        t2 = time.perf_counter()
        starts.append(t1 - t0)
        stops.append(t2 - t1)
    return summary("Broker.start()", starts), summary("Broker.stop()", stops)


_TIMING_CONFTEST = '''
import time
import pytest

TIMES = {"start": [], "stop": []}


@pytest.fixture
def timed_nsqd(request):
    # Times the plugin's nsqd fixture: its setup runs between our two clock readings.
    t0 = time.perf_counter()
    broker = request.getfixturevalue("nsqd")
    TIMES["start"].append(time.perf_counter() - t0)
    yield broker


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    t0 = time.perf_counter()
    yield
    TIMES["stop"].append(time.perf_counter() - t0)
'''


def bench_plugin(n):
    import pytest

    with tempfile.TemporaryDirectory(prefix="bench-fixture-") as root:
        with open(os.path.join(root, "conftest.py"), "w") as f:
            f.write(_TIMING_CONFTEST)
        with open(os.path.join(root, "test_many.py"), "w") as f:
            f.write(
                textwrap.dedent(
                    """
                    import pytest

                    @pytest.mark.parametrize("i", range(%d))
                    def test_uses_a_fresh_broker(timed_nsqd, i):
                        assert timed_nsqd.running
                    """
                    % (n + 1)
                )
            )
        sys.path.insert(0, root)
        try:
            code = pytest.main(
                [root, "-q", "-p", "no:cacheprovider", "-p", "nsqd_threaded.pytest_plugin", "--no-header", "-o", "addopts="],
            )
            import conftest  # the timing conftest pytest just used

            times = conftest.TIMES
        finally:
            sys.path.remove(root)
            sys.modules.pop("conftest", None)
    if code != 0:
        raise SystemExit("the fixture benchmark's tests failed (exit %s)" % code)
    # Drop the first test: it pays for imports.
    start = summary("nsqd fixture setup", times["start"][1:])
    stop = summary("test teardown (nsqd fixture stop)", times["stop"][1:])
    return start, stop


def one_cycle(command):
    """Start and stop one ``BrokerProcess``: (start, stop, this process's CPU, the broker's CPU) in seconds.

    The broker's CPU: for a forked one the fork server reports it; for an exec'd one it is this
    process's reaped-children total."""
    broker = BrokerProcess(command=command)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    broker.start()
    t1 = time.perf_counter()
    broker.stop()
    t2 = time.perf_counter()
    cpu = time.process_time() - cpu0
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = getattr(broker.proc, "cpu_seconds", None)
    if child is None:
        child = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
    return t1 - t0, t2 - t1, cpu, child


def bench_process(n, brokers):
    """``n`` start/stop cycles of each of ``brokers`` (``[(name, command or None)]``), alternately
    (one of each in turn, so a change in the machine's load touches all alike), after a first one
    each (which starts the fork server, when there is one).  Returns the start+stop medians."""
    samples = {name: [] for name, _ in brokers}
    for i in range(n + 1):
        for name, command in brokers:
            cycle = one_cycle(command)
            if i:
                samples[name].append(cycle)
    medians = []
    for name, _ in brokers:
        starts, stops, own_cpu, child_cpu = zip(*samples[name])
        summary(name + ".start()", starts)
        summary(name + ".stop()", stops)
        medians.append(summary(name + " start+stop", [a + b for a, b in zip(starts, stops)]))
        summary("  CPU: this process", own_cpu)
        summary("  CPU: the broker process", child_cpu)
    return medians


def go_nsqd(directory):
    """Go's nsqd in ``directory`` (``--go``, else $NSQ_GO_BIN, else the reference location), or None."""
    directory = directory or os.environ.get("NSQ_GO_BIN", "/work/shared/reference/go-nsq-1.3.0")
    path = os.path.join(directory, "nsqd")
    return path if os.access(path, os.X_OK) else None


def bench_processes(args):
    go = go_nsqd(args.go)
    brokers = [("BrokerProcess", None)]
    if go is not None:
        brokers.append(("BrokerProcess(go)", [go]))
    print("child-process brokers, median of %d after the first: BrokerProcess (forked by the fork server)%s"
          % (args.process, ", alternately with Go's nsqd (BrokerProcess(command=[%s]))" % go if go else ""))
    medians = bench_process(args.process, brokers)
    if go is None:
        print("\n(Go's nsqd not found: --go DIR or $NSQ_GO_BIN for the comparison)")
        return
    print("\nstart+stop: ours %.2f ms, Go's %.2f ms: %.2fx" % (medians[0], medians[1], medians[0] / medians[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="in-process cycles and fixture tests (default 200)")
    parser.add_argument("--process", type=int, default=10, help="child-process cycles (default 10; 0 to skip)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a median is %g ms or more" % GOAL_MS)
    parser.add_argument("--go", help="directory of Go's nsqd, for the child-process comparison (default: $NSQ_GO_BIN)")
    parser.add_argument("--process-only", action="store_true", help="only the child-process brokers")
    args = parser.parse_args()
    print("load average %.2f %.2f %.2f, %d CPUs, %s %s\n" % (os.getloadavg() + (os.cpu_count(),) + (
        platform.python_implementation(), platform.python_version())))
    if args.process_only:
        bench_processes(args)
        return

    print("in-process broker (nsqd_threaded.testing.Broker)")
    medians = list(bench_broker(args.n))
    print("\npytest plugin fixture `nsqd` (pytest run in-process)")
    medians += bench_plugin(args.n)
    if args.process:
        print()
        bench_processes(args)
    ok = all(m < GOAL_MS for m in medians)
    print("\nfixture start/stop medians %s the %g ms goal" % ("meet" if ok else "MISS", GOAL_MS))
    if args.check and not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
