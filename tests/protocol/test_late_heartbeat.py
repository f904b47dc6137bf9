"""A broker that falls behind does not drop the clients it kept waiting.

nsqd closes a connection whose next command has not come within two
heartbeat intervals.  A broker stopped for longer than that (here with
SIGSTOP, as a stalled process or a starved host stops it) finds every
deadline passed when it runs again, through no fault of its clients: its
heartbeat goes out late, and the client gets one whole interval from then to
answer it.  A client that does not answer is still closed.  Both connection
models: the poller's timers and a thread per connection.
"""

import os
import signal
import socket

import pytest

from nsqd_threaded.testing import BrokerProcess
from nsqd_threaded.wire import protocol_v2
from support.wire import Conn

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="no SIGSTOP")]

MODELS = {"poller": (), "threads": ("--connection-threads",)}


@pytest.fixture(params=sorted(MODELS))
def broker(request):
    broker = BrokerProcess(*MODELS[request.param]).start()
    try:
        yield broker
    finally:
        os.kill(broker.pid, signal.SIGCONT)  # (a failed test must not leave it stopped)
        broker.stop()


def _stop_for(broker, conn, seconds):
    """SIGSTOP the broker for ``seconds``, read from ``conn`` meanwhile: nothing comes from a stopped broker."""
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        conn.sock.settimeout(seconds)
        with pytest.raises(socket.timeout):
            conn.sock.recv(1)
    finally:
        os.kill(broker.pid, signal.SIGCONT)
        conn.sock.settimeout(10)


def _subscribed(broker):
    conn = Conn(broker.tcp_address)
    assert conn.identify(heartbeat_interval=1000) == b"OK"
    conn.sub("late", "c", rdy=1)
    assert conn.read_raw_frame() == protocol_v2.HEARTBEAT_FRAME  # on time
    conn.cmd(b"NOP")  # answered: the read deadline is two intervals from here
    return conn


def test_a_client_answering_a_late_heartbeat_is_kept(broker):
    with _subscribed(broker) as conn:
        _stop_for(broker, conn, 3.2)  # well past the deadline
        assert conn.read_raw_frame() == protocol_v2.HEARTBEAT_FRAME  # late, at once
        conn.cmd(b"NOP")
        status, _ = broker.http("POST", "/pub?topic=late", b"still here")
        assert status == 200
        assert conn.read_message()[3] == b"still here"
        assert conn.read_raw_frame() == protocol_v2.HEARTBEAT_FRAME  # and the ticker goes on
        conn.cmd(b"NOP")


def test_a_client_silent_after_a_late_heartbeat_is_closed(broker):
    with _subscribed(broker) as conn:
        _stop_for(broker, conn, 3.2)
        assert conn.read_raw_frame() == protocol_v2.HEARTBEAT_FRAME
        received = b""
        while True:  # no NOP: closed an interval after the late heartbeat (another may come first)
            data = conn.sock.recv(4096)
            if not data:
                break
            received += data
        frames, consumed = protocol_v2.split_frames(received)
        assert consumed == len(received) and {(ft, bytes(d)) for ft, d in frames} <= {(0, b"_heartbeat_")}
