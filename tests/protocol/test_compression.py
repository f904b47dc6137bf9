"""deflate and snappy on the V2 connection: negotiation, exact bytes, round trips, corrupt input."""

import threading
import zlib

import pytest

from nsqd_threaded.client.consumer import Consumer
from nsqd_threaded.client.producer import Producer
from nsqd_threaded.wire import protocol_v2

from support.transport import CompressedConn, certs, connect, identify, start_tls, tls_options  # noqa: F401

pytestmark = pytest.mark.timeout(90)

OK = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


def test_deflate_negotiation_and_ok_bytes(nsqd):
    with connect(nsqd) as conn:
        answer = identify(conn, deflate=True, deflate_level=1)
        assert (answer["deflate"], answer["deflate_level"], answer["snappy"]) == (True, 1, False)
        z = CompressedConn(conn, "deflate")
        assert z.read_frame() == (protocol_v2.FRAME_TYPE_RESPONSE, b"OK")
        assert z.raw.endswith(b"\x00\x00\xff\xff")  # a sync flush per flush
        z.cmd(b"PUB t", b"hello")
        assert z.read_frame() == (protocol_v2.FRAME_TYPE_RESPONSE, b"OK")


def test_deflate_level_is_capped_and_defaults_to_6(make_nsqd):
    nsqd = make_nsqd(max_deflate_level=3)
    with connect(nsqd) as conn:
        answer = identify(conn, deflate=True, deflate_level=9)
        assert (answer["deflate_level"], answer["max_deflate_level"]) == (3, 3)
    with connect(nsqd) as conn:
        answer = identify(conn, deflate=False, deflate_level=9)  # capped even when not negotiated
        assert (answer["deflate"], answer["deflate_level"]) == (False, 3)
        assert conn.pub("t", b"plain") == b"OK"


def test_snappy_ok_bytes_are_gos(nsqd):
    with connect(nsqd) as conn:
        answer = identify(conn, snappy=True)
        assert (answer["snappy"], answer["deflate"]) == (True, False)
        z = CompressedConn(conn, "snappy")
        assert z.read_frame() == (protocol_v2.FRAME_TYPE_RESPONSE, b"OK")
        assert z.raw == bytes.fromhex("ff060000734e61507059" "010e00002698 2bcf".replace(" ", "")) + OK


def test_both_compressions_is_identify_failed(nsqd):
    with connect(nsqd) as conn:
        conn.cmd(b"IDENTIFY", b'{"feature_negotiation":true,"snappy":true,"deflate":true}')
        assert conn.read_error() == "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
        conn.assert_closed()


def test_without_feature_negotiation_nothing_is_upgraded(nsqd):
    with connect(nsqd) as conn:
        assert conn.identify(snappy=True, deflate=True, tls_v1=True) == b"OK"
        assert conn.pub("t", b"plain") == b"OK"


@pytest.mark.parametrize("flag", ["deflate", "snappy"])
def test_disabled_by_flag(make_nsqd, flag):
    nsqd = make_nsqd(**{flag: False})
    with connect(nsqd) as conn:
        answer = identify(conn, **{flag: True})
        assert answer[flag] is False
        assert conn.pub("t", b"plain") == b"OK"


def _bodies(n):
    # Mixed sizes and contents: compressible runs, incompressible bytes, empty-ish bodies.
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(bytes([i % 256]) * (i * 37 % 9000 + 1))
        elif i % 3 == 1:
            out.append(zlib.compress(b"%d" % i * 50)[: i % 700 + 1])
        else:
            out.append(b"message %d" % i)
    return out


@pytest.mark.parametrize(
    "tls,snappy,deflate",
    [(False, True, False), (False, False, True), (True, True, False), (True, False, True)],
)
def test_large_mpub_and_rdy_2500_round_trip(make_nsqd, certs, tls, snappy, deflate):
    nsqd = make_nsqd(**tls_options(certs))
    bodies = _bodies(6000)
    kw = dict(tls_v1=tls, tls_options={"ca_certs": certs.ca}, snappy=snappy, deflate=deflate, deflate_level=5)
    with Producer(nsqd.tcp_address, **kw) as producer:
        producer.mpub("t", bodies[:2500])
        for b in bodies[2500:2600]:
            producer.pub("t", b)
        producer.mpub("t", bodies[2600:])
    with Consumer(nsqd.tcp_address, "t", "c", max_in_flight=2500, **kw) as consumer:
        got = []
        for _ in bodies:
            m = consumer.get(timeout=20)
            got.append(m.body)
            m.fin()
        (conn,) = consumer._conns
        assert (conn.tls, conn.compression) == (tls, "snappy" if snappy else "deflate")
    assert got == bodies  # byte for byte, in order (one connection, one channel)


