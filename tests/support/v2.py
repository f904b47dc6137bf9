"""Helpers of the protocol V2 tests over TCP: error assertions, a subscribed consumer, publishing."""

import socket
import struct

import pytest

from nsqd_threaded.wire.protocol_v2 import ProtocolError

from support.wire import Conn

NOT_IN_FLIGHT_ID = b"0123456789abcdef"


def size(n):
    return struct.pack(">i", n)


def usize(n):
    return struct.pack(">I", n)


def fatal(conn, text):
    """The next frame is error ``text`` and the server then closes the connection."""
    assert conn.read_error() == text
    conn.assert_closed()
    assert conn.buf == b""  # nothing after the error frame


def non_fatal(conn, text):
    """The next frame is error ``text`` and the connection still works."""
    assert conn.read_error() == text
    conn.cmd(b"NOP")
    assert conn.pub("still_alive", b"x") == b"OK"


def half_close(conn):
    """We send nothing more (EOF for the server's reads) but keep reading."""
    conn.sock.shutdown(socket.SHUT_WR)


def channel_of(nsqd, topic, channel):
    t = nsqd.get_existing_topic(topic)
    return t and t.get_existing_channel(channel)


@pytest.fixture
def conn(nsqd):
    c = Conn(nsqd.tcp_address)
    yield c
    c.close()


def consumer(nsqd, topic, channel="c", rdy=None, **identify):
    c = Conn(nsqd.tcp_address)
    if identify:
        assert c.identify(**identify) == b"OK"
    c.sub(topic, channel, rdy=rdy)
    return c


def publish(nsqd, topic, *bodies):
    with Conn(nsqd.tcp_address) as p:
        for body in bodies:
            assert p.pub(topic, body) == b"OK"


def delivered(nsqd, topic, body=b"m"):
    """A subscribed consumer holding one in-flight message: (conn, message id)."""
    c = consumer(nsqd, topic, rdy=1)
    publish(nsqd, topic, body)
    ts, attempts, msg_id, got = c.read_message()
    assert (attempts, got) == (1, body)
    return c, msg_id


def read_all_until_closed(conn, timeout=5.0):
    conn.assert_closed(timeout)
    data, conn.buf = conn.buf, b""
    return data


def protocol_error(fn, *args):
    """``fn(*args)`` raises ProtocolError: its code and description, as one string."""
    with pytest.raises(ProtocolError) as info:
        fn(*args)
    return "%s %s" % (info.value.code, info.value.description)
