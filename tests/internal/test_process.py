"""The process tuning (internal/process.py): the command's gc threshold."""

import gc
import platform
import threading
import urllib.request

import pytest

from nsqd_threaded.internal import process
from nsqd_threaded.testing import Broker

from support.core import make_owner, unreachable_after
from support.wire import Conn

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

        def one_round():
            with Conn(broker.tcp_address) as pub:
                assert pub.pub("orders", b"x1") == b"OK"
                assert pub.mpub("orders", [b"x2", b"x3"]) == b"OK"
            with Conn(broker.tcp_address) as sub:
                assert sub.identify(feature_negotiation=True, heartbeat_interval=1000).startswith(b"{")
                sub.sub("orders", "audit", rdy=3)
                ids = [sub.read_message()[2] for _ in range(3)]
                sub.send(b"TOUCH %s\nFIN %s\nFIN %s\nREQ %s 0\n" % (ids[0], ids[0], ids[1], ids[2]))
                assert sub.read_message()[2] == ids[2]  # the requeued one, again
            urllib.request.urlopen(http + "/stats?format=json", timeout=10).read()
            urllib.request.urlopen(urllib.request.Request(http + "/pub?topic=orders", data=b"x4"), timeout=10).read()
            with Conn(broker.tcp_address) as sub:
                sub.sub("orders", "audit", rdy=10)
                held = [sub.read_message()[2:] for _ in range(2)]  # the requeued x3 and x4 (x1, x2 were FINed)
                assert sorted(body for _, body in held) == [b"x3", b"x4"]
                sub.send(b"".join(b"FIN %s\n" % msg_id for msg_id, _ in held) + b"CLS\n")
                assert sub.read_response() == b"CLOSE_WAIT"

        unreachable = unreachable_after(rounds, one_round, lambda: not _broker_connection_threads(), "connections to end")
    # A cycle per connection would be dozens of objects each round: allow what a stray
    # object of the test process itself may leave, far below one per round.
    assert unreachable < rounds, unreachable
