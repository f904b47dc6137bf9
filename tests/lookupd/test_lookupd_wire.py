"""nsqlookupd's V1 protocol functions and registration DB, without sockets."""

import json
import struct
import time

import pytest

from nsqd_threaded.internal.clock import Clock
from nsqd_threaded.lookupd.registration_db import (
    CLIENT,
    GO_ZERO_TIME_NS,
    PeerInfo,
    Registration,
    RegistrationDB,
    filter_active,
)
from nsqd_threaded.wire import protocol_v1, protocol_v2
from nsqd_threaded.wire.protocol_v1 import V1Error

pytestmark = pytest.mark.timeout(30)

PEER = {"broadcast_address": "127.0.0.1", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0"}


def error_of(fn, *args):
    with pytest.raises(V1Error) as info:
        fn(*args)
    return str(info.value)


# -- framing -----------------------------------------------------------------------


def test_responses_are_size_and_data_without_frame_type():
    assert protocol_v1.OK == b"\x00\x00\x00\x02OK"
    assert protocol_v1.BAD_PROTOCOL == b"\x00\x00\x00\x0eE_BAD_PROTOCOL"
    assert protocol_v1.encode_response(b"") == b"\x00\x00\x00\x00"
    assert V1Error("E_INVALID", "invalid command FOO").response() == b"\x00\x00\x00\x1dE_INVALID invalid command FOO"


def test_error_text_keeps_the_bytes_sent():
    params = protocol_v1.parse_line(b"P\xffNG\n")
    assert V1Error("E_INVALID", "invalid command %s" % params[0]).response() == (
        b"\x00\x00\x00\x1eE_INVALID invalid command P\xffNG"
    )


def test_decode_size_is_signed():
    # V1 sizes are read with protocol V2's decoder (what the peer loop calls).
    assert protocol_v2.decode_size(b"\x00\x00\x01\x00") == 256
    assert protocol_v2.decode_size(b"\xff\xff\xff\xff") == -1


# -- command lines -----------------------------------------------------------------


@pytest.mark.parametrize(
    "line, params",
    [
        (b"PING\n", ["PING"]),
        (b"  PING  \r\n", ["PING"]),
        (b"\n", [""]),
        (b"REGISTER t c\n", ["REGISTER", "t", "c"]),
        (b"REGISTER  t\n", ["REGISTER", "", "t"]),  # split on every single space
        (b"PING\tx\n", ["PING\tx"]),  # only the ends are trimmed
        (b"\xc2\xa0PING\xe3\x80\x80\n", ["PING"]),  # Unicode spaces too (Go's TrimSpace)
        (b"\x1fPING\n", ["\x1fPING"]),  # ...but not \x1f, which Python's strip() would take
    ],
)
def test_parse_line(line, params):
    assert protocol_v1.parse_line(line) == params


def test_topic_channel():
    assert protocol_v1.topic_channel("REGISTER", ["t"]) == ("t", "")
    assert protocol_v1.topic_channel("REGISTER", ["t", "c"]) == ("t", "c")
    assert protocol_v1.topic_channel("REGISTER", ["t", "c", "extra"]) == ("t", "c")
    assert protocol_v1.topic_channel("UNREGISTER", ["t#ephemeral", "c#ephemeral"]) == ("t#ephemeral", "c#ephemeral")
    assert protocol_v1.topic_channel("REGISTER", ["t", ""]) == ("t", "")  # an empty channel means none


@pytest.mark.parametrize(
    "command, params, text",
    [
        ("REGISTER", [], "E_INVALID REGISTER insufficient number of params"),
        ("UNREGISTER", [], "E_INVALID UNREGISTER insufficient number of params"),
        ("REGISTER", ["a!b"], "E_BAD_TOPIC REGISTER topic name 'a!b' is not valid"),
        ("REGISTER", [""], "E_BAD_TOPIC REGISTER topic name '' is not valid"),
        ("UNREGISTER", ["x" * 65], "E_BAD_TOPIC UNREGISTER topic name '%s' is not valid" % ("x" * 65)),
        ("REGISTER", ["t", "c!"], "E_BAD_CHANNEL REGISTER channel name 'c!' is not valid"),
        ("UNREGISTER", ["t", "c#eph"], "E_BAD_CHANNEL UNREGISTER channel name 'c#eph' is not valid"),
    ],
)
def test_topic_channel_errors(command, params, text):
    assert error_of(protocol_v1.topic_channel, command, params) == text


def test_identify_size_bounds():
    protocol_v1.check_identify_size(0)
    protocol_v1.check_identify_size(protocol_v1.MAX_IDENTIFY_BODY)
    for size in (-1, protocol_v1.MAX_IDENTIFY_BODY + 1):
        assert error_of(protocol_v1.check_identify_size, size) == "E_BAD_BODY IDENTIFY failed to read body"


# -- IDENTIFY body --------------------------------------------------------------------


def test_decode_peer_info_keeps_known_fields():
    body = dict(PEER, hostname="h", topology_zone="z", topology_region="r", extra=[1, {"x": None}])
    fields = protocol_v1.decode_peer_info(json.dumps(body).encode())
    assert fields == dict(PEER, hostname="h", topology_zone="z", topology_region="r")


def test_decode_peer_info_go_semantics():
    # case-insensitive keys (incl. Go's long-s folding), the last one wins, null changes nothing
    body = b'{"BROADCAST_ADDRESS":"a","broadcast_addre\xc5\xbfs":"b","tcp_port":1,"TCP_Port":2,"http_port":3,' \
        b'"version":"v","hostname":"h","hostname":null}'
    fields = protocol_v1.decode_peer_info(body)
    assert fields["broadcast_address"] == "b" and fields["tcp_port"] == 2 and fields["hostname"] == "h"
    # invalid UTF-8 in a string becomes U+FFFD
    body = json.dumps(dict(PEER, hostname="@")).encode().replace(b"@", b"\xff")
    assert protocol_v1.decode_peer_info(body)["hostname"] == "\ufffd"
    # ports may be negative: only zero counts as missing
    assert protocol_v1.decode_peer_info(json.dumps(dict(PEER, tcp_port=-1)).encode())["tcp_port"] == -1


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{x",
        b"[]",
        b'"s"',
        b"1",
        b'{"tcp_port":"1"}',
        b'{"tcp_port":1.0}',
        b'{"tcp_port":1e3}',
        b'{"tcp_port":true}',
        b'{"tcp_port":9223372036854775808}',
        b'{"hostname":1}',
        b'{"version":NaN}',
        b'{"broadcast_address":"a"} x',
    ],
)
def test_decode_peer_info_failures(body):
    assert error_of(protocol_v1.decode_peer_info, body) == "E_BAD_BODY IDENTIFY failed to decode JSON body"


