"""The process tuning (internal/process.py): the command's gc threshold."""

import gc
import platform
import socket
import struct
import threading
import urllib.request

import pytest

from nsqd_threaded.internal import process
from nsqd_threaded.testing import Broker

from support.core import make_owner, wait_until

pytestmark = pytest.mark.timeout(30)

CPYTHON = platform.python_implementation() == "CPython"


@pytest.fixture
def gc_threshold():
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


@pytest.mark.skipif(not CPYTHON, reason="the gc thresholds are CPython's")
def test_tune_raises_only_the_youngest_generation_threshold(gc_threshold):
    gc.set_threshold(700, 10, 10)
    process.tune_gc()
    assert gc.get_threshold() == (process.GC_GEN0_THRESHOLD, 10, 10)
    gc.set_threshold(process.GC_GEN0_THRESHOLD * 2, 3, 4)  # higher already: kept
    process.tune_gc()
    assert gc.get_threshold() == (process.GC_GEN0_THRESHOLD * 2, 3, 4)
    gc.set_threshold(0, 10, 10)  # automatic collection off: stays off
    process.tune_gc()
    assert gc.get_threshold() == (0, 10, 10)


@pytest.mark.skipif(not CPYTHON, reason="the gc thresholds are CPython's")
def test_an_embedded_broker_leaves_the_settings_alone(gc_threshold, tmp_path):
    """Only the command tunes: an embedded NSQD changes nothing process-wide."""
    gc.set_threshold(700, 10, 10)
    nsqd = make_owner(tmp_path / "data")
    try:
        nsqd.start()
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        nsqd.stop()


def _recv_frames(sock, count):
    """The next ``count`` frames' (type, data) off a raw V2 connection."""
    frames, pending = [], b""
    while len(frames) < count:
        while len(pending) < 4 or len(pending) < 4 + struct.unpack(">i", pending[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "the broker closed the connection"
            pending += chunk
        size = struct.unpack(">i", pending[:4])[0]
        frames.append((struct.unpack(">i", pending[4:8])[0], pending[8:4 + size]))
        pending = pending[4 + size:]
    return frames


def _broker_connection_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith(("nsqd-conn[", "nsqd-client-pump[", "nsqd-http["))]


@pytest.mark.skipif(not CPYTHON, reason="counts what CPython's cyclic collector finds")
def test_the_broker_leaves_no_reference_cycles_behind_its_connections():
    """What the command's high gc threshold rests on: publishing, subscribing (IDENTIFY, SUB,
    RDY, FIN, REQ, TOUCH), closing, and HTTP requests leave nothing that only the cyclic
    collector would free, however many connections come and go."""
    rounds = 40
    with Broker() as broker:
        http = "http://%s:%d" % tuple(broker.http_address)
        body = b'{"feature_negotiation": true, "heartbeat_interval": 1000}'
        identify = b"IDENTIFY\n" + struct.pack(">i", len(body)) + body

        def one_round():
            with socket.create_connection(broker.tcp_address, timeout=10) as pub:
                pub.sendall(b"  V2" + b"PUB orders\n" + struct.pack(">i", 2) + b"x1" + b"MPUB orders\n"
                            + struct.pack(">ii", 4 + 2 * (4 + 2), 2) + struct.pack(">i", 2) + b"x2"
                            + struct.pack(">i", 2) + b"x3")
                assert [f[1] for f in _recv_frames(pub, 2)] == [b"OK", b"OK"]
            with socket.create_connection(broker.tcp_address, timeout=10) as sub:
                sub.sendall(b"  V2" + identify + b"SUB orders audit\nRDY 3\n")
                frames = _recv_frames(sub, 5)  # IDENTIFY's answer, SUB's OK, three messages
                ids = [data[10:26] for kind, data in frames if kind == 2]
                assert len(ids) == 3
                sub.sendall(b"TOUCH " + ids[0] + b"\nFIN " + ids[0] + b"\nFIN " + ids[1] + b"\nREQ " + ids[2] + b" 0\n")
                assert _recv_frames(sub, 1)[0][0] == 2  # the requeued one, again
            urllib.request.urlopen(http + "/stats?format=json", timeout=10).read()
            urllib.request.urlopen(urllib.request.Request(http + "/pub?topic=orders", data=b"x4"), timeout=10).read()
            with socket.create_connection(broker.tcp_address, timeout=10) as sub:
                sub.sendall(b"  V2SUB orders audit\nRDY 10\n")
                frames = _recv_frames(sub, 3)  # OK, the requeued x3 and x4 (x1, x2 were FINed)
                sub.sendall(b"".join(b"FIN " + data[10:26] + b"\n" for kind, data in frames if kind == 2))
                sub.sendall(b"CLS\n")
                assert (0, b"CLOSE_WAIT") in _recv_frames(sub, 1)

        one_round()  # the topic, the channel and everything made once
        wait_until(lambda: not _broker_connection_threads(), what="the first round's connections to end")
        gc.collect()
        enabled = gc.isenabled()
        gc.disable()
        try:
            for _ in range(rounds):
                one_round()
            wait_until(lambda: not _broker_connection_threads(), what="every connection's threads to end")
            unreachable = gc.collect()
        finally:
            if enabled:
                gc.enable()
    # A cycle per connection would be dozens of objects each round: allow what a stray
    # object of the test process itself may leave, far below one per round.
    assert unreachable < rounds, unreachable
