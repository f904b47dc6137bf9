"""Pure tests of nsqd_threaded.wire.protocol_v2: frames, message payloads, command lines, names, sizes, MPUB bodies."""

import collections
import struct
import sys

import pytest

from nsqd_threaded.internal import gocompat
from nsqd_threaded.wire import protocol_v2
from nsqd_threaded.wire import message
from nsqd_threaded.wire.message import Message
from nsqd_threaded.wire.protocol_v2 import ProtocolError

from support.v2 import protocol_error

# -- frames ------------------------------------------------------------------


def test_frame_type_constants():
    assert (protocol_v2.FRAME_TYPE_RESPONSE, protocol_v2.FRAME_TYPE_ERROR, protocol_v2.FRAME_TYPE_MESSAGE) == (0, 1, 2)
    assert protocol_v2.MAGIC_V2 == b"\x20\x20\x56\x32"
    assert protocol_v2.MAX_LINE == 16384
    assert protocol_v2.MSG_ID_LENGTH == 16
    assert protocol_v2.MSG_HEADER_LENGTH == 26


def test_bad_protocol_frame_verified_bytes():
    expected = bytes.fromhex("00000012 00000001 455f4241445f50524f544f434f4c")
    assert protocol_v2.BAD_PROTOCOL_FRAME == expected
    assert protocol_v2.frame(protocol_v2.FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL") == expected


def test_heartbeat_frame_verified_bytes():
    expected = bytes.fromhex("0000000f 00000000 5f6865617274626561745f")
    assert protocol_v2.HEARTBEAT_FRAME == expected
    assert protocol_v2.response_frame(b"_heartbeat_") == expected


def test_ok_and_close_wait_frames():
    assert protocol_v2.OK_FRAME == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert protocol_v2.CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"


def test_empty_frame():
    assert protocol_v2.frame(0, b"") == b"\x00\x00\x00\x04\x00\x00\x00\x00"


def test_error_frame_is_code_space_description():
    err = ProtocolError("E_INVALID", "invalid command ")
    assert err.data == b"E_INVALID invalid command "
    assert protocol_v2.error_frame(err) == b"\x00\x00\x00\x1e\x00\x00\x00\x01E_INVALID invalid command "


def test_error_frame_keeps_raw_bytes_from_the_wire():
    # Descriptions built with protocol_v2.text() keep the client's bytes exactly.
    err = ProtocolError("E_INVALID", "invalid command %s" % protocol_v2.text(b"\xff\xfe"))
    assert err.data == b"E_INVALID invalid command \xff\xfe"
    assert protocol_v2.error_frame(err)[8:] == err.data


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
    assert protocol_v2.decode_frame(protocol_v2.OK_FRAME) == (0, b"OK")
    assert protocol_v2.decode_frame(protocol_v2.BAD_PROTOCOL_FRAME) == (1, b"E_BAD_PROTOCOL")
    # Trailing bytes after the frame are not part of it.
    assert protocol_v2.decode_frame(protocol_v2.OK_FRAME + b"junk") == (0, b"OK")


def test_split_frames_complete_and_partial():
    data = protocol_v2.OK_FRAME + protocol_v2.HEARTBEAT_FRAME + protocol_v2.CLOSE_WAIT_FRAME
    frames, used = protocol_v2.split_frames(data)
    assert frames == [(0, b"OK"), (0, b"_heartbeat_"), (0, b"CLOSE_WAIT")]
    assert used == len(data)
    for cut in range(len(data) + 1):
        frames, used = protocol_v2.split_frames(bytearray(data[:cut]))
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
    assert protocol_v2.decode_message(PAYLOAD) == (TS, 0, MSG_ID, b"dd")
    assert protocol_v2.decode_message(bytearray(PAYLOAD)) == (TS, 0, MSG_ID, b"dd")
    assert protocol_v2.decode_message(memoryview(PAYLOAD)) == (TS, 0, MSG_ID, b"dd")


def test_encode_message_is_the_verified_disk_record():
    assert protocol_v2.encode_message(TS, 0, MSG_ID, b"dd") == PAYLOAD


def test_message_frame_is_size_type_payload():
    [wire] = protocol_v2.message_frames([Message(MSG_ID, b"dd", TS)], sys.maxsize)
    assert wire == b"\x00\x00\x00\x20\x00\x00\x00\x02" + PAYLOAD  # 4 + 26 + 2 = 32
    assert wire == protocol_v2.frame(protocol_v2.FRAME_TYPE_MESSAGE, PAYLOAD)
    assert protocol_v2.decode_frame(wire) == (2, PAYLOAD)


def test_message_frames_are_joined_into_chunks_of_at_least_the_limit():
    msgs = [Message(b"%016d" % i, b"x" * 10, TS, i) for i in range(5)]
    frame_size = 4 + protocol_v2.MSG_HEADER_LENGTH + 4 + 10  # 44
    chunks = list(protocol_v2.message_frames(msgs, 2 * frame_size - 8))  # (sizes count from the frame type on)
    assert [len(c) for c in chunks] == [2 * frame_size, 2 * frame_size, frame_size]
    frames, used = protocol_v2.split_frames(b"".join(chunks))
    assert used == 5 * frame_size
    assert [protocol_v2.decode_message(data) for _, data in frames] == [
        (TS, i, b"%016d" % i, b"x" * 10) for i in range(5)
    ]
    assert list(protocol_v2.message_frames([], 1)) == []


def test_joined_message_frames_are_message_frames_in_one_chunk():
    msgs = [Message(b"%016d" % i, b"x" * i, TS, i) for i in range(5)]
    assert protocol_v2.joined_message_frames(msgs) == b"".join(protocol_v2.message_frames(msgs, 1))
    assert protocol_v2.joined_message_frames([]) == b""


def test_message_attempts_and_body_edges():
    payload = protocol_v2.encode_message(1, 65535, MSG_ID, b"")
    assert payload == b"\x00" * 7 + b"\x01" + b"\xff\xff" + MSG_ID
    assert protocol_v2.decode_message(payload) == (1, 65535, MSG_ID, b"")
    body = bytes(range(256)) * 3
    payload = protocol_v2.encode_message(-1, 1, MSG_ID, body)
    assert payload[:8] == b"\xff" * 8  # int64, signed
    assert protocol_v2.decode_message(payload) == (-1, 1, MSG_ID, body)


def test_decode_message_too_short():
    with pytest.raises(ValueError):
        protocol_v2.decode_message(PAYLOAD[:25])
    with pytest.raises(ValueError):
        protocol_v2.decode_message(b"")
    assert protocol_v2.decode_message(PAYLOAD[:26]) == (TS, 0, MSG_ID, b"")


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
    assert protocol_v2.parse_line(line) == params


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
    assert protocol_v2.parse_uint(raw) == value


def test_parse_uint_is_unbounded_and_int64_wraps_like_go():
    n = protocol_v2.parse_uint(b"9" * 30)
    assert n == 10**30 - 1
    assert protocol_v2.int64(2**64 - 1) == -1
    assert protocol_v2.int64(2**63) == -(2**63)
    assert protocol_v2.int64(2**63 - 1) == 2**63 - 1
    assert protocol_v2.int64(2**64 + 5) == 5
    assert protocol_v2.int64(-1) == -1
    # REQ/DPUB: time.Duration(ms) * time.Millisecond overflows in int64.
    assert protocol_v2.int64(9223372036855 * 1000000) < 0


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
    assert protocol_v2.decode_size(raw) == value
    assert protocol_v2.encode_size(value) == raw


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
    assert protocol_v2.is_valid_name(name) is valid
    assert protocol_v2.is_valid_name(name.encode("utf-8")) is valid


def test_is_valid_name_rejects_non_utf8_bytes():
    assert protocol_v2.is_valid_name(b"\xff") is False
    assert protocol_v2.is_valid_name(b"ab\x80") is False


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
    assert gocompat.go_quote(protocol_v2.text(b"\xff")) == '"\\xff"'


def test_text_round_trips_wire_bytes():
    raw = b"\xff\x00abc\xe2\x82"
    assert protocol_v2.text(raw).encode("utf-8", "surrogateescape") == raw


# -- size checks -----------------------------------------------------------


def test_check_body_size_identify_auth():
    protocol_v2.check_body_size("IDENTIFY", 1, 5)
    protocol_v2.check_body_size("IDENTIFY", 5, 5)  # equal is allowed
    assert protocol_error(protocol_v2.check_body_size, "IDENTIFY", 6, 5) == "E_BAD_BODY IDENTIFY body too big 6 > 5"
    assert protocol_error(protocol_v2.check_body_size, "IDENTIFY", 0, 5) == "E_BAD_BODY IDENTIFY invalid body size 0"
    assert (
        protocol_error(protocol_v2.check_body_size, "AUTH", -2147483648, 5242880)
        == "E_BAD_BODY AUTH invalid body size -2147483648"
    )
    assert protocol_error(protocol_v2.check_body_size, "AUTH", 5242881, 5242880) == "E_BAD_BODY AUTH body too big 5242881 > 5242880"
    # Order: "too big" is checked before "<= 0" (only observable with a negative max).
    assert protocol_error(protocol_v2.check_body_size, "IDENTIFY", -3, -5) == "E_BAD_BODY IDENTIFY body too big -3 > -5"


def test_check_message_size_pub_dpub():
    protocol_v2.check_message_size("PUB", 1, 10)
    protocol_v2.check_message_size("PUB", 10, 10)  # equal is allowed
    assert protocol_error(protocol_v2.check_message_size, "PUB", 0, 10) == "E_BAD_MESSAGE PUB invalid message body size 0"
    assert protocol_error(protocol_v2.check_message_size, "PUB", -1, 10) == "E_BAD_MESSAGE PUB invalid message body size -1"
    assert protocol_error(protocol_v2.check_message_size, "PUB", 11, 10) == "E_BAD_MESSAGE PUB message too big 11 > 10"
    assert protocol_error(protocol_v2.check_message_size, "DPUB", 0, 10) == "E_BAD_MESSAGE DPUB invalid message body size 0"
    assert protocol_error(protocol_v2.check_message_size, "DPUB", 11, 10) == "E_BAD_MESSAGE DPUB message too big 11 > 10"
    # Order: "<= 0" before "too big".
    assert protocol_error(protocol_v2.check_message_size, "PUB", -3, -5) == "E_BAD_MESSAGE PUB invalid message body size -3"


def test_check_mpub_body_size():
    protocol_v2.check_mpub_body_size(1, 10)
    protocol_v2.check_mpub_body_size(10, 10)
    assert protocol_error(protocol_v2.check_mpub_body_size, 0, 10) == "E_BAD_BODY MPUB invalid body size 0"
    assert protocol_error(protocol_v2.check_mpub_body_size, -2147483648, 10) == "E_BAD_BODY MPUB invalid body size -2147483648"
    assert protocol_error(protocol_v2.check_mpub_body_size, 11, 10) == "E_BAD_BODY MPUB body too big 11 > 10"
    assert protocol_error(protocol_v2.check_mpub_body_size, -3, -5) == "E_BAD_BODY MPUB invalid body size -3"


def test_check_mpub_count():
    # (max_body_size - 4) // 5: 104 -> 20
    protocol_v2.check_mpub_count(1, 104)
    protocol_v2.check_mpub_count(20, 104)
    assert protocol_error(protocol_v2.check_mpub_count, 21, 104) == "E_BAD_BODY MPUB invalid message count 21"
    assert protocol_error(protocol_v2.check_mpub_count, 0, 104) == "E_BAD_BODY MPUB invalid message count 0"
    assert protocol_error(protocol_v2.check_mpub_count, -1, 104) == "E_BAD_BODY MPUB invalid message count -1"
    # integer division: 108 -> 20, 109 -> 21
    assert protocol_error(protocol_v2.check_mpub_count, 21, 108) == "E_BAD_BODY MPUB invalid message count 21"
    protocol_v2.check_mpub_count(21, 109)
    protocol_v2.check_mpub_count(1048575, 5242880)
    assert protocol_error(protocol_v2.check_mpub_count, 1048576, 5242880) == "E_BAD_BODY MPUB invalid message count 1048576"


# -- MPUB body -------------------------------------------------------------


def test_encode_mpub_body():
    assert protocol_v2.encode_mpub_body([b"a", b"bc"]) == (
        b"\x00\x00\x00\x02" b"\x00\x00\x00\x01a" b"\x00\x00\x00\x02bc"
    )


def test_parse_mpub_messages_whole_buffer():
    items = protocol_v2.encode_mpub_body([b"a", b"bc", b"def"])[4:]
    out = []
    pos = protocol_v2.parse_mpub_messages(items, 0, len(items), 0, 3, 10, out)
    assert out == [b"a", b"bc", b"def"]
    assert pos == len(items)
    assert all(type(b) is bytes for b in out)


def test_parse_mpub_messages_stops_after_count():
    items = protocol_v2.encode_mpub_body([b"a", b"bc"])[4:] + b"NOP\n"
    out = []
    pos = protocol_v2.parse_mpub_messages(items, 0, len(items), 0, 2, 10, out)
    assert out == [b"a", b"bc"]
    assert items[pos:] == b"NOP\n"  # the rest is the next command


def test_parse_mpub_messages_respects_pos_and_end():
    items = b"XXXX" + protocol_v2.encode_mpub_body([b"a", b"bc"])[4:] + b"YY"
    out = []
    pos = protocol_v2.parse_mpub_messages(items, 4, len(items) - 2, 0, 2, 10, out)
    assert out == [b"a", b"bc"] and pos == len(items) - 2


def test_parse_mpub_messages_resumes_at_every_cut():
    bodies = [b"a", b"bc", b"", b"def"]
    bodies[2] = b"g" * 9
    items = protocol_v2.encode_mpub_body(bodies)[4:]
    for cut in range(len(items) + 1):
        buf = bytearray(items[:cut])
        out = []
        pos = protocol_v2.parse_mpub_messages(buf, 0, len(buf), 0, 4, 10, out)
        # Only complete items, and pos right after the last of them.
        assert pos == sum(4 + len(b) for b in out)
        assert out == bodies[: len(out)]
        buf += items[cut:]  # the memoryview is released: the buffer can grow
        pos = protocol_v2.parse_mpub_messages(buf, pos, len(buf), len(out), 4, 10, out)
        assert out == bodies
        assert pos == len(items)


def test_parse_mpub_messages_incomplete_header_consumes_nothing():
    out = []
    assert protocol_v2.parse_mpub_messages(b"\x00\x00\x00", 0, 3, 0, 1, 10, out) == 0
    assert out == []
    assert protocol_v2.parse_mpub_messages(b"\x00\x00\x00\x05ab", 0, 6, 0, 1, 10, out) == 0
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
        protocol_v2.parse_mpub_messages(items, 0, len(items), index, index + 3, 10, [])
    assert info.value.fatal
    assert "%s %s" % (info.value.code, info.value.description) == error


def test_parse_mpub_messages_agrees_with_the_item_by_item_rule_on_random_buffers():
    """Runs of one size (taken by column) and mixed sizes (walked) give what reading item by item gives:
    the same bodies, position and error, from any start and any cut, in bytes and bytearray, whatever
    ``expected`` says (after an error, ``out`` is not looked at: the MPUB fails as a whole)."""
    import random

    def by_item(buf, pos, end, index, count, limit):
        out = []
        while index < count and end - pos >= 4:
            size = struct.unpack_from(">i", buf, pos)[0]
            if size <= 0:
                return out, pos, "E_BAD_MESSAGE MPUB invalid message(%d) body size %d" % (index, size)
            if size > limit:
                return out, pos, "E_BAD_MESSAGE MPUB message too big %d > %d" % (size, limit)
            if end - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
            index += 1
        return out, pos, None

    rng = random.Random(11)
    for _ in range(3000):
        sizes = []
        while len(sizes) < rng.randrange(0, 30):
            sizes += [rng.choice((1, 2, 3, 7, 10, 11, 0, -1, 256))] * rng.choice((1, 1, 2, 5, 20))
        items = b"".join(struct.pack(">i", s) + bytes(rng.randrange(256) for _ in range(max(s, 0)))
                         for s in sizes)
        lead = rng.randrange(0, 3)
        buf = b"x" * lead + items + b"NOP\n"
        end = rng.randrange(lead, len(buf) + 1)
        index = rng.randrange(0, 3)
        count = index + rng.randrange(0, len(sizes) + 2)
        limit = rng.choice((10, 300))
        expected = rng.choice((None, 0, -3, len(items), rng.randrange(1, len(items) + 2)))
        want, want_pos, want_error = by_item(buf, lead, end, index, count, limit)
        for form in (bytes, bytearray):
            out = []
            try:
                pos = protocol_v2.parse_mpub_messages(form(buf), lead, end, index, count, limit, out, expected)
            except ProtocolError as e:
                assert "%s %s" % (e.code, e.description) == want_error, (sizes, lead, end, index, count)
            else:
                assert want_error is None and (out, pos) == (want, want_pos), (sizes, lead, end, index, count)
                assert all(type(b) is bytes for b in out)


def test_parse_mpub_messages_size_equal_to_max_is_allowed():
    items = b"\x00\x00\x00\x0a" + b"z" * 10
    out = []
    assert protocol_v2.parse_mpub_messages(items, 0, len(items), 0, 1, 10, out) == 14
    assert out == [b"z" * 10]


def test_copy_batches_give_each_channel_its_own_messages_with_attempts_zero():
    originals = [Message(b"%016d" % i, b"body-%d" % i, TS, 3) for i in range(3)]
    originals.append(Message(b"%016d" % 9, b"later", TS + 1, 2))  # (a timestamp of its own)
    for form in (message.MESSAGES, message.DEFERRED):
        copies = message.copy_batches(originals[:3], form, 2) + message.copy_batches(originals, form, 1)
        assert len(copies) == 3
        for batch, source in zip(copies, (originals[:3], originals[:3], originals)):
            assert all(c is not m for c in batch for m in originals)
            assert [(c.id, c.body, c.timestamp, c.attempts) for c in batch] == [
                (m.id, m.body, m.timestamp, 0) for m in source]
        assert copies[0][0] is not copies[1][0]
    deferred = Message(b"%016d" % 5, b"d", TS, 1, 7000)
    [[copy, record]] = message.copy_batches([deferred, b"record"], message.DEFERRED, 1)
    assert (copy.deferred_ns, record) == (7000, b"record")
    assert message.copy_batches([], message.MESSAGES, 2) == [[], []]


def test_from_records_returns_a_list_of_messages_itself_and_copies_anything_else():
    msgs = [Message(MSG_ID, b"dd", TS)]
    assert message.from_records(msgs) is msgs
    queue = collections.deque(msgs)
    got = message.from_records(queue)
    assert got == msgs and type(got) is list
    [converted, kept] = message.from_records([PAYLOAD, msgs[0]])
    assert (converted.id, converted.body, converted.timestamp, kept) == (MSG_ID, b"dd", TS, msgs[0])
