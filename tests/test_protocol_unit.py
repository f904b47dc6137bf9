"""Pure tests of nsqd_threaded.wire.protocol: every function, byte for byte.

Expected values come from ../shared/spec/tcp-protocol.md (and diskqueue.md §3
for the record layout); the [verified] byte strings of the spec are used as is.
"""

import json
import struct

import pytest

from nsqd_threaded.internal import gocompat
from nsqd_threaded.wire import protocol
from nsqd_threaded.settings.options import Options
from nsqd_threaded.wire.protocol import ProtocolError

# -- frames ------------------------------------------------------------------


def test_frame_type_constants():
    assert (protocol.FRAME_TYPE_RESPONSE, protocol.FRAME_TYPE_ERROR, protocol.FRAME_TYPE_MESSAGE) == (0, 1, 2)
    assert protocol.MAGIC_V2 == b"\x20\x20\x56\x32"
    assert protocol.MAX_LINE == 16384
    assert protocol.MSG_ID_LENGTH == 16
    assert protocol.MSG_HEADER_LENGTH == 26


def test_bad_protocol_frame_verified_bytes():
    expected = bytes.fromhex("00000012 00000001 455f4241445f50524f544f434f4c")
    assert protocol.BAD_PROTOCOL_FRAME == expected
    assert protocol.frame(protocol.FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL") == expected


def test_heartbeat_frame_verified_bytes():
    expected = bytes.fromhex("0000000f 00000000 5f6865617274626561745f")
    assert protocol.HEARTBEAT_FRAME == expected
    assert protocol.response_frame(b"_heartbeat_") == expected


def test_ok_and_close_wait_frames():
    assert protocol.OK_FRAME == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert protocol.CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"


def test_empty_frame():
    assert protocol.frame(0, b"") == b"\x00\x00\x00\x04\x00\x00\x00\x00"


def test_error_frame_is_code_space_description():
    err = ProtocolError("E_INVALID", "invalid command ")
    assert err.data == b"E_INVALID invalid command "
    assert protocol.error_frame(err) == b"\x00\x00\x00\x1e\x00\x00\x00\x01E_INVALID invalid command "


def test_error_frame_keeps_raw_bytes_from_the_wire():
    # Descriptions built with protocol.text() keep the client's bytes exactly.
    err = ProtocolError("E_INVALID", "invalid command %s" % protocol.text(b"\xff\xfe"))
    assert err.data == b"E_INVALID invalid command \xff\xfe"
    assert protocol.error_frame(err)[8:] == err.data


@pytest.mark.parametrize(
    "code, fatal",
    [
        ("E_FIN_FAILED", False),
        ("E_REQ_FAILED", False),
        ("E_TOUCH_FAILED", False),
        ("E_INVALID", True),
        ("E_BAD_BODY", True),
        ("E_BAD_TOPIC", True),
        ("E_BAD_CHANNEL", True),
        ("E_BAD_MESSAGE", True),
        ("E_PUB_FAILED", True),
        ("E_MPUB_FAILED", True),
        ("E_DPUB_FAILED", True),
        ("E_SUB_FAILED", True),
        ("E_IDENTIFY_FAILED", True),
        ("E_AUTH_DISABLED", True),
        ("E_AUTH_FAILED", True),
        ("E_AUTH_FIRST", True),
        ("E_UNAUTHORIZED", True),
        ("E_AUTH_ERROR", True),
    ],
)
def test_only_three_codes_are_non_fatal(code, fatal):
    assert ProtocolError(code, "x").fatal is fatal


def test_decode_frame():
    assert protocol.decode_frame(protocol.OK_FRAME) == (0, b"OK")
    assert protocol.decode_frame(protocol.BAD_PROTOCOL_FRAME) == (1, b"E_BAD_PROTOCOL")
    # Trailing bytes after the frame are not part of it.
    assert protocol.decode_frame(protocol.OK_FRAME + b"junk") == (0, b"OK")


def test_split_frames_complete_and_partial():
    data = protocol.OK_FRAME + protocol.HEARTBEAT_FRAME + protocol.CLOSE_WAIT_FRAME
    frames, used = protocol.split_frames(data)
    assert frames == [(0, b"OK"), (0, b"_heartbeat_"), (0, b"CLOSE_WAIT")]
    assert used == len(data)
    for cut in range(len(data) + 1):
        frames, used = protocol.split_frames(bytearray(data[:cut]))
        whole = [n for n in (10, 29, 47) if n <= cut]
        assert used == (whole[-1] if whole else 0)
        assert len(frames) == len(whole)


# -- message payload (frame type 2 and the diskqueue record) ---------------

# diskqueue.md §3 observed record: body "dd", attempts 0, id "18a40df10fe69000".
RECORD = bytes.fromhex(
    "0000001c" "18ea4c4c68fdbfed" "0000" "31386134306466313066653639303030" "6464"
)
PAYLOAD = RECORD[4:]
TS = 0x18EA4C4C68FDBFED
MSG_ID = b"18a40df10fe69000"


def test_decode_message_of_the_verified_disk_record():
    assert struct.unpack(">i", RECORD[:4])[0] == len(PAYLOAD) == 28
    assert protocol.decode_message(PAYLOAD) == (TS, 0, MSG_ID, b"dd")
    assert protocol.decode_message(bytearray(PAYLOAD)) == (TS, 0, MSG_ID, b"dd")
    assert protocol.decode_message(memoryview(PAYLOAD)) == (TS, 0, MSG_ID, b"dd")


def test_encode_message_is_the_verified_disk_record():
    assert protocol.encode_message(TS, 0, MSG_ID, b"dd") == PAYLOAD


def test_message_frame_is_size_type_payload():
    parts = protocol.message_frame_parts(TS, 0, MSG_ID, b"dd")
    assert len(parts) == 3
    wire = b"".join(parts)
    assert wire == b"\x00\x00\x00\x20\x00\x00\x00\x02" + PAYLOAD  # 4 + 26 + 2 = 32
    assert wire == protocol.frame(protocol.FRAME_TYPE_MESSAGE, PAYLOAD)
    assert protocol.decode_frame(wire) == (2, PAYLOAD)


def test_message_attempts_and_body_edges():
    payload = protocol.encode_message(1, 65535, MSG_ID, b"")
    assert payload == b"\x00" * 7 + b"\x01" + b"\xff\xff" + MSG_ID
    assert protocol.decode_message(payload) == (1, 65535, MSG_ID, b"")
    body = bytes(range(256)) * 3
    payload = protocol.encode_message(-1, 1, MSG_ID, body)
    assert payload[:8] == b"\xff" * 8  # int64, signed
    assert protocol.decode_message(payload) == (-1, 1, MSG_ID, body)


def test_decode_message_too_short():
    with pytest.raises(ValueError):
        protocol.decode_message(PAYLOAD[:25])
    with pytest.raises(ValueError):
        protocol.decode_message(b"")
    assert protocol.decode_message(PAYLOAD[:26]) == (TS, 0, MSG_ID, b"")


# -- command lines -----------------------------------------------------------


@pytest.mark.parametrize(
    "line, params",
    [
        (b"NOP", [b"NOP"]),
        (b"PUB t", [b"PUB", b"t"]),
        (b"PUB t\r", [b"PUB", b"t"]),  # CRLF: one \r stripped
        (b"PUB t\r\r", [b"PUB", b"t\r"]),  # only one
        (b"PUB \rt", [b"PUB", b"\rt"]),  # only trailing
        (b"PUB  t", [b"PUB", b"", b"t"]),  # every single space splits
        (b"PUB t extra", [b"PUB", b"t", b"extra"]),
        (b"PUB t ", [b"PUB", b"t", b""]),
        (b" NOP", [b"", b"NOP"]),
        (b"RDY ", [b"RDY", b""]),
        (b"", [b""]),
        (b"\r", [b""]),
        (b"PUB\tt", [b"PUB\tt"]),  # tabs are not separators
        (b"nop", [b"nop"]),
    ],
)
def test_parse_line(line, params):
    assert protocol.parse_line(line) == params


@pytest.mark.parametrize(
    "raw, value",
    [
        (b"0", 0),
        (b"", 0),  # empty parses as 0
        (b"7", 7),
        (b"007", 7),
        (b"2500", 2500),
        (b"18446744073709551615", 2**64 - 1),
        (b"-1", None),
        (b"+1", None),
        (b" 1", None),
        (b"1 ", None),
        (b"1.0", None),
        (b"0x1", None),
        (b"1e3", None),
        (b"\xd9\xa1", None),  # ARABIC-INDIC DIGIT ONE
        (b"\xef\xbc\x91", None),  # FULLWIDTH DIGIT ONE
    ],
)
def test_parse_uint_digits_only(raw, value):
    assert protocol.parse_uint(raw) == value


def test_parse_uint_is_unbounded_and_int64_wraps_like_go():
    n = protocol.parse_uint(b"9" * 30)
    assert n == 10**30 - 1
    assert protocol.int64(2**64 - 1) == -1
    assert protocol.int64(2**63) == -(2**63)
    assert protocol.int64(2**63 - 1) == 2**63 - 1
    assert protocol.int64(2**64 + 5) == 5
    assert protocol.int64(-1) == -1
    # REQ/DPUB: time.Duration(ms) * time.Millisecond overflows in int64.
    assert protocol.int64(9223372036855 * 1000000) < 0


@pytest.mark.parametrize(
    "raw, value",
    [
        (b"\x00\x00\x00\x00", 0),
        (b"\x00\x00\x00\x01", 1),
        (b"\x00\x10\x00\x00", 1048576),
        (b"\x7f\xff\xff\xff", 2147483647),
        (b"\x80\x00\x00\x00", -2147483648),  # 0x80000000 is negative
        (b"\xff\xff\xff\xff", -1),
    ],
)
def test_sizes_are_signed_int32_big_endian(raw, value):
    assert protocol.decode_size(raw) == value
    assert protocol.encode_size(value) == raw


# -- names -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name, valid",
    [
        ("a", True),
        (".", True),
        ("-", True),
        ("_", True),
        ("a-b_c.D9", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("t#ephemeral", True),
        ("x" * 54 + "#ephemeral", True),  # 64 bytes including the suffix
        ("x" * 55 + "#ephemeral", False),  # 65
        ("", False),
        ("#ephemeral", False),
        ("a#ephemeral#ephemeral", False),
        ("a#Ephemeral", False),
        ("a#ephemeralx", False),
        ("a#b", False),
        ("a\n", False),  # $ is end of text in Go
        ("a\r", False),
        ("t#ephemeral\n", False),
        ("a b", False),
        ("a*b", False),
        ("a/b", False),
        ("a:b", False),
        ("a\x00", False),
        ("\u00e4", False),
        ("\uff41", False),  # FULLWIDTH a
    ],
)
def test_is_valid_name(name, valid):
    assert protocol.is_valid_name(name) is valid
    assert protocol.is_valid_name(name.encode("utf-8")) is valid


def test_is_valid_name_rejects_non_utf8_bytes():
    assert protocol.is_valid_name(b"\xff") is False
    assert protocol.is_valid_name(b"ab\x80") is False


# -- Go %q -----------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, quoted",
    [
        (b"", '""'),
        (b"a b", '"a b"'),
        (b"a*b", '"a*b"'),
        (b'a"b', '"a\\"b"'),
        (b"a\\b", '"a\\\\b"'),
        (b"'", '"\'"'),
        (b"\n\r\t", '"\\n\\r\\t"'),
        (b"\x07\x08\x0c\x0b", '"\\a\\b\\f\\v"'),
        (b"\x00\x01\x1b\x1f\x7f", '"\\x00\\x01\\x1b\\x1f\\x7f"'),
        (b"\xff", '"\\xff"'),  # invalid UTF-8: \x per byte
        (b"a\xe2\x82b", '"a\\xe2\\x82b"'),  # truncated sequence
        (b"\xc0\xaf", '"\\xc0\\xaf"'),  # overlong
        (b"\xed\xa0\x80", '"\\xed\\xa0\\x80"'),  # encoded surrogate
        (b"\xf4\x90\x80\x80", '"\\xf4\\x90\\x80\\x80"'),  # > U+10FFFF
        ("\u00e9".encode(), '"\u00e9"'),  # printable: literal
        ("\u65e5\u672c".encode(), '"\u65e5\u672c"'),
        ("\ufffd".encode(), '"\ufffd"'),  # a real U+FFFD is printable
        ("\U0001f600".encode(), '"\U0001f600"'),
        ("\u0085".encode(), '"\\u0085"'),  # C1 control
        ("\u00a0".encode(), '"\\u00a0"'),  # non-ASCII space is not printable
        ("\u200b".encode(), '"\\u200b"'),  # format char
        ("\u2028".encode(), '"\\u2028"'),
        ("\ue000".encode(), '"\\ue000"'),  # private use
        ("\U000e0001".encode(), '"\\U000e0001"'),
        ("\U0010ffff".encode(), '"\\U0010ffff"'),
    ],
)
def test_go_quote(raw, quoted):
    assert gocompat.go_quote(raw) == quoted


