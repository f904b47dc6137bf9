"""How long the test fixtures take to start and stop a broker.

Three measurements, each printed as median / p90 / max in milliseconds:

1. ``Broker().start()`` and ``.stop()`` from nsqd_threaded.testing, N cycles in one process
   (start includes making the temporary data directory, stop includes removing it);
2. the pytest plugin's ``nsqd`` fixture: a generated test file with N tests that each ask for
   it, run in-process by pytest; the fixture's share of each test's setup and teardown is timed
   from inside the fixture chain (pytest's own per-test overhead is reported separately);
3. ``BrokerProcess`` (a child ``nsqd-threaded``), fewer cycles: start = spawn until it listens.

The goal is a median under 50 ms for the first two.  ``--check`` exits 1 if it is missed.
"""

import argparse
import os
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


def bench_process(n):
    starts, stops = [], []
    for _ in range(n):
        broker = BrokerProcess()
        t0 = time.perf_counter()
        broker.start()
        t1 = time.perf_counter()
        broker.stop()
        t2 = time.perf_counter()
        starts.append(t1 - t0)
        stops.append(t2 - t1)
    summary("BrokerProcess.start() (spawn)", starts)
    summary("BrokerProcess.stop() (SIGTERM)", stops)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="in-process cycles and fixture tests (default 200)")
    parser.add_argument("--process", type=int, default=10, help="child-process cycles (default 10; 0 to skip)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a median is %g ms or more" % GOAL_MS)
    args = parser.parse_args()

    print("in-process broker (nsqd_threaded.testing.Broker)")
    medians = list(bench_broker(args.n))
    print("\npytest plugin fixture `nsqd` (pytest run in-process)")
    medians += bench_plugin(args.n)
    if args.process:
        print("\nchild-process broker (nsqd_threaded.testing.BrokerProcess)")
        bench_process(args.process)
    ok = all(m < GOAL_MS for m in medians)
    print("\nfixture start/stop medians %s the %g ms goal" % ("meet" if ok else "MISS", GOAL_MS))
    if args.check and not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