def test_tls_then_snappy_raw(make_nsqd, certs):
    """Go's order: the OK inside TLS, then the OK inside TLS and snappy."""
    nsqd = make_nsqd(**tls_options(certs))
    with connect(nsqd) as conn:
        answer = identify(conn, tls_v1=True, snappy=True)
        assert (answer["tls_v1"], answer["snappy"]) == (True, True)
        start_tls(conn, certs.client_context())
        assert conn.read_raw_frame() == OK
        z = CompressedConn(conn, "snappy")
        assert z.read_frame() == (protocol_v2.FRAME_TYPE_RESPONSE, b"OK")
        z.cmd(b"PUB t", b"x")
        assert z.read_frame() == (protocol_v2.FRAME_TYPE_RESPONSE, b"OK")


def test_two_commands_in_one_compressed_flush(nsqd):
    """Both are answered at once: nothing decodable waits inside the decompressor."""
    for kind in ("deflate", "snappy"):
        with connect(nsqd) as conn:
            identify(conn, **{kind: True})
            z = CompressedConn(conn, kind)
            z.read_frame()
            z.send(b"PUB t\n" + protocol_v2.encode_size(1) + b"a" + b"PUB t\n" + protocol_v2.encode_size(1) + b"b")
            assert [z.read_frame() for _ in range(2)] == [(protocol_v2.FRAME_TYPE_RESPONSE, b"OK")] * 2


@pytest.mark.parametrize(
    "kind,garbage",
    [
        ("deflate", b"\xff" * 64),  # an invalid block type
        ("snappy", b"\x02\x05\x00\x00hello"),  # a reserved unskippable chunk type
        ("snappy", b"\x00\x08\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff"),  # a corrupt compressed chunk
    ],
)
def test_garbage_compressed_input_closes_only_that_connection(make_nsqd, kind, garbage):
    nsqd = make_nsqd()
    # A bystander, subscribed and publishing, over the same kind of stream.
    bystander = connect(nsqd)
    identify(bystander, **{kind: True})
    other = CompressedConn(bystander, kind)
    other.read_frame()
    other.cmd(b"SUB t c")
    assert other.read_frame() == (protocol_v2.FRAME_TYPE_RESPONSE, b"OK")
    other.cmd(b"RDY 10")
    with connect(nsqd) as conn:
        identify(conn, **{kind: True})
        z = CompressedConn(conn, kind)
        z.read_frame()
        conn.send(garbage)
        assert z.read_until_closed() == []  # closed without an answer, as nsqd's read error
    with connect(nsqd) as plain:
        assert plain.pub("t", b"after") == b"OK"
    ft, data = other.read_frame()
    assert ft == protocol_v2.FRAME_TYPE_MESSAGE and protocol_v2.decode_message(data)[3] == b"after"
    bystander.close()


def test_garbage_in_a_pub_body_closes_the_connection(nsqd):
    """Corrupt input in the middle of a body ends the connection.

    If the server read the start of the body before the garbage arrived, it
    answers nsqd's E_BAD_MESSAGE for the unread body first; if both came in
    one read, the read fails as a whole and the connection just closes.
    """
    with connect(nsqd) as conn:
        identify(conn, deflate=True)
        z = CompressedConn(conn, "deflate")
        z.read_frame()
        z.send(b"PUB t\n" + protocol_v2.encode_size(100) + b"part")
        conn.send(b"\xff" * 32)
        frames = z.read_until_closed()
        assert frames in ([], [(protocol_v2.FRAME_TYPE_ERROR, b"E_BAD_MESSAGE PUB failed to read message body")])
    with connect(nsqd) as plain:
        assert plain.pub("t", b"after") == b"OK"


def test_stats_show_compression(nsqd):
    import json
    import urllib.request

    with connect(nsqd) as conn:
        identify(conn, snappy=True)
        z = CompressedConn(conn, "snappy")
        z.read_frame()
        z.cmd(b"PUB t", b"x")
        z.read_frame()
        url = "http://%s:%d/stats?format=json" % nsqd.http_address
        with urllib.request.urlopen(url, timeout=10) as r:
            (client,) = json.loads(r.read())["producers"]
        assert (client["snappy"], client["deflate"], client["tls"]) == (True, False, False)


def test_no_threads_left_after_compressed_clients(make_nsqd):
    nsqd = make_nsqd()
    with Producer(nsqd.tcp_address, deflate=True) as producer:
        producer.pub("t", b"x")
    nsqd.stop()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("nsqd-conn")]


def test_a_deflate_bomb_is_inflated_a_bounded_piece_at_a_time(nsqd):
    """A small deflate stream that expands to a large MPUB: read in pieces, and published whole."""
    from nsqd_threaded.wire import transport

    bodies = [b"\x00" * 100000] * 40  # 4 MB of zeros: a few KB deflated
    with connect(nsqd) as conn:
        identify(conn, deflate=True, deflate_level=9)
        z = CompressedConn(conn, "deflate", level=9)
        z.read_frame()
        body = protocol_v2.encode_mpub_body(bodies)
        compressed = z.compress(b"MPUB t\n" + protocol_v2.encode_size(len(body)) + body)
        assert len(compressed) < transport.DEFLATE_OUTPUT_LIMIT // 100
        conn.send(compressed)
        assert z.read_frame() == (protocol_v2.FRAME_TYPE_RESPONSE, b"OK")
    assert nsqd.get_existing_topic("t").message_count == 40