def test_go_quote_accepts_text():
    assert gocompat.go_quote("a\nb") == '"a\\nb"'
    assert gocompat.go_quote(protocol.text(b"\xff")) == '"\\xff"'


def test_text_round_trips_wire_bytes():
    raw = b"\xff\x00abc\xe2\x82"
    assert protocol.text(raw).encode("utf-8", "surrogateescape") == raw


# -- size checks -----------------------------------------------------------


def _err(fn, *args):
    with pytest.raises(ProtocolError) as info:
        fn(*args)
    return "%s %s" % (info.value.code, info.value.description)


def test_check_body_size_identify_auth():
    protocol.check_body_size("IDENTIFY", 1, 5)
    protocol.check_body_size("IDENTIFY", 5, 5)  # equal is allowed
    assert _err(protocol.check_body_size, "IDENTIFY", 6, 5) == "E_BAD_BODY IDENTIFY body too big 6 > 5"
    assert _err(protocol.check_body_size, "IDENTIFY", 0, 5) == "E_BAD_BODY IDENTIFY invalid body size 0"
    assert (
        _err(protocol.check_body_size, "AUTH", -2147483648, 5242880)
        == "E_BAD_BODY AUTH invalid body size -2147483648"
    )
    assert _err(protocol.check_body_size, "AUTH", 5242881, 5242880) == "E_BAD_BODY AUTH body too big 5242881 > 5242880"
    # Order: "too big" is checked before "<= 0" (only observable with a negative max).
    assert _err(protocol.check_body_size, "IDENTIFY", -3, -5) == "E_BAD_BODY IDENTIFY body too big -3 > -5"


