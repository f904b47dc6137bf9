"""scripts/bench_compare.py (``scripts/bench --compare``): its parsing, and one phase against our broker.

Go's binaries are not needed: the phases run with this project's load scripts.
"""

import argparse
import importlib.util
import os
import socket
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def bench_compare():
    sys.path.insert(0, SCRIPTS)
    try:
        spec = importlib.util.spec_from_file_location("bench_compare", os.path.join(SCRIPTS, "bench_compare.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(SCRIPTS)


@pytest.mark.parametrize(
    "text, us",
    [("2.776206ms", 2776.206), ("109.5µs", 109.5), ("850ns", 0.85), ("1.5s", 1.5e6), ("1m2s", 62e6)],
)
def test_go_durations_in_microseconds(bench_compare, text, us):
    assert bench_compare.go_duration_us(text) == pytest.approx(us)


def test_the_listening_address_of_a_process_comes_from_proc(bench_compare):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert bench_compare.listening_address(os.getpid()) == "127.0.0.1:%d" % listener.getsockname()[1]


def test_cpu_seconds_of_this_process(bench_compare):
    assert bench_compare.cpu_seconds(os.getpid()) > 0


def test_phases_run_against_our_broker_with_our_tools(bench_compare):
    a = argparse.Namespace(runfor=0.5, count=2000, rtt_count=50, phases=["rtt", "memory"])
    tools = bench_compare.OurTools()
    rtt = bench_compare.run_phase("rtt", "ours", sys.executable, bench_compare.ROOT, tools, a)
    assert rtt["rtt"] > 0
    memory = bench_compare.run_phase("memory", "ours", sys.executable, bench_compare.ROOT, tools, a)
    assert "memory" in memory
