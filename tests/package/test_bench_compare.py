"""scripts/benchmarks (``scripts/bench --compare``): its parsing, /proc readings, the floor probe, and phases
against our broker; ``scripts/bench consumers`` against the many-consumers floor.

Go's binaries are not needed: the phases run with this project's load scripts.
"""

import argparse
import importlib
import os
import shutil
import socket
import struct
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


@pytest.fixture(scope="module")
def consumers(benchmarks):
    return importlib.import_module("benchmarks.consumers")


@pytest.mark.parametrize(
    "text, us",
    [("2.776206ms", 2776.206), ("109.5µs", 109.5), ("850ns", 0.85), ("1.5s", 1.5e6), ("1m2s", 62e6)],
)
def test_go_durations_in_microseconds(tools, text, us):
    assert tools.go_duration_us(text) == pytest.approx(us)


def test_the_listening_address_of_a_process_comes_from_proc(common):
    # A child with exactly one listener: this process may hold others (PySpark's gateway, for one).
    child = subprocess.Popen(
        [sys.executable, "-c", "import socket,sys\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
         "print(s.getsockname()[1], flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        assert common.listening_address(child.pid) == "127.0.0.1:%d" % port
        assert common.listening_address(child.pid, exclude="127.0.0.1:%d" % port) is None
    finally:
        child.stdin.close()
        child.wait(timeout=10)


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


def test_mpub_into_a_channel_stays_in_memory_and_is_measured(bench_compare, tools):
    a = argparse.Namespace(runfor=0.6, count=2000, rtt_count=50, phases=["mpub-chan"], warmup=0.3)
    out = bench_compare.run_phase("mpub-chan", "ours", sys.executable, bench_compare.ROOT, tools.OurTools(), a)
    assert out["mpub-chan"] > 0 and out["mpub-chan-cpu"] > 0
    assert out["mpub-chan-spilled"] == 0


def test_mpub_into_a_channel_comes_in_segments_that_fit_the_memory_queue(bench_compare, common, tools):
    # At the rate the previous segment measured, each fills at most MPUB_CHAN_FILL of the memory
    # queue; the channel holds one segment's messages at a time.
    class Recording(tools.OurTools):
        def __init__(self, broker):
            self.broker = broker
            self.segments = []  # (seconds, messages in the channel before the segment)

        def mpub(self, address, topic, runfor):
            stats = self.broker.stats(topic)
            self.segments.append((runfor, stats["channels"][0]["depth"]))
            # A tenth of a second of real load: the plan is under test, not the broker's speed (a broker
            # taking over 2,000,000 msg/s would fill the memory queue in a whole minimum segment).
            assert super().mpub(address, topic, min(runfor, 0.1)) > 0
            return 2 * bench_compare.MPUB_CHAN_MEM_QUEUE  # then as if the broker took 2,000,000 msg/s

    flags = ["--mem-queue-size=%d" % bench_compare.MPUB_CHAN_MEM_QUEUE]
    with common.BrokerProc("ours", sys.executable, flags, http=True) as broker:
        load = Recording(broker)
        sent, cpu, spilled, rate = bench_compare.mpub_into_channel(broker, load, "segments", 1.0)
        assert [c["channel_name"] for c in broker.stats("segments")["channels"]] == ["ch"]
    longest = bench_compare.MPUB_CHAN_FILL * bench_compare.MPUB_CHAN_MEM_QUEUE / rate
    first = bench_compare.MPUB_CHAN_FILL * bench_compare.MPUB_CHAN_MEM_QUEUE / bench_compare.MPUB_CHAN_FIRST_RATE
    assert load.segments[0][0] <= first + 1e-9
    assert all(t <= max(longest, bench_compare.MPUB_CHAN_MIN_SEGMENT) + 1e-9 for t, _ in load.segments[1:])
    assert sum(t for t, _ in load.segments) == pytest.approx(1.0)
    assert len(load.segments) >= 2 and all(depth == 0 for _, depth in load.segments)  # emptied in between
    assert sent == pytest.approx(2 * bench_compare.MPUB_CHAN_MEM_QUEUE * 1.0) and spilled == 0 and cpu >= 0


def test_the_table_has_a_row_for_each_phase(bench_compare, capsys):
    a = argparse.Namespace(python=sys.executable, rounds=1, runfor=1.0, warmup=0.0, baseline=None, floor=False)
    samples = {"go": {"mpub-chan": [1000.0], "mpub-chan-cpu": [1.0], "mpub-chan-spilled": [0]},
               "ours": {"mpub-chan": [800.0], "mpub-chan-cpu": [2.0], "mpub-chan-spilled": [5]}}
    bench_compare.print_table(a, "nsqd", argparse.Namespace(name="tools"), argparse.Namespace(
        summary=lambda: "quiet"), samples, set())
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| MPUB, batches of 200, one channel"))
    assert "| 0.80 |" in row
    assert "spilled to disk" in out
    assert "mpub-chan" in bench_compare.PHASES


def _frame(sock):
    """One frame from a blocking socket: (frame type, data)."""
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = sock.recv(4 if len(data) < 4 else 4 + int.from_bytes(data[:4], "big") - len(data))
        assert chunk, "the floor closed the connection"
        data += chunk
    return struct.unpack(">i", data[4:8])[0], data[8:]


def test_the_consumers_floor_deals_in_turn_to_the_subscribers_with_credit(common, consumers):
    with common.BrokerProc("floor-consumers", sys.executable) as floor:
        host, port = floor.address.rsplit(":", 1)
        subscribers = []
        for _ in range(2):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", 2) + b"{}" + b"SUB t ch\nRDY 1\n")
            assert _frame(sock) == (0, b"OK") and _frame(sock) == (0, b"OK")
            subscribers.append(sock)
        assert consumers.client_count(floor) == 2
        pub = socket.create_connection((host, int(port)), timeout=10)
        batch = struct.pack(">i", 3) + b"".join(struct.pack(">i", len(body)) + body for body in (b"a", b"bb", b"ccc"))
        pub.sendall(b"  V2MPUB t\n" + struct.pack(">i", len(batch)) + batch)
        assert _frame(pub) == (0, b"OK")
        (ta, a), (tb, b) = _frame(subscribers[0]), _frame(subscribers[1])
        assert ta == tb == 2 and {a[26:], b[26:]} == {b"a", b"bb"}  # one each, RDY 1
        subscribers[1].sendall(b"FIN " + b[10:26] + b"\n")
        assert _frame(subscribers[1])[1][26:] == b"ccc"  # to the one with credit again
        pub.sendall(b"PUB t\n" + struct.pack(">i", 4) + b"dddd")
        assert _frame(pub) == (0, b"OK")
        subscribers[0].sendall(b"NOP\nFIN " + a[10:26] + b"\n")
        assert _frame(subscribers[0])[1][26:] == b"dddd"
        for sock in subscribers + [pub]:
            sock.close()
        assert consumers.wait(lambda: consumers.client_count(floor) == 0, 10)


def test_scripts_bench_consumers_measures_the_floor(common, consumers, monkeypatch):
    monkeypatch.setattr(consumers, "IDLE_SECONDS", 0.1)
    with common.BrokerProc("floor-consumers", sys.executable) as floor:
        figures = consumers.run_once(floor, 20, 1, 1, 1000)  # (raises unless every message arrives)
        assert consumers.client_count(floor) == 0
    assert figures["rate"] > 0 and figures["cpu_us"] >= 0 and figures["threads"] == 1
    assert figures["switches"] >= 0
    # (clock ticks over a span of a few ticks: zero is possible, and a count above the host's)
    assert figures["clients_us"] >= 0 and 0 <= figures["host_cores"] <= 2 * os.cpu_count()
    assert {key for _, key, _ in consumers.FIGURES} - {"instructions", "sub_instructions"} <= set(figures)
    assert figures["subscribe_s"] > 0  # (the clients' stamp of the last OK, after the start)


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                    reason="valgrind is not installed")
@pytest.mark.timeout(300)
def test_scripts_bench_consumers_counts_instructions_under_callgrind(common, consumers, tmp_path):
    out = str(tmp_path / "callgrind.out")
    wrapper = ["valgrind", "--tool=callgrind", "--compress-strings=no", "--callgrind-out-file=" + out]
    with common.BrokerProc("floor-consumers", sys.executable, wrapper=wrapper) as floor:
        figures = consumers.run_once(floor, 10, 1, 1, 400, out)
    # (the floor's own work per message: a few thousand instructions of the interpreter at least)
    assert 1000 < figures["instructions"] < 10 ** 7
    assert 1000 < figures["sub_instructions"] < 10 ** 8  # (each subscribed consumer's, counted apart)