def test_check_message_size_pub_dpub():
    protocol.check_message_size("PUB", 1, 10)
    protocol.check_message_size("PUB", 10, 10)  # equal is allowed
    assert _err(protocol.check_message_size, "PUB", 0, 10) == "E_BAD_MESSAGE PUB invalid message body size 0"
    assert _err(protocol.check_message_size, "PUB", -1, 10) == "E_BAD_MESSAGE PUB invalid message body size -1"
    assert _err(protocol.check_message_size, "PUB", 11, 10) == "E_BAD_MESSAGE PUB message too big 11 > 10"
    assert _err(protocol.check_message_size, "DPUB", 0, 10) == "E_BAD_MESSAGE DPUB invalid message body size 0"
    assert _err(protocol.check_message_size, "DPUB", 11, 10) == "E_BAD_MESSAGE DPUB message too big 11 > 10"
    # Order: "<= 0" before "too big".
    assert _err(protocol.check_message_size, "PUB", -3, -5) == "E_BAD_MESSAGE PUB invalid message body size -3"


def test_check_mpub_body_size():
    protocol.check_mpub_body_size(1, 10)
    protocol.check_mpub_body_size(10, 10)
    assert _err(protocol.check_mpub_body_size, 0, 10) == "E_BAD_BODY MPUB invalid body size 0"
    assert _err(protocol.check_mpub_body_size, -2147483648, 10) == "E_BAD_BODY MPUB invalid body size -2147483648"
    assert _err(protocol.check_mpub_body_size, 11, 10) == "E_BAD_BODY MPUB body too big 11 > 10"
    assert _err(protocol.check_mpub_body_size, -3, -5) == "E_BAD_BODY MPUB invalid body size -3"


