"""IDENTIFY bodies a broker has seen already (IdentifyMemo): every connection is still answered and
set up as its own body asks, refused bodies are refused each time, and the memo stays bounded."""

import json

from nsqd_threaded.server.identify_memo import MEMO_BODY, MEMO_ENTRIES, IdentifyMemo
from nsqd_threaded.wire import protocol_v2

from support.transport import CompressedConn, connect, identify
from support.wire import Conn


def _client(nsqd, client_id):
    (client,) = [c for c in nsqd.clients() if c.client_id == client_id]
    return client


def test_a_programs_connections_share_one_decode_and_each_is_set_up_as_it_asked(make_nsqd):
    nsqd = make_nsqd()
    alike = {"client_id": "app", "hostname": "h1", "msg_timeout": 5000, "heartbeat_interval": 7000,
             "sample_rate": 10, "user_agent": "pynsq/0.9.1"}
    conns = [connect(nsqd) for _ in range(3)]
    try:
        answers = [identify(conn, **alike) for conn in conns]
        other = connect(nsqd)
        conns.append(other)
        other_answer = identify(other, client_id="other", msg_timeout=9000)
        assert answers[0] == answers[1] == answers[2]
        assert (answers[0]["msg_timeout"], answers[0]["sample_rate"]) == (5000, 10)
        assert (other_answer["msg_timeout"], other_answer["sample_rate"]) == (9000, 0)
        assert len(nsqd.identify_memo) == 2  # one entry per distinct body
        apps = [c for c in nsqd.clients() if c.client_id == "app"]
        assert len(apps) == 3
        for c in apps:
            assert (c.hostname, c.user_agent, c.msg_timeout_ns, c.heartbeat_interval, c.sample_rate) == (
                "h1", "pynsq/0.9.1", 5000 * 1000000, 7.0, 10)
        assert _client(nsqd, "other").msg_timeout_ns == 9000 * 1000000
        for conn in conns:  # each still works on its own
            assert conn.pub("memo", b"x") == b"OK"
    finally:
        for conn in conns:
            conn.close()


def test_the_same_body_without_feature_negotiation_is_answered_ok_each_time(nsqd):
    body = json.dumps({"client_id": "bench", "heartbeat_interval": 30000}).encode()
    for _ in range(3):
        with connect(nsqd) as conn:
            conn.cmd(b"IDENTIFY", body)
            assert conn.read_response() == b"OK"
            conn.assert_silent()


def test_a_refused_body_is_refused_every_time_and_never_kept(nsqd):
    for _ in range(3):
        with Conn(nsqd.tcp_address) as conn:
            conn.cmd(b"IDENTIFY", json.dumps({"client_id": "late", "msg_timeout": 10}).encode())
            assert conn.read_error() == "E_BAD_BODY IDENTIFY msg timeout (10) is invalid"
            conn.assert_closed()
        with Conn(nsqd.tcp_address) as conn:
            conn.cmd(b"IDENTIFY", b'{"client_id": 5}')
            assert conn.read_error() == "E_BAD_BODY IDENTIFY failed to decode JSON body"
            conn.assert_closed()
    assert len(nsqd.identify_memo) == 0


def test_a_known_body_that_asks_for_compression_is_upgraded_on_every_connection(nsqd):
    for _ in range(2):
        with connect(nsqd) as conn:
            answer = identify(conn, client_id="z", deflate=True, deflate_level=1)
            assert (answer["deflate"], answer["deflate_level"]) == (True, 1)
            z = CompressedConn(conn, "deflate")
            assert z.read_frame() == (protocol_v2.FRAME_TYPE_RESPONSE, b"OK")
            z.cmd(b"PUB t", b"hello")
            assert z.read_frame() == (protocol_v2.FRAME_TYPE_RESPONSE, b"OK")


def test_the_memo_keeps_its_newest_entries_and_short_bodies_only():
    memo = IdentifyMemo()
    bodies = [b'{"client_id":"c%d"}' % i for i in range(MEMO_ENTRIES + 10)]
    for i, body in enumerate(bodies):
        entry = memo.add(body, {"client_id": "c%d" % i}, {"n": i})
        assert memo.get(body) is entry
    assert len(memo) == MEMO_ENTRIES
    assert memo.get(bodies[0]) is None and memo.get(bodies[9]) is None  # the oldest went first
    assert memo.get(bodies[10]).settings == {"n": 10}
    long_body = b'{"client_id":"%s"}' % (b"x" * MEMO_BODY)
    entry = memo.add(long_body, {}, {})
    assert entry.fields == {} and memo.get(long_body) is None
    assert len(memo) == MEMO_ENTRIES


def test_brokers_in_one_process_keep_their_own_memo(make_nsqd):
    first, second = make_nsqd(), make_nsqd(msg_timeout=7.0)
    for nsqd, expected in ((first, 60000), (second, 7000)):
        with connect(nsqd) as conn:
            assert identify(conn, client_id="same")["msg_timeout"] == expected
    assert first.identify_memo is not second.identify_memo