@pytest.mark.parametrize("missing", ["broadcast_address", "tcp_port", "http_port", "version"])
def test_decode_peer_info_requires_fields(missing):
    for body in (dict(PEER, **{missing: ("" if missing in ("broadcast_address", "version") else 0)}),
                 {k: v for k, v in PEER.items() if k != missing}):
        assert error_of(protocol_v1.decode_peer_info, json.dumps(body).encode()) == "E_BAD_BODY IDENTIFY missing fields"
    assert error_of(protocol_v1.decode_peer_info, b"null") == "E_BAD_BODY IDENTIFY missing fields"


def test_identify_response_is_a_sorted_go_map():
    data = protocol_v1.identify_response("127.0.0.1", "vm", 4160, 4161, "1.3.0")
    assert data[4:] == b'{"broadcast_address":"127.0.0.1","hostname":"vm","http_port":4161,"tcp_port":4160,"version":"1.3.0"}'
    assert struct.unpack(">i", data[:4])[0] == len(data) - 4


def test_go_json_escapes_like_go():
    assert protocol_v1.go_json({"a": ["<&>", "\u2028", 1, True, False, None], "b": {}}) == (
        '{"a":["\\u003c\\u0026\\u003e","\\u2028",1,true,false,null],"b":{}}'
    )


# -- the registration DB ----------------------------------------------------------------


def peer(peer_id="127.0.0.1:50000", **fields):
    return PeerInfo(peer_id, dict(PEER, **fields), Clock())