def test_check_mpub_count():
    # (max_body_size - 4) // 5: 104 -> 20
    protocol.check_mpub_count(1, 104)
    protocol.check_mpub_count(20, 104)
    assert _err(protocol.check_mpub_count, 21, 104) == "E_BAD_BODY MPUB invalid message count 21"
    assert _err(protocol.check_mpub_count, 0, 104) == "E_BAD_BODY MPUB invalid message count 0"
    assert _err(protocol.check_mpub_count, -1, 104) == "E_BAD_BODY MPUB invalid message count -1"
    # integer division: 108 -> 20, 109 -> 21
    assert _err(protocol.check_mpub_count, 21, 108) == "E_BAD_BODY MPUB invalid message count 21"
    protocol.check_mpub_count(21, 109)
    protocol.check_mpub_count(1048575, 5242880)
    assert _err(protocol.check_mpub_count, 1048576, 5242880) == "E_BAD_BODY MPUB invalid message count 1048576"


# -- MPUB body -------------------------------------------------------------


def test_encode_mpub_body():
    assert protocol.encode_mpub_body([b"a", b"bc"]) == (
        b"\x00\x00\x00\x02" b"\x00\x00\x00\x01a" b"\x00\x00\x00\x02bc"
    )


def test_parse_mpub_messages_whole_buffer():
    items = protocol.encode_mpub_body([b"a", b"bc", b"def"])[4:]
    out = []
    pos = protocol.parse_mpub_messages(items, 0, len(items), 0, 3, 10, out)
    assert out == [b"a", b"bc", b"def"]
    assert pos == len(items)
    assert all(type(b) is bytes for b in out)


def test_parse_mpub_messages_stops_after_count():
    items = protocol.encode_mpub_body([b"a", b"bc"])[4:] + b"NOP\n"
    out = []
    pos = protocol.parse_mpub_messages(items, 0, len(items), 0, 2, 10, out)
    assert out == [b"a", b"bc"]
    assert items[pos:] == b"NOP\n"  # the rest is the next command


def test_parse_mpub_messages_respects_pos_and_end():
    items = b"XXXX" + protocol.encode_mpub_body([b"a", b"bc"])[4:] + b"YY"
    out = []
    pos = protocol.parse_mpub_messages(items, 4, len(items) - 2, 0, 2, 10, out)
    assert out == [b"a", b"bc"] and pos == len(items) - 2


def test_parse_mpub_messages_resumes_at_every_cut():
    bodies = [b"a", b"bc", b"", b"def"]
    bodies[2] = b"g" * 9
    items = protocol.encode_mpub_body(bodies)[4:]
    for cut in range(len(items) + 1):
        buf = bytearray(items[:cut])
        out = []
        pos = protocol.parse_mpub_messages(buf, 0, len(buf), 0, 4, 10, out)
        # Only complete items, and pos right after the last of them.
        assert pos == sum(4 + len(b) for b in out)
        assert out == bodies[: len(out)]
        buf += items[cut:]  # the memoryview is released: the buffer can grow
        pos = protocol.parse_mpub_messages(buf, pos, len(buf), len(out), 4, 10, out)
        assert out == bodies
        assert pos == len(items)


def test_parse_mpub_messages_incomplete_header_consumes_nothing():
    out = []
    assert protocol.parse_mpub_messages(b"\x00\x00\x00", 0, 3, 0, 1, 10, out) == 0
    assert out == []
    assert protocol.parse_mpub_messages(b"\x00\x00\x00\x05ab", 0, 6, 0, 1, 10, out) == 0
    assert out == []


