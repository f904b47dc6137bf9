"""scripts/benchmarks (``scripts/bench --compare``): its parsing, /proc readings, the floor probe, and phases
against our broker.

Go's binaries are not needed: the phases run with this project's load scripts.
"""

import argparse
import importlib
import os
import socket
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def benchmarks():
    sys.path.insert(0, SCRIPTS)
    try:
        yield importlib.import_module("benchmarks")
    finally:
        sys.path.remove(SCRIPTS)


@pytest.fixture(scope="module")
def bench_compare(benchmarks):
    return importlib.import_module("benchmarks.compare")


@pytest.fixture(scope="module")
def common(benchmarks):
    return importlib.import_module("benchmarks.common")


@pytest.fixture(scope="module")
def tools(benchmarks):
    return importlib.import_module("benchmarks.tools")


@pytest.mark.parametrize(
    "text, us",
    [("2.776206ms", 2776.206), ("109.5µs", 109.5), ("850ns", 0.85), ("1.5s", 1.5e6), ("1m2s", 62e6)],
)
def test_go_durations_in_microseconds(tools, text, us):
    assert tools.go_duration_us(text) == pytest.approx(us)


def test_the_listening_address_of_a_process_comes_from_proc(common):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert common.listening_address(os.getpid()) == "127.0.0.1:%d" % listener.getsockname()[1]


def test_cpu_seconds_of_this_process(common):
    assert common.cpu_seconds(os.getpid()) > 0


def test_the_quiet_check_reads_the_load_and_the_cpu_of_others(common):
    quiet = common.Quiet(max_load=1e9, max_others=1e9, window=0.2)
    assert quiet.check()
    (load, others), = quiet.readings
    assert load >= 0 and 0 <= others <= os.cpu_count() + 0.5
    assert not common.Quiet(max_load=-1.0).start_is_quiet()


def test_phases_run_against_our_broker_with_our_tools(bench_compare, tools):
    a = argparse.Namespace(runfor=0.5, count=2000, rtt_count=50, phases=["rtt", "memory"], warmup=0.05)
    ours = tools.OurTools()
    rtt = bench_compare.run_phase("rtt", "ours", sys.executable, bench_compare.ROOT, ours, a)
    assert rtt["rtt"] > 0 and rtt["rtt-cpu"] >= 0
    memory = bench_compare.run_phase("memory", "ours", sys.executable, bench_compare.ROOT, ours, a)
    assert "memory" in memory


def test_the_floor_probe_answers_pub_and_delivers_to_the_subscriber(bench_compare, tools):
    a = argparse.Namespace(runfor=0.5, count=2000, rtt_count=50, phases=["pub-mem", "rtt"], warmup=0.0)
    ours = tools.OurTools()
    rtt = bench_compare.run_phase("rtt", "floor", sys.executable, None, ours, a)
    assert rtt["rtt"] > 0
    pub = bench_compare.run_phase("pub-mem", "floor", sys.executable, None, ours, a)
    assert pub["pub-mem"] > 0 and pub["pub-mem-cpu"] > 0


def test_scripts_bench_dispatches_to_a_benchmark():
    # What scripts/bench runs (with .venv's interpreter there).
    env = dict(os.environ, PYTHONPATH=SCRIPTS)
    out = subprocess.run([sys.executable, "-m", "benchmarks", "floor", "--help"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "floor" in out.stdout