def test_add_and_remove_producers():
    db = RegistrationDB()
    a, b = peer("a:1"), peer("b:2")
    reg = Registration("topic", "t", "")
    assert db.add_producer(reg, a) is True
    assert db.add_producer(reg, a) is False  # already there: kept as is
    assert db.add_producer(reg, b) is True
    assert [p.peer for p in db.find_producers("topic", "t", "")] == [a, b]
    assert db.remove_producer(reg, "a:1") == (True, 1)
    assert db.remove_producer(reg, "a:1") == (False, 1)
    assert db.remove_producer(reg, "b:2") == (True, 0)
    assert db.find_registrations("topic", "t", "") == [reg]  # the key stays
    assert db.remove_producer(Registration("topic", "nope", ""), "a:1") == (False, 0)
    db.remove_registration(reg)
    assert db.find_registrations("topic", "t", "") == []


def test_wildcards_and_lookup_registrations():
    db = RegistrationDB()
    a, b = peer("a:1"), peer("b:2")
    for reg, p in [
        (Registration("topic", "t1", ""), a),
        (Registration("channel", "t1", "c1"), a),
        (Registration("channel", "t1", "c2"), b),
        (Registration("channel", "t2", "c1"), b),
        (Registration("topic", "t2", ""), b),
    ]:
        db.add_producer(reg, p)
    db.add_registration(Registration("topic", "t3", ""))
    assert [r.key for r in db.find_registrations("topic", "*", "")] == ["t1", "t2", "t3"]
    assert [r.subkey for r in db.find_registrations("channel", "t1", "*")] == ["c1", "c2"]
    assert len(db.find_registrations("channel", "*", "*")) == 3
    assert [r.key for r in db.find_registrations("channel", "*", "c1")] == ["t1", "t2"]
    # one producer per peer across matching keys
    assert sorted(p.peer.id for p in db.find_producers("channel", "*", "*")) == ["a:1", "b:2"]
    assert db.find_producers("topic", "t3", "") == []
    assert db.find_producers("topic", "missing", "") == []
    assert db.lookup_registrations("a:1") == [Registration("topic", "t1", ""), Registration("channel", "t1", "c1")]


def test_filter_active_inactivity_and_tombstones():
    db = RegistrationDB()
    a, b = peer("a:1", http_port=1), peer("b:2", http_port=2)
    reg = Registration("topic", "t", "")
    db.add_producer(reg, a)
    db.add_producer(reg, b)
    producers = db.find_producers("topic", "t", "")
    now = time.monotonic()
    assert filter_active(producers, 300, 45, now) == producers
    a.last_update_mono = now - 301
    assert [p.peer for p in filter_active(producers, 300, 45, now)] == [b]
    db.tombstone("t", "127.0.0.1:2")
    assert filter_active(producers, 300, 45, time.monotonic()) == []
    assert filter_active(producers, 300, 0, time.monotonic()) == [producers[1]]  # a zero lifetime ignores tombstones
    # the tombstone ends with its lifetime
    assert filter_active(producers, 300, 45, time.monotonic() + 46) == [producers[1]]


def test_tombstone_is_per_topic_and_kept_by_re_register():
    db = RegistrationDB()
    a = peer("a:1", http_port=4151)
    t1, t2 = Registration("topic", "t1", ""), Registration("topic", "t2", "")
    db.add_producer(CLIENT, a)
    db.add_producer(t1, a)
    db.add_producer(t2, a)
    db.tombstone("t1", "127.0.0.1:9999")  # another node: nothing
    assert not any(p.tombstoned for p in db.find_producers("topic", "*", ""))
    db.tombstone("t1", "127.0.0.1:4151")
    assert db.add_producer(t1, a) is False
    assert db.nodes(300, 45) == [(a, ["t1", "t2"], [True, False])]
    debug = db.debug()
    assert debug["topic:t1:"][0]["tombstoned"] is True
    assert debug["topic:t1:"][0]["tombstoned_at"] > 0
    assert debug["topic:t2:"][0]["tombstoned_at"] == GO_ZERO_TIME_NS
    assert list(debug) == sorted(debug)
    assert list(debug["client::"][0]) == sorted(debug["client::"][0])


def test_nodes_skips_inactive_peers():
    db = RegistrationDB()
    a, b = peer("a:1"), peer("b:2")
    for p in (a, b):
        db.add_producer(CLIENT, p)
    a.last_update_mono -= 10
    assert [n[0] for n in db.nodes(5, 45)] == [b]
    assert [n[0] for n in db.nodes(300, 45)] == [a, b]