@pytest.mark.parametrize(
    "items, index, error",
    [
        (b"\x00\x00\x00\x00", 0, "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
        (b"\xff\xff\xff\xff", 0, "E_BAD_MESSAGE MPUB invalid message(0) body size -1"),
        (b"\x80\x00\x00\x00", 0, "E_BAD_MESSAGE MPUB invalid message(0) body size -2147483648"),
        (b"\x00\x00\x00\x0b", 0, "E_BAD_MESSAGE MPUB message too big 11 > 10"),  # body not needed
        (b"\x00\x00\x00\x01a\x00\x00\x00\x00", 0, "E_BAD_MESSAGE MPUB invalid message(1) body size 0"),
        (b"\x00\x00\x00\x01a\x00\x00\x00\x0c", 0, "E_BAD_MESSAGE MPUB message too big 12 > 10"),
        (b"\x00\x00\x00\x00", 7, "E_BAD_MESSAGE MPUB invalid message(7) body size 0"),  # resumed index
    ],
)
def test_parse_mpub_messages_errors(items, index, error):
    with pytest.raises(ProtocolError) as info:
        protocol.parse_mpub_messages(items, 0, len(items), index, index + 3, 10, [])
    assert info.value.fatal
    assert "%s %s" % (info.value.code, info.value.description) == error


def test_parse_mpub_messages_size_equal_to_max_is_allowed():
    items = b"\x00\x00\x00\x0a" + b"z" * 10
    out = []
    assert protocol.parse_mpub_messages(items, 0, len(items), 0, 1, 10, out) == 14
    assert out == [b"z" * 10]


# -- IDENTIFY decoding -----------------------------------------------------

DECODE_ERROR = "E_BAD_BODY IDENTIFY failed to decode JSON body"


def decode(doc):
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return protocol.decode_identify(body)


def decode_error(body):
    return _err(protocol.decode_identify, body)


def test_decode_identify_all_fields():
    doc = {
        "client_id": "c",
        "hostname": "h",
        "user_agent": "ua",
        "topology_region": "r",
        "topology_zone": "z",
        "heartbeat_interval": 1000,
        "output_buffer_size": 64,
        "output_buffer_timeout": 25,
        "sample_rate": 5,
        "msg_timeout": 1000,
        "deflate_level": 3,
        "feature_negotiation": True,
        "tls_v1": False,
        "deflate": True,
        "snappy": False,
    }
    assert decode(doc) == doc


def test_decode_identify_keys_are_case_insensitive():
    assert decode({"HEARTBEAT_INTERVAL": 1000}) == {"heartbeat_interval": 1000}
    assert decode({"Feature_Negotiation": True, "Client_ID": "x"}) == {"feature_negotiation": True, "client_id": "x"}


def test_decode_identify_key_folding_follows_go():
    # Go's case folding maps U+017F (long s) to "s".
    assert decode(b'{"\xc5\xbfnappy": true}') == {"snappy": True}


def test_decode_identify_null_leaves_default():
    assert decode({"heartbeat_interval": None, "client_id": None, "snappy": None}) == {}


def test_decode_identify_ignores_unknown_keys():
    assert decode({"short_id": "s", "long_id": "l", "foo": [1, {"a": None}], "bar": 1.5}) == {}
    assert decode({}) == {}


def test_decode_identify_last_duplicate_wins_but_null_keeps_earlier():
    assert decode(b'{"heartbeat_interval": 1000, "HEARTBEAT_INTERVAL": 2000}') == {"heartbeat_interval": 2000}
    assert decode(b'{"heartbeat_interval": 2000, "heartbeat_interval": null}') == {"heartbeat_interval": 2000}


def test_decode_identify_null_document_is_no_op():
    # json.Unmarshal of `null` into a struct changes nothing and is not an error.
    assert decode(b"null") == {}
    assert decode(b" null ") == {}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b" ",
        b"{",
        b"{}}",
        b"{} x",
        b"[1]",
        b"[]",
        b"1",
        b'"x"',
        b"true",
        b"{'a': 1}",
        b'{"a": NaN}',  # Python's json would take these; Go's does not
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'{"heartbeat_interval": 1000.0}',
        b'{"heartbeat_interval": 1e3}',
        b'{"heartbeat_interval": "1000"}',
        b'{"heartbeat_interval": true}',
        b'{"heartbeat_interval": [1000]}',
        b'{"msg_timeout": -0.0}',
        b'{"sample_rate": 2147483648}',  # int32 overflow
        b'{"sample_rate": -2147483649}',
        b'{"heartbeat_interval": 9223372036854775808}',  # int64 overflow
        b'{"feature_negotiation": 1}',
        b'{"feature_negotiation": "true"}',
        b'{"client_id": 1}',
        b'{"client_id": {}}',
        b'{"sample_rate": "x", "sample_rate": 1}',  # a type error is kept even if a later key is fine
        b'{"a": "\x01"}',  # control character in a string
        b'\xef\xbb\xbf{}',  # BOM
    ],
)
def test_decode_identify_errors(body):
    assert decode_error(body) == DECODE_ERROR


def test_decode_identify_deep_nesting_is_a_decode_error_not_a_crash():
    body = b'{"x": ' + b"[" * 20000 + b"]" * 20000 + b"}"  # deeper than Go's 10000 limit
    assert decode_error(body) == DECODE_ERROR


def test_decode_identify_integer_bounds():
    assert decode({"sample_rate": 2147483647}) == {"sample_rate": 2147483647}
    assert decode({"sample_rate": -2147483648}) == {"sample_rate": -2147483648}
    assert decode({"heartbeat_interval": -(2**63)}) == {"heartbeat_interval": -(2**63)}
    assert decode({"msg_timeout": 2**63 - 1}) == {"msg_timeout": 2**63 - 1}
    assert decode(b'{"msg_timeout": -0}') == {"msg_timeout": 0}


def test_decode_identify_strings_like_go():
    # Invalid UTF-8 and lone surrogate escapes become U+FFFD (per byte), as Go decodes them.
    assert decode(b'{"client_id": "a\xffb\xe2\x82"}') == {"client_id": "a\ufffdb\ufffd\ufffd"}
    assert decode(b'{"client_id": "\\ud800x"}') == {"client_id": "\ufffdx"}
    assert decode(b'{"client_id": "\\ud83d\\ude00"}') == {"client_id": "\U0001f600"}
    assert decode(b'{"hostname": "h\\u00e9"}') == {"hostname": "h\u00e9"}


def test_decode_identify_accepts_bytearray_and_memoryview():
    assert protocol.decode_identify(bytearray(b'{"snappy": false}')) == {"snappy": False}
    assert protocol.decode_identify(memoryview(b'{"snappy": false}')) == {"snappy": False}


# -- IDENTIFY negotiation --------------------------------------------------

DEFAULTS = {
    "heartbeat_interval_ms": 30000,
    "output_buffer_timeout_ms": 250,
    "output_buffer_size": 16384,
    "sample_rate": 0,
    "msg_timeout_ms": 60000,
}


def negotiate(opts=None, **fields):
    return protocol.negotiate_identify(fields, opts or Options(node_id=1))


def negotiate_error(opts=None, **fields):
    return _err(protocol.negotiate_identify, fields, opts or Options(node_id=1))


def test_negotiate_defaults():
    assert negotiate() == DEFAULTS
    assert negotiate(heartbeat_interval=0, output_buffer_timeout=0, output_buffer_size=0, msg_timeout=0) == DEFAULTS


def test_negotiate_default_heartbeat_is_half_the_client_timeout():
    s = protocol.negotiate_identify({}, Options(node_id=1), client_timeout_ms=10000)
    assert s["heartbeat_interval_ms"] == 5000


@pytest.mark.parametrize(
    "value, effective",
    [(-1, 0), (0, 30000), (1000, 1000), (1001, 1001), (60000, 60000)],
)
def test_negotiate_heartbeat_ok(value, effective):
    assert negotiate(heartbeat_interval=value)["heartbeat_interval_ms"] == effective


@pytest.mark.parametrize("value", [-2, 1, 999, 60001, -(2**63), 2**63 - 1])
def test_negotiate_heartbeat_invalid(value):
    assert negotiate_error(heartbeat_interval=value) == "E_BAD_BODY IDENTIFY heartbeat interval (%d) is invalid" % value


@pytest.mark.parametrize("value, effective", [(-1, 0), (0, 250), (25, 25), (30000, 30000)])
def test_negotiate_output_buffer_timeout_ok(value, effective):
    assert negotiate(output_buffer_timeout=value)["output_buffer_timeout_ms"] == effective


@pytest.mark.parametrize("value", [-2, 1, 24, 30001])
def test_negotiate_output_buffer_timeout_invalid(value):
    assert negotiate_error(output_buffer_timeout=value) == "E_BAD_BODY IDENTIFY output buffer timeout (%d) is invalid" % value


@pytest.mark.parametrize("value, effective", [(0, 16384), (64, 64), (65536, 65536)])
def test_negotiate_output_buffer_size_ok(value, effective):
    s = negotiate(output_buffer_size=value)
    assert s["output_buffer_size"] == effective
    assert s["output_buffer_timeout_ms"] == 250


def test_negotiate_output_buffer_size_minus_one_forces_unbuffered():
    s = negotiate(output_buffer_size=-1, output_buffer_timeout=100)
    assert (s["output_buffer_size"], s["output_buffer_timeout_ms"]) == (1, 0)


@pytest.mark.parametrize("value", [-2, 1, 63, 65537])
def test_negotiate_output_buffer_size_invalid(value):
    assert negotiate_error(output_buffer_size=value) == "E_BAD_BODY IDENTIFY output buffer size (%d) is invalid" % value


@pytest.mark.parametrize("value", [0, 1, 99])
def test_negotiate_sample_rate_ok(value):
    assert negotiate(sample_rate=value)["sample_rate"] == value


@pytest.mark.parametrize("value", [-1, 100, 2147483647, -2147483648])
def test_negotiate_sample_rate_invalid(value):
    assert negotiate_error(sample_rate=value) == "E_BAD_BODY IDENTIFY sample rate (%d) is invalid" % value


@pytest.mark.parametrize("value, effective", [(0, 60000), (1000, 1000), (900000, 900000)])
def test_negotiate_msg_timeout_ok(value, effective):
    assert negotiate(msg_timeout=value)["msg_timeout_ms"] == effective


@pytest.mark.parametrize("value", [-1, 1, 999, 900001])
def test_negotiate_msg_timeout_invalid(value):
    assert negotiate_error(msg_timeout=value) == "E_BAD_BODY IDENTIFY msg timeout (%d) is invalid" % value


def test_negotiate_validation_order():
    bad = dict(heartbeat_interval=1, output_buffer_timeout=1, output_buffer_size=1, sample_rate=100, msg_timeout=1)
    expected = [
        ("heartbeat_interval", "heartbeat interval (1)"),
        ("output_buffer_timeout", "output buffer timeout (1)"),
        ("output_buffer_size", "output buffer size (1)"),
        ("sample_rate", "sample rate (100)"),
        ("msg_timeout", "msg timeout (1)"),
    ]
    for key, what in expected:
        assert negotiate_error(**bad) == "E_BAD_BODY IDENTIFY %s is invalid" % what
        del bad[key]
    assert negotiate(**bad) == DEFAULTS


def test_negotiate_output_buffer_timeout_is_checked_before_size_minus_one():
    assert (
        negotiate_error(output_buffer_size=-1, output_buffer_timeout=5)
        == "E_BAD_BODY IDENTIFY output buffer timeout (5) is invalid"
    )


def test_negotiate_bounds_follow_the_options():
    opts = Options(
        node_id=1,
        max_heartbeat_interval=2.5,
        min_output_buffer_timeout=0.01,
        max_output_buffer_timeout=0.5,
        output_buffer_timeout=0.1,
        max_output_buffer_size=128,
        msg_timeout=1.5,
        max_msg_timeout=2.0,
    )
    assert negotiate(opts) == {
        "heartbeat_interval_ms": 30000,  # the default is client_timeout / 2, not bounded by the max
        "output_buffer_timeout_ms": 100,
        "output_buffer_size": 16384,
        "sample_rate": 0,
        "msg_timeout_ms": 1500,
    }
    assert negotiate(opts, heartbeat_interval=2500)["heartbeat_interval_ms"] == 2500
    assert negotiate_error(opts, heartbeat_interval=2501) == "E_BAD_BODY IDENTIFY heartbeat interval (2501) is invalid"
    assert negotiate(opts, output_buffer_timeout=10)["output_buffer_timeout_ms"] == 10
    assert negotiate_error(opts, output_buffer_timeout=9) == "E_BAD_BODY IDENTIFY output buffer timeout (9) is invalid"
    assert negotiate(opts, output_buffer_timeout=500)["output_buffer_timeout_ms"] == 500
    assert negotiate_error(opts, output_buffer_timeout=501) == "E_BAD_BODY IDENTIFY output buffer timeout (501) is invalid"
    assert negotiate(opts, output_buffer_size=128)["output_buffer_size"] == 128
    assert negotiate_error(opts, output_buffer_size=129) == "E_BAD_BODY IDENTIFY output buffer size (129) is invalid"
    assert negotiate(opts, msg_timeout=2000)["msg_timeout_ms"] == 2000
    assert negotiate_error(opts, msg_timeout=2001) == "E_BAD_BODY IDENTIFY msg timeout (2001) is invalid"


def test_negotiate_millisecond_bounds_are_exact():
    # Durations are float seconds here but integer nanoseconds in Go:
    # 1.001 s must allow exactly 1001 ms (1.001 * 1000 == 1000.9999999999999).
    opts = Options(node_id=1, msg_timeout=1.0, max_msg_timeout=1.001, max_heartbeat_interval=2.002)
    assert negotiate(opts, msg_timeout=1001)["msg_timeout_ms"] == 1001
    assert negotiate_error(opts, msg_timeout=1002) == "E_BAD_BODY IDENTIFY msg timeout (1002) is invalid"
    assert negotiate(opts, heartbeat_interval=2002)["heartbeat_interval_ms"] == 2002
    assert negotiate(Options(node_id=1, msg_timeout=1.001), msg_timeout=0)["msg_timeout_ms"] == 1001
    settings = negotiate(opts)
    assert json.loads(protocol.identify_response(settings, opts))["max_msg_timeout"] == 1001


# -- IDENTIFY response -----------------------------------------------------

SPEC_RESPONSE = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
    b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
    b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,"output_buffer_timeout":250,'
    b'"topology_region":"","topology_zone":""}'
)


def test_identify_response_matches_the_verified_example():
    opts = Options(node_id=1)
    assert protocol.identify_response(protocol.negotiate_identify({}, opts), opts) == SPEC_RESPONSE


def test_identify_response_reflects_client_settings_and_options():
    opts = Options(node_id=1, max_rdy_count=5, max_msg_timeout=120.0, topology_region="r1", topology_zone="z1")
    settings = protocol.negotiate_identify(
        {"output_buffer_size": -1, "sample_rate": 7, "msg_timeout": 2000}, opts
    )
    doc = json.loads(protocol.identify_response(settings, opts))
    assert list(doc) == list(json.loads(SPEC_RESPONSE))
    assert doc["max_rdy_count"] == 5
    assert doc["max_msg_timeout"] == 120000
    assert doc["msg_timeout"] == 2000
    assert doc["sample_rate"] == 7
    assert doc["output_buffer_size"] == 1
    assert doc["output_buffer_timeout"] == 0
    assert (doc["topology_region"], doc["topology_zone"]) == ("r1", "z1")


@pytest.mark.parametrize(
    "deflate, requested, max_level, level",
    [
        (False, 0, 6, 6),
        (False, 3, 6, 6),  # a requested level only counts when deflate was negotiated
        (False, 9, 9, 6),
        (False, -5, 6, 6),
        (False, 0, 4, 4),  # clamped even when deflate is false
        (True, 0, 6, 6),
        (True, -1, 6, 6),
        (True, 3, 6, 3),
        (True, 9, 6, 6),
        (True, 9, 9, 9),
    ],
)
def test_deflate_level_negotiation(deflate, requested, max_level, level):
    assert protocol.deflate_level(deflate, requested, max_level) == level


def test_identify_response_deflate_level_field():
    opts = Options(node_id=1, max_deflate_level=4)
    settings = protocol.negotiate_identify({}, opts)
    doc = json.loads(protocol.identify_response(settings, opts, deflate_level=4))
    assert (doc["deflate_level"], doc["max_deflate_level"]) == (4, 4)


def test_identify_response_strings_are_encoded_like_go():
    # encoding/json escapes <, >, & (HTML-safe) and U+2028/9, writes other
    # non-ASCII as UTF-8, and has no \b or \f short forms (Go 1.19).
    opts = Options(node_id=1, topology_region="a<b>&c\u2028\u2029", topology_zone="\u00e9\x08\x0c\x01\x7f\"\\/")
    out = protocol.identify_response(protocol.negotiate_identify({}, opts), opts)
    assert out.endswith(
        b'"topology_region":"a\\u003cb\\u003e\\u0026c\\u2028\\u2029",'
        b'"topology_zone":"\xc3\xa9\\u0008\\u000c\\u0001\x7f\\"\\\\/"}'
    )
    assert json.loads(out)["topology_zone"] == "\u00e9\x08\x0c\x01\x7f\"\\/"


# -- durations and Go JSON strings -----------------------------------------


@pytest.mark.parametrize(
    "seconds, ns, ms",
    [
        (0.0, 0, 0),
        (0.025, 25000000, 25),
        (0.25, 250000000, 250),
        (1.001, 1001000000, 1001),
        (2.002, 2002000000, 2002),
        (60.0, 60000000000, 60000),
        (900.0, 900000000000, 900000),
        (3600.0, 3600000000000, 3600000),
        (0.0015, 1500000, 1),  # Go's d / time.Millisecond truncates
        (0.000999, 999000, 0),
    ],
)
def test_duration_conversions_are_exact(seconds, ns, ms):
    assert gocompat.ns(seconds) == ns
    assert gocompat.ms(seconds) == ms


@pytest.mark.parametrize(
    "value, encoded",
    [
        ("", '""'),
        ("1.3.0", '"1.3.0"'),
        ('a"b\\c/d', '"a\\"b\\\\c/d"'),
        ("\n\r\t", '"\\n\\r\\t"'),
        ("\x00\x08\x0c\x1f", '"\\u0000\\u0008\\u000c\\u001f"'),
        ("<>&", '"\\u003c\\u003e\\u0026"'),
        ("\u2028\u2029", '"\\u2028\\u2029"'),
        ("\x7f\u00e9\U0001f600", '"\x7f\u00e9\U0001f600"'),
        ("\udcff", '"\\ufffd"'),
    ],
)
def test_go_json_string(value, encoded):
    assert gocompat.go_json_string(value) == encoded


@pytest.mark.timeout(10)
def test_fin_run_takes_the_plain_fin_lines_buffered_at_the_position():
    a, b, c = b"0" * 16, b"1" * 16, b"2" * 16
    buf = bytearray(b"xxFIN " + a + b"\nFIN " + b + b"\nFIN " + c[:8])
    assert protocol.fin_run(buf, 2) == ([a, b], 2 + 42)  # the partial third line waits
    assert protocol.fin_run(buf, 0) == ([], 0)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "line",
    [
        b"FIN 0123456789abcde\r\n",  # parse_line drops a trailing \r: a 15-byte id
        b"FIN 0123456 89abcdef\n",  # two params
        b"FIN  123456789abcdef\n",
        b"RDY 100\n",
        b"FIN 0123456789abcdef0\n",  # 17 bytes
    ],
)
def test_fin_run_stops_at_a_line_that_is_not_a_plain_fin(line):
    good = b"FIN " + b"f" * 16 + b"\n"
    assert protocol.fin_run(bytearray(good + line + good), 0) == ([b"f" * 16], 21)
