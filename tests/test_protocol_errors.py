"""Every error of tcp-protocol.md §5/§6/§7 over real sockets, against the in-process broker.

Each case checks the exact error frame text and whether the connection is
closed (fatal) or keeps working (E_FIN_FAILED / E_REQ_FAILED / E_TOUCH_FAILED).
AUTH-with-an-auth-server and TLS rows are out of scope (not implemented).
"""

import json
import socket
import struct
import time

import pytest

from nsqd_threaded.wire import protocol
from nsqd_threaded.storage.backend import BackendError
from wire import Conn, wait_for

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


# -- §1 connection start -----------------------------------------------------


@pytest.mark.parametrize("magic", [b"  V1", b"V2  ", b"\x00\x00\x00\x00", b"GET "])
def test_bad_magic_gets_exact_bad_protocol_frame_then_close(nsqd, magic):
    with Conn(nsqd.tcp_address, magic=magic) as c:
        assert read_all_until_closed(c) == bytes.fromhex("00000012 00000001 455f4241445f50524f544f434f4c")


def test_http_request_to_the_tcp_port(nsqd):
    with Conn(nsqd.tcp_address, magic=None) as c:
        c.send(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_all_until_closed(c) == protocol.BAD_PROTOCOL_FRAME


def test_magic_in_pieces_is_accepted_and_answers_nothing(nsqd):
    with Conn(nsqd.tcp_address, magic=None) as c:
        for b in b"  V2":
            c.send(bytes([b]))
        c.assert_silent()
        assert c.pub("magic_pieces", b"x") == b"OK"


def test_eof_inside_the_magic_closes_silently(nsqd):
    with Conn(nsqd.tcp_address, magic=b"  V") as c:
        half_close(c)
        assert read_all_until_closed(c) == b""
    with Conn(nsqd.tcp_address) as c:  # the broker is unaffected
        assert c.pub("after_partial_magic", b"x") == b"OK"


def test_eof_while_waiting_for_a_line_is_a_clean_close(conn):
    conn.cmd(b"NOP")
    conn.send(b"PUB")  # partial line, then EOF
    half_close(conn)
    assert read_all_until_closed(conn) == b""


# -- §2 command grammar ------------------------------------------------------


def test_empty_line_is_invalid_command_with_trailing_space(conn):
    conn.send(b"\n")
    fatal(conn, "E_INVALID invalid command ")


def test_crlf_empty_line(conn):
    conn.send(b"\r\n")
    fatal(conn, "E_INVALID invalid command ")


def test_command_names_are_case_sensitive(conn):
    conn.cmd(b"nop")
    fatal(conn, "E_INVALID invalid command nop")


def test_unknown_command_names_only_the_first_param(conn):
    conn.cmd(b"FOO bar baz")
    fatal(conn, "E_INVALID invalid command FOO")


def test_unknown_command_raw_bytes_are_echoed(conn):
    conn.cmd(b"\xff\xfeX")
    ft, data = conn.read_frame()
    assert (ft, data) == (1, b"E_INVALID invalid command \xff\xfeX")
    conn.assert_closed()


def test_tab_is_not_a_separator(conn):
    conn.cmd(b"NOP\tx")
    fatal(conn, "E_INVALID invalid command NOP\tx")


def test_leading_space_makes_an_empty_command(conn):
    conn.cmd(b" NOP")
    fatal(conn, "E_INVALID invalid command ")


def test_crlf_lines_are_accepted(conn):
    conn.send(b"NOP\r\n")
    conn.send(b"PUB crlf\r\n" + size(1) + b"x")
    assert conn.read_response() == b"OK"


def test_double_space_gives_an_empty_topic(conn):
    conn.cmd(b"PUB  t", b"x")
    fatal(conn, 'E_BAD_TOPIC PUB topic name "" is not valid')


def test_extra_trailing_params_are_ignored(conn):
    conn.cmd(b"PUB extra_params extra more", b"x")
    assert conn.read_response() == b"OK"
    conn.cmd(b"NOP ignored")
    assert conn.pub("extra_params", b"y") == b"OK"


def test_nop_answers_nothing(conn):
    conn.cmd(b"NOP")
    conn.assert_silent()
    assert conn.pub("nop", b"x") == b"OK"


def test_line_of_16384_bytes_without_newline_closes_without_error_frame(conn):
    conn.send(b"X" * 16384)
    assert read_all_until_closed(conn) == b""


def test_line_of_16384_bytes_plus_newline_closes_without_error_frame(conn):
    conn.send(b"X" * 16384 + b"\n")
    assert read_all_until_closed(conn) == b""


def test_line_of_16383_bytes_plus_newline_is_read(conn):
    conn.send(b"X" * 16383 + b"\n")
    fatal(conn, "E_INVALID invalid command " + "X" * 16383)


def test_long_line_after_other_commands(conn):
    # The limit is per line, whatever was buffered before it.
    assert conn.pub("before_long", b"x") == b"OK"
    conn.send(b"NOP\n" + b"PUB " + b"t" * 16379 + b"\n")
    fatal(conn, 'E_BAD_TOPIC PUB topic name "%s" is not valid' % ("t" * 16379))


# -- §6 state machine --------------------------------------------------------


@pytest.mark.parametrize(
    "line, text",
    [
        (b"RDY 1", "E_INVALID cannot RDY in current state"),
        (b"FIN " + NOT_IN_FLIGHT_ID, "E_INVALID cannot FIN in current state"),
        (b"REQ " + NOT_IN_FLIGHT_ID + b" 0", "E_INVALID cannot REQ in current state"),
        (b"TOUCH " + NOT_IN_FLIGHT_ID, "E_INVALID cannot TOUCH in current state"),
        (b"CLS", "E_INVALID cannot CLS in current state"),
        # The state check comes before the parameter checks.
        (b"FIN", "E_INVALID cannot FIN in current state"),
        (b"REQ", "E_INVALID cannot REQ in current state"),
        (b"TOUCH", "E_INVALID cannot TOUCH in current state"),
        (b"RDY -1", "E_INVALID cannot RDY in current state"),
    ],
)
def test_commands_refused_in_init(conn, line, text):
    conn.cmd(line)
    fatal(conn, text)


def test_identify_after_sub(nsqd):
    with consumer(nsqd, "id_after_sub") as c:
        c.cmd(b"IDENTIFY", b"{}")
        fatal(c, "E_INVALID cannot IDENTIFY in current state")


def test_identify_state_is_checked_before_reading_the_body(nsqd):
    with consumer(nsqd, "id_after_sub2") as c:
        c.cmd(b"IDENTIFY")  # no body at all
        fatal(c, "E_INVALID cannot IDENTIFY in current state")


def test_auth_after_sub(nsqd):
    with consumer(nsqd, "auth_after_sub") as c:
        c.cmd(b"AUTH", b"secret")
        fatal(c, "E_INVALID cannot AUTH in current state")


def test_sub_twice(nsqd):
    with consumer(nsqd, "sub_twice") as c:
        c.cmd(b"SUB sub_twice other")
        fatal(c, "E_INVALID cannot SUB in current state")


def test_sub_with_heartbeats_disabled(conn):
    assert conn.identify(heartbeat_interval=-1) == b"OK"
    conn.cmd(b"SUB hb_disabled c")
    fatal(conn, "E_INVALID cannot SUB with heartbeats disabled")


def test_sub_heartbeat_check_comes_before_param_count(conn):
    assert conn.identify(heartbeat_interval=-1) == b"OK"
    conn.cmd(b"SUB")
    fatal(conn, "E_INVALID cannot SUB with heartbeats disabled")


def test_cls_answers_close_wait_and_keeps_the_socket(nsqd):
    with consumer(nsqd, "cls") as c:
        c.cmd(b"CLS")
        assert c.read_response() == b"CLOSE_WAIT"
        c.assert_silent()
        assert c.pub("cls", b"x") == b"OK"


def test_cls_twice(nsqd):
    with consumer(nsqd, "cls_twice") as c:
        c.cmd(b"CLS")
        assert c.read_response() == b"CLOSE_WAIT"
        c.cmd(b"CLS")
        fatal(c, "E_INVALID cannot CLS in current state")


@pytest.mark.parametrize("line", [b"RDY 1", b"RDY 10", b"RDY", b"RDY -1", b"RDY 999999999"])
def test_rdy_in_closing_is_silently_ignored(nsqd, line):
    with consumer(nsqd, "rdy_closing") as c:
        c.cmd(b"CLS")
        assert c.read_response() == b"CLOSE_WAIT"
        c.cmd(line)
        c.assert_silent()
        publish(nsqd, "rdy_closing", b"not delivered")
        c.assert_silent()  # RDY really was ignored: still 0
        c.cmd(b"NOP")
        assert c.pub("rdy_closing2", b"x") == b"OK"


@pytest.mark.parametrize(
    "line, body, text",
    [
        (b"IDENTIFY", b"{}", "E_INVALID cannot IDENTIFY in current state"),
        (b"AUTH", b"s", "E_INVALID cannot AUTH in current state"),
        (b"SUB t c", None, "E_INVALID cannot SUB in current state"),
        (b"CLS", None, "E_INVALID cannot CLS in current state"),
    ],
)
def test_commands_refused_in_closing(nsqd, line, body, text):
    with consumer(nsqd, "refused_closing") as c:
        c.cmd(b"CLS")
        assert c.read_response() == b"CLOSE_WAIT"
        c.cmd(line, body)
        fatal(c, text)


def test_fin_req_touch_pub_work_in_closing(nsqd):
    c, mid = delivered(nsqd, "closing_works")
    with c:
        c.cmd(b"CLS")
        assert c.read_response() == b"CLOSE_WAIT"
        c.cmd(b"TOUCH " + mid)
        c.cmd(b"FIN " + mid)
        c.assert_silent()
        c.cmd(b"FIN " + mid)
        non_fatal(c, "E_FIN_FAILED FIN %s failed ID not in flight" % mid.decode())
        c.cmd(b"REQ " + mid + b" 0")
        non_fatal(c, "E_REQ_FAILED REQ %s failed ID not in flight" % mid.decode())
        c.cmd(b"MPUB closing_works", protocol.encode_mpub_body([b"a"]))
        assert c.read_response() == b"OK"
        c.cmd(b"DPUB closing_works 0", b"b")
        assert c.read_response() == b"OK"


def test_publishing_works_in_every_state(nsqd):
    with Conn(nsqd.tcp_address) as c:
        assert c.pub("states", b"init") == b"OK"
        c.sub("states", "c")
        assert c.pub("states", b"subscribed") == b"OK"
        assert c.mpub("states", [b"a"]) == b"OK"
        c.cmd(b"DPUB states 0", b"d")
        assert c.read_response() == b"OK"


# -- §7.2 IDENTIFY -----------------------------------------------------------


def test_identify_without_feature_negotiation_answers_ok(conn):
    conn.cmd(b"IDENTIFY", json.dumps({"client_id": "x", "tls_v1": True, "snappy": True}).encode())
    assert conn.read_response() == b"OK"
    conn.assert_silent()
    assert conn.pub("identify_ok", b"x") == b"OK"  # no upgrade happened


def test_identify_params_after_the_name_are_ignored(conn):
    conn.cmd(b"IDENTIFY foo bar", b"{}")
    assert conn.read_response() == b"OK"


def test_identify_feature_negotiation_response_is_the_verified_json(conn):
    conn.cmd(b"IDENTIFY", b'{"feature_negotiation":true}')
    assert conn.read_response() == (
        b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
        b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
        b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,"output_buffer_timeout":250,'
        b'"topology_region":"","topology_zone":""}'
    )
    conn.assert_silent()  # IDENTIFY adds nothing after the JSON
    assert conn.pub("negotiated", b"x") == b"OK"


def test_identify_requested_upgrades_are_not_negotiated(make_nsqd):
    """Without a certificate and with --deflate=false --snappy=false nothing is upgraded."""
    nsqd = make_nsqd(deflate=False, snappy=False)
    conn = Conn(nsqd.tcp_address)
    body = {
        "feature_negotiation": True,
        "tls_v1": True,
        "deflate": True,
        "deflate_level": 3,
        "snappy": True,  # both requested but neither enabled: no error
        "msg_timeout": 5000,
        "sample_rate": 10,
        "output_buffer_size": -1,
    }
    conn.cmd(b"IDENTIFY", json.dumps(body).encode())
    doc = json.loads(conn.read_response())
    assert (doc["tls_v1"], doc["deflate"], doc["snappy"]) == (False, False, False)
    assert doc["deflate_level"] == 6  # the requested level counts only when deflate is negotiated
    assert (doc["msg_timeout"], doc["sample_rate"]) == (5000, 10)
    assert (doc["output_buffer_size"], doc["output_buffer_timeout"]) == (1, 0)
    conn.assert_silent()  # no upgrade OK frame follows
    assert conn.pub("no_upgrade", b"x") == b"OK"
    conn.close()


def test_identify_response_follows_options(make_nsqd):
    nsqd = make_nsqd(max_rdy_count=7, max_deflate_level=3, topology_zone="z")
    with Conn(nsqd.tcp_address) as c:
        c.cmd(b"IDENTIFY", b'{"feature_negotiation":true}')
        doc = json.loads(c.read_response())
        assert (doc["max_rdy_count"], doc["deflate_level"], doc["max_deflate_level"]) == (7, 3, 3)
        assert doc["topology_zone"] == "z"


def test_identify_keys_are_case_insensitive_on_the_wire(conn):
    conn.cmd(b"IDENTIFY", b'{"HEARTBEAT_INTERVAL": 1000}')
    assert conn.read_response() == b"OK"
    start = time.monotonic()
    assert conn.read_frame(skip_heartbeats=False) == (0, b"_heartbeat_")
    assert time.monotonic() - start < 2.0  # the default would be 30 s


def test_identify_null_body_is_accepted(conn):
    conn.cmd(b"IDENTIFY", b"null")
    assert conn.read_response() == b"OK"


@pytest.mark.parametrize(
    "body_size, text",
    [
        (0, "E_BAD_BODY IDENTIFY invalid body size 0"),
        (-1, "E_BAD_BODY IDENTIFY invalid body size -1"),
        (-2147483648, "E_BAD_BODY IDENTIFY invalid body size -2147483648"),
        (101, "E_BAD_BODY IDENTIFY body too big 101 > 100"),
        (2147483647, "E_BAD_BODY IDENTIFY body too big 2147483647 > 100"),
    ],
)
def test_identify_body_size_errors(make_nsqd, body_size, text):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        c.send(b"IDENTIFY\n" + size(body_size))
        fatal(c, text)


def test_identify_body_size_0x80000000_is_negative(conn):
    conn.send(b"IDENTIFY\n" + usize(0x80000000))
    fatal(conn, "E_BAD_BODY IDENTIFY invalid body size -2147483648")


def test_identify_default_max_body_size(conn):
    conn.send(b"IDENTIFY\n" + size(5242881))
    fatal(conn, "E_BAD_BODY IDENTIFY body too big 5242881 > 5242880")


def test_identify_body_size_equal_to_max_is_allowed(make_nsqd):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        body = b'{"client_id":"x"}'.ljust(100)
        c.cmd(b"IDENTIFY", body)
        assert c.read_response() == b"OK"


def test_identify_failed_to_read_body_size(conn):
    conn.send(b"IDENTIFY\n\x00\x00")
    half_close(conn)
    fatal(conn, "E_BAD_BODY IDENTIFY failed to read body size")


def test_identify_failed_to_read_body(conn):
    conn.send(b"IDENTIFY\n" + size(10) + b"{}   ")
    half_close(conn)
    fatal(conn, "E_BAD_BODY IDENTIFY failed to read body")


@pytest.mark.parametrize(
    "body",
    [b"[1]", b"{", b"not json", b'{"heartbeat_interval": 1000.0}', b'{"heartbeat_interval": "1000"}', b'{"a": NaN}'],
)
def test_identify_failed_to_decode_json_body(conn, body):
    conn.cmd(b"IDENTIFY", body)
    fatal(conn, "E_BAD_BODY IDENTIFY failed to decode JSON body")


@pytest.mark.parametrize(
    "fields, text",
    [
        ({"heartbeat_interval": 999}, "E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid"),
        ({"heartbeat_interval": 60001}, "E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid"),
        ({"output_buffer_timeout": 24}, "E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid"),
        ({"output_buffer_timeout": 30001}, "E_BAD_BODY IDENTIFY output buffer timeout (30001) is invalid"),
        ({"output_buffer_size": 63}, "E_BAD_BODY IDENTIFY output buffer size (63) is invalid"),
        ({"output_buffer_size": 65537}, "E_BAD_BODY IDENTIFY output buffer size (65537) is invalid"),
        ({"sample_rate": 100}, "E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
        ({"sample_rate": -1}, "E_BAD_BODY IDENTIFY sample rate (-1) is invalid"),
        ({"msg_timeout": -1}, "E_BAD_BODY IDENTIFY msg timeout (-1) is invalid"),
        ({"msg_timeout": 900001}, "E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
        (
            {"msg_timeout": 1, "sample_rate": 100, "output_buffer_size": 1, "output_buffer_timeout": 1, "heartbeat_interval": 1},
            "E_BAD_BODY IDENTIFY heartbeat interval (1) is invalid",
        ),
    ],
)
def test_identify_field_validation(conn, fields, text):
    conn.cmd(b"IDENTIFY", json.dumps(fields).encode())
    fatal(conn, text)


# -- §7.3 AUTH (no auth server configured) --------------------------------


def test_auth_with_a_param(conn):
    conn.cmd(b"AUTH x")
    fatal(conn, "E_INVALID AUTH invalid number of parameters")


def test_auth_with_a_trailing_space(conn):
    conn.cmd(b"AUTH ", b"secret")
    fatal(conn, "E_INVALID AUTH invalid number of parameters")


def test_auth_disabled_after_reading_the_body(conn):
    conn.cmd(b"AUTH", b"secret")
    fatal(conn, "E_AUTH_DISABLED AUTH disabled")


@pytest.mark.parametrize(
    "body_size, text",
    [
        (0, "E_BAD_BODY AUTH invalid body size 0"),
        (-5, "E_BAD_BODY AUTH invalid body size -5"),
        (101, "E_BAD_BODY AUTH body too big 101 > 100"),
    ],
)
def test_auth_body_size_errors(make_nsqd, body_size, text):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        c.send(b"AUTH\n" + size(body_size))
        fatal(c, text)


def test_auth_body_size_equal_to_max(make_nsqd):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        c.cmd(b"AUTH", b"s" * 100)
        fatal(c, "E_AUTH_DISABLED AUTH disabled")


def test_auth_failed_to_read_body_size(conn):
    conn.send(b"AUTH\n\x00")
    half_close(conn)
    fatal(conn, "E_BAD_BODY AUTH failed to read body size")


def test_auth_failed_to_read_body(conn):
    conn.send(b"AUTH\n" + size(6) + b"sec")
    half_close(conn)
    fatal(conn, "E_BAD_BODY AUTH failed to read body")


# -- §7.4 SUB ----------------------------------------------------------------


@pytest.mark.parametrize("line", [b"SUB", b"SUB t"])
def test_sub_insufficient_params(conn, line):
    conn.cmd(line)
    fatal(conn, "E_INVALID SUB insufficient number of parameters")


@pytest.mark.parametrize(
    "line, text",
    [
        (b"SUB a*b c", 'E_BAD_TOPIC SUB topic name "a*b" is not valid'),
        (b"SUB a*b c!", 'E_BAD_TOPIC SUB topic name "a*b" is not valid'),  # topic first
        (b"SUB  c", 'E_BAD_TOPIC SUB topic name "" is not valid'),
        (b"SUB " + b"t" * 65 + b" c", 'E_BAD_TOPIC SUB topic name "%s" is not valid' % ("t" * 65)),
        (b'SUB a"b c', 'E_BAD_TOPIC SUB topic name "a\\"b" is not valid'),
        (b"SUB a\xffb c", 'E_BAD_TOPIC SUB topic name "a\\xffb" is not valid'),
        (b"SUB a\x07\x0b c", 'E_BAD_TOPIC SUB topic name "a\\a\\v" is not valid'),
        (b"SUB t c!", 'E_BAD_CHANNEL SUB channel name "c!" is not valid'),
        (b"SUB t ", 'E_BAD_CHANNEL SUB channel name "" is not valid'),
        (b"SUB t c#ephemeral#ephemeral", 'E_BAD_CHANNEL SUB channel name "c#ephemeral#ephemeral" is not valid'),
        (b"SUB t " + b"c" * 55 + b"#ephemeral", 'E_BAD_CHANNEL SUB channel name "%s#ephemeral" is not valid' % ("c" * 55)),
        (b"SUB t \xc3\xa9\t", 'E_BAD_CHANNEL SUB channel name "\u00e9\\t" is not valid'),
    ],
)
def test_sub_bad_names(conn, line, text):
    conn.cmd(line)
    fatal(conn, text)


def test_sub_longest_names(conn):
    conn.cmd(b"SUB " + b"t" * 64 + b" " + b"c" * 54 + b"#ephemeral")
    assert conn.read_response() == b"OK"


def test_sub_max_channel_consumers(make_nsqd):
    nsqd = make_nsqd(max_channel_consumers=1)
    with consumer(nsqd, "t", "c"):
        with Conn(nsqd.tcp_address) as second:
            second.cmd(b"SUB t c")
            fatal(second, "E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1")
        with consumer(nsqd, "t", "other"):  # the limit is per channel
            pass


# -- §7.5 RDY ----------------------------------------------------------------


@pytest.mark.parametrize(
    "line, text",
    [
        (b"RDY -1", "E_INVALID RDY could not parse count -1"),
        (b"RDY +1", "E_INVALID RDY could not parse count +1"),
        (b"RDY 1.5", "E_INVALID RDY could not parse count 1.5"),
        (b"RDY 2501", "E_INVALID RDY count 2501 out of range 0-2500"),
        (b"RDY 99999999999", "E_INVALID RDY count 99999999999 out of range 0-2500"),
        (b"RDY 18446744073709551615", "E_INVALID RDY count -1 out of range 0-2500"),  # uint64 -> int64
    ],
)
def test_rdy_errors(nsqd, line, text):
    with consumer(nsqd, "rdy_errors") as c:
        c.cmd(line)
        fatal(c, text)


def applied(c):
    """RDY has no reply: the non-fatal error answering a FIN sent after it shows it was applied."""
    c.cmd(b"FIN 0000000000000000")
    assert c.read_error().startswith("E_FIN_FAILED")


def test_rdy_double_space_is_rdy_0(nsqd):
    # "RDY  1" splits into ["RDY", "", "1"]: count "" parses as 0.
    with consumer(nsqd, "rdy_double", rdy=1) as c:
        c.cmd(b"RDY  1")
        applied(c)
        publish(nsqd, "rdy_double", b"x")
        c.assert_silent()
        c.cmd(b"RDY 1")
        assert c.read_message()[3] == b"x"


def test_rdy_range_follows_max_rdy_count(make_nsqd):
    nsqd = make_nsqd(max_rdy_count=5)
    with consumer(nsqd, "rdy_max") as c:
        c.cmd(b"RDY 5")
        c.cmd(b"RDY 0")
        c.assert_silent()
        c.cmd(b"RDY 6")
        fatal(c, "E_INVALID RDY count 6 out of range 0-5")


def test_rdy_empty_count_is_zero_and_absent_count_is_one(nsqd):
    with consumer(nsqd, "rdy_default", rdy=2) as c:
        c.cmd(b"RDY ")  # 0
        applied(c)
        publish(nsqd, "rdy_default", b"a", b"b")
        c.assert_silent()
        c.cmd(b"RDY")  # 1
        ts, attempts, mid, body = c.read_message()
        assert body == b"a"
        c.assert_silent()  # only one in flight
        c.cmd(b"FIN " + mid)
        assert c.read_message()[3] == b"b"


# -- §7.6-7.8 FIN / REQ / TOUCH ----------------------------------------------


@pytest.mark.parametrize(
    "line, text",
    [
        (b"FIN", "E_INVALID FIN insufficient number of params"),
        (b"REQ", "E_INVALID REQ insufficient number of params"),
        (b"REQ " + NOT_IN_FLIGHT_ID, "E_INVALID REQ insufficient number of params"),
        (b"TOUCH", "E_INVALID TOUCH insufficient number of params"),
        (b"FIN 0123456789abcde", "E_INVALID invalid message ID"),  # 15
        (b"FIN 0123456789abcdef0", "E_INVALID invalid message ID"),  # 17
        (b"FIN ", "E_INVALID invalid message ID"),
        (b"FIN  0123456789abcdef", "E_INVALID invalid message ID"),  # params[1] is ""
        (b"FIN 0123456 89abcdef", "E_INVALID invalid message ID"),  # the space splits it
        (b"REQ 0123456789abcde 0", "E_INVALID invalid message ID"),
        (b"REQ 0123456789abcdef0 0", "E_INVALID invalid message ID"),
        (b"REQ short -1", "E_INVALID invalid message ID"),  # ID before timeout
        (b"TOUCH 0123456789abcde", "E_INVALID invalid message ID"),
        (b"TOUCH 0123456789abcdef0", "E_INVALID invalid message ID"),
        (b"REQ " + NOT_IN_FLIGHT_ID + b" -1", "E_INVALID REQ could not parse timeout -1"),
        (b"REQ " + NOT_IN_FLIGHT_ID + b" 1.0", "E_INVALID REQ could not parse timeout 1.0"),
        (b"REQ " + NOT_IN_FLIGHT_ID + b" +5", "E_INVALID REQ could not parse timeout +5"),
    ],
)
def test_fin_req_touch_fatal_errors(nsqd, line, text):
    with consumer(nsqd, "frt_fatal") as c:
        c.cmd(line)
        fatal(c, text)


def test_message_id_length_counts_the_cr_of_crlf_once(nsqd):
    # "FIN <15 bytes>\r\n": the \r is stripped, so the ID is 15 bytes long.
    with consumer(nsqd, "fin_crlf") as c:
        c.send(b"FIN 0123456789abcde\r\n")
        fatal(c, "E_INVALID invalid message ID")


def test_fin_with_crlf(nsqd):
    c, mid = delivered(nsqd, "fin_crlf_ok")
    with c:
        c.send(b"FIN " + mid + b"\r\n")
        c.send(b"FIN " + mid + b"\r\n")
        non_fatal(c, "E_FIN_FAILED FIN %s failed ID not in flight" % mid.decode())


def test_pipelined_fin_with_a_space_in_the_id(nsqd):
    # Two pipelined FINs: the second has a space inside its 16 bytes.
    c, mid = delivered(nsqd, "fin_pipelined")
    with c:
        c.send(b"FIN " + mid + b"\nFIN 0123456 89abcdef\n")
        fatal(c, "E_INVALID invalid message ID")


def test_pipelined_fin_with_a_newline_in_the_window(nsqd):
    # "FIN 01234\n" then "NOP\n" then "NOPNOP\n": byte 20 is a newline but the
    # first line is a 5-byte ID.
    c, mid = delivered(nsqd, "fin_pipelined_nl")
    with c:
        c.send(b"FIN " + mid + b"\nFIN 01234\nNOP\nNOPNOP\n")
        fatal(c, "E_INVALID invalid message ID")


def test_pipelined_fins_each_answered(nsqd):
    c, mid = delivered(nsqd, "fin_pipelined_ok")
    with c:
        other = b"zzzzzzzzzzzzzzzz"  # any 16 bytes: no hex check
        c.send(b"FIN " + other + b"\nFIN " + mid + b"\nFIN " + mid + b"\n")
        assert c.read_error() == "E_FIN_FAILED FIN zzzzzzzzzzzzzzzz failed ID not in flight"
        non_fatal(c, "E_FIN_FAILED FIN %s failed ID not in flight" % mid.decode())


@pytest.mark.parametrize(
    "line, text",
    [
        (b"FIN " + NOT_IN_FLIGHT_ID, "E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"),
        (b"FIN \xff\x00zzzzzzzzzzzzzz", "E_FIN_FAILED FIN \xff\x00zzzzzzzzzzzzzz failed ID not in flight"),
        (b"REQ " + NOT_IN_FLIGHT_ID + b" 0", "E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight"),
        (b"REQ " + NOT_IN_FLIGHT_ID + b" 1000", "E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight"),
        (b"REQ " + NOT_IN_FLIGHT_ID + b" ", "E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight"),
        (b"TOUCH " + NOT_IN_FLIGHT_ID, "E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight"),
    ],
)
def test_fin_req_touch_not_in_flight_is_not_fatal(nsqd, line, text):
    with consumer(nsqd, "frt_nonfatal") as c:
        c.cmd(line)
        ft, data = c.read_frame()
        assert (ft, data) == (1, text.encode("latin-1"))
        c.cmd(b"NOP")
        assert c.pub("still_alive", b"x") == b"OK"


@pytest.mark.parametrize("verb", [b"FIN", b"REQ", b"TOUCH"])
def test_fin_req_touch_of_another_clients_message(nsqd, verb):
    owner, mid = delivered(nsqd, "owned")
    other = consumer(nsqd, "owned")  # same channel, RDY 0
    with owner, other:
        line = verb + b" " + mid + (b" 0" if verb == b"REQ" else b"")
        other.cmd(line)
        non_fatal(other, "E_%s_FAILED %s %s failed client does not own message" % (verb.decode(), verb.decode(), mid.decode()))
        # The owner still holds it.
        owner.cmd(b"FIN " + mid)
        owner.assert_silent()
        assert channel_of(nsqd, "owned", "c").in_flight_count() == 0


def test_second_fin_of_the_same_id(nsqd):
    c, mid = delivered(nsqd, "fin_twice")
    with c:
        c.cmd(b"FIN " + mid)
        c.cmd(b"FIN " + mid)
        non_fatal(c, "E_FIN_FAILED FIN %s failed ID not in flight" % mid.decode())


def test_req_huge_timeout_is_clamped_not_an_error(nsqd):
    c, mid = delivered(nsqd, "req_clamp")
    with c:
        c.cmd(b"REQ " + mid + b" 99999999999")
        c.assert_silent()
        ch = channel_of(nsqd, "req_clamp", "c")
        wait_for(lambda: ch.deferred_count() == 1, what="deferred")
        assert ch.in_flight_count() == 0
        assert c.pub("req_clamp2", b"x") == b"OK"


def test_req_timeout_equal_to_max(make_nsqd):
    nsqd = make_nsqd(max_req_timeout=10.0)
    c, mid = delivered(nsqd, "req_max")
    with c:
        c.cmd(b"REQ " + mid + b" 10000")
        c.assert_silent()
        wait_for(lambda: channel_of(nsqd, "req_max", "c").deferred_count() == 1, what="deferred")


@pytest.mark.parametrize("timeout", [b"9223372036855", b"18446744073709551615", b"0", b""])
def test_req_overflowing_or_zero_timeout_requeues_at_once(nsqd, timeout):
    # 9223372036855 ms * 1e6 overflows int64 to a negative duration: clamped to 0.
    c, mid = delivered(nsqd, "req_now")
    with c:
        c.cmd(b"REQ " + mid + b" " + timeout)
        ts, attempts, mid2, body = c.read_message()
        assert (mid2, attempts, body) == (mid, 2, b"m")


# -- §7.10 PUB ---------------------------------------------------------------


def test_pub_insufficient_params(conn):
    conn.cmd(b"PUB")
    fatal(conn, "E_INVALID PUB insufficient number of parameters")


@pytest.mark.parametrize(
    "topic, quoted",
    [
        (b"a*b", '"a*b"'),
        (b"t" * 65, '"%s"' % ("t" * 65)),
        (b"t\x00", '"t\\x00"'),
        (b"#ephemeral", '"#ephemeral"'),
    ],
)
def test_pub_bad_topic_closes_without_reading_the_body(conn, topic, quoted):
    conn.cmd(b"PUB " + topic, b"body")
    fatal(conn, "E_BAD_TOPIC PUB topic name %s is not valid" % quoted)


def test_pub_topic_with_crlf_is_valid(conn):
    conn.send(b"PUB t#ephemeral\r\n" + size(1) + b"x")
    assert conn.read_response() == b"OK"


@pytest.mark.parametrize(
    "raw_size, text",
    [
        (size(0), "E_BAD_MESSAGE PUB invalid message body size 0"),
        (size(-1), "E_BAD_MESSAGE PUB invalid message body size -1"),
        (usize(0x80000000), "E_BAD_MESSAGE PUB invalid message body size -2147483648"),
        (usize(0xFFFFFFFF), "E_BAD_MESSAGE PUB invalid message body size -1"),
        (size(11), "E_BAD_MESSAGE PUB message too big 11 > 10"),
        (size(0x7FFFFFFF), "E_BAD_MESSAGE PUB message too big 2147483647 > 10"),
    ],
)
def test_pub_body_size_errors(make_nsqd, raw_size, text):
    nsqd = make_nsqd(max_msg_size=10)
    with Conn(nsqd.tcp_address) as c:
        c.send(b"PUB t\n" + raw_size)
        fatal(c, text)


def test_pub_default_max_msg_size(conn):
    conn.send(b"PUB t\n" + size(1048577))
    fatal(conn, "E_BAD_MESSAGE PUB message too big 1048577 > 1048576")


def test_pub_size_equal_to_max_is_allowed(make_nsqd):
    nsqd = make_nsqd(max_msg_size=10)
    with Conn(nsqd.tcp_address) as c:
        assert c.pub("pub_max", b"0123456789") == b"OK"
    with consumer(nsqd, "pub_max", rdy=1) as s:
        assert s.read_message()[3] == b"0123456789"


def test_pub_failed_to_read_body_size(conn):
    conn.send(b"PUB t\n\x00\x00\x00")
    half_close(conn)
    fatal(conn, "E_BAD_MESSAGE PUB failed to read message body size")


def test_pub_failed_to_read_body(conn):
    conn.send(b"PUB t\n" + size(5) + b"abcd")
    half_close(conn)
    fatal(conn, "E_BAD_MESSAGE PUB failed to read message body")


# -- §7.12 DPUB --------------------------------------------------------------


@pytest.mark.parametrize("line", [b"DPUB", b"DPUB t"])
def test_dpub_insufficient_params(conn, line):
    conn.cmd(line)
    fatal(conn, "E_INVALID DPUB insufficient number of parameters")


@pytest.mark.parametrize(
    "line, text",
    [
        (b"DPUB a*b 0", 'E_BAD_TOPIC DPUB topic name "a*b" is not valid'),
        (b"DPUB a*b -1", 'E_BAD_TOPIC DPUB topic name "a*b" is not valid'),  # topic before defer
        (b"DPUB t -1", "E_INVALID DPUB could not parse timeout -1"),
        (b"DPUB t 1s", "E_INVALID DPUB could not parse timeout 1s"),
        (b"DPUB t 3600001", "E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
        # Go prints the parsed uint64 as is.
        (b"DPUB t 18446744073709551615", "E_INVALID DPUB timeout 18446744073709551615 out of range 0-3600000"),
        # (2**63 - 1) ms * 1e6 wraps to -1e6 ns: negative, so out of range.
        (b"DPUB t 9223372036854775807", "E_INVALID DPUB timeout 9223372036854775807 out of range 0-3600000"),
        (b"DPUB t 9223372036855", "E_INVALID DPUB timeout 9223372036855 out of range 0-3600000"),
    ],
)
def test_dpub_errors(conn, line, text):
    conn.cmd(line, b"body")
    fatal(conn, text)


def test_dpub_range_is_checked_before_the_body(conn):
    conn.send(b"DPUB t 3600001\n" + size(0))
    fatal(conn, "E_INVALID DPUB timeout 3600001 out of range 0-3600000")


def test_dpub_range_follows_max_req_timeout(make_nsqd):
    nsqd = make_nsqd(max_req_timeout=10.0)
    with Conn(nsqd.tcp_address) as c:
        c.cmd(b"DPUB t 10000", b"x")
        assert c.read_response() == b"OK"
        c.cmd(b"DPUB t 10001", b"x")
        fatal(c, "E_INVALID DPUB timeout 10001 out of range 0-10000")


def test_dpub_defer_equal_to_max_is_deferred(nsqd):
    with consumer(nsqd, "dpub_max", rdy=1) as s:
        with Conn(nsqd.tcp_address) as c:
            c.cmd(b"DPUB dpub_max 3600000", b"later")
            assert c.read_response() == b"OK"
        wait_for(lambda: channel_of(nsqd, "dpub_max", "c").deferred_count() == 1, what="deferred")
        s.assert_silent()


@pytest.mark.parametrize("defer", [b"", b"0", b"18446744073709551616"])
def test_dpub_zero_defer_behaves_like_pub(nsqd, defer):
    # Empty parses as 0; 2**64 wraps to 0 in Go's uint64 parser.
    with consumer(nsqd, "dpub_now", rdy=1) as s:
        with Conn(nsqd.tcp_address) as c:
            c.cmd(b"DPUB dpub_now " + defer, b"now")
            assert c.read_response() == b"OK"
        assert s.read_message()[3] == b"now"
        assert channel_of(nsqd, "dpub_now", "c").deferred_count() == 0


@pytest.mark.parametrize("defer", [b"18446744073710", b"18446744073709551617", b"9223372036854775808"])
def test_dpub_defer_wraps_like_go(nsqd, defer):
    # Go: time.Duration(ms) * time.Millisecond wraps in int64.  18446744073710 ms
    # becomes 448384 ns, 2**64 + 1 (uint64 wrap) becomes 1 ms and 2**63 ms
    # becomes 0: all in range, so nsqd accepts them as (tiny or no) deferrals.
    with consumer(nsqd, "dpub_wrap", rdy=1) as s:
        with Conn(nsqd.tcp_address) as c:
            c.cmd(b"DPUB dpub_wrap " + defer, b"soon")
            assert c.read_response() == b"OK"
        assert s.read_message()[3] == b"soon"


@pytest.mark.parametrize(
    "raw_size, text",
    [
        (size(0), "E_BAD_MESSAGE DPUB invalid message body size 0"),
        (size(-7), "E_BAD_MESSAGE DPUB invalid message body size -7"),
        (usize(0x80000000), "E_BAD_MESSAGE DPUB invalid message body size -2147483648"),
        (size(11), "E_BAD_MESSAGE DPUB message too big 11 > 10"),
    ],
)
def test_dpub_body_size_errors(make_nsqd, raw_size, text):
    nsqd = make_nsqd(max_msg_size=10)
    with Conn(nsqd.tcp_address) as c:
        c.send(b"DPUB t 100\n" + raw_size)
        fatal(c, text)


def test_dpub_size_equal_to_max(make_nsqd):
    nsqd = make_nsqd(max_msg_size=10)
    with Conn(nsqd.tcp_address) as c:
        c.cmd(b"DPUB t 100", b"0123456789")
        assert c.read_response() == b"OK"


def test_dpub_failed_to_read_body_size(conn):
    conn.send(b"DPUB t 0\n\x00")
    half_close(conn)
    fatal(conn, "E_BAD_MESSAGE DPUB failed to read message body size")


def test_dpub_failed_to_read_body(conn):
    conn.send(b"DPUB t 0\n" + size(3) + b"a")
    half_close(conn)
    fatal(conn, "E_BAD_MESSAGE DPUB failed to read message body")


# -- §7.11 MPUB --------------------------------------------------------------


def mpub_items(*bodies):
    return b"".join(size(len(b)) + b for b in bodies)


def test_mpub_insufficient_params(conn):
    conn.cmd(b"MPUB")
    fatal(conn, "E_INVALID MPUB insufficient number of parameters")


@pytest.mark.parametrize(
    "topic, quoted",
    [(b"a*b", '"a*b"'), (b"", '""'), (b"t" * 65, '"%s"' % ("t" * 65)), (b"\xe2\x82", '"\\xe2\\x82"')],
)
def test_mpub_bad_topic_names_the_code_twice(conn, topic, quoted):
    conn.cmd(b"MPUB " + topic, protocol.encode_mpub_body([b"x"]))
    fatal(conn, "E_BAD_TOPIC E_BAD_TOPIC MPUB topic name %s is not valid" % quoted)


@pytest.mark.parametrize(
    "raw_size, text",
    [
        (size(0), "E_BAD_BODY MPUB invalid body size 0"),
        (size(-1), "E_BAD_BODY MPUB invalid body size -1"),
        (usize(0x80000000), "E_BAD_BODY MPUB invalid body size -2147483648"),
        (size(101), "E_BAD_BODY MPUB body too big 101 > 100"),
    ],
)
def test_mpub_body_size_errors(make_nsqd, raw_size, text):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        c.send(b"MPUB mpub_bad_size\n" + raw_size)
        fatal(c, text)
    # nsqd creates the topic before reading the body, even when the body fails.
    assert nsqd.get_existing_topic("mpub_bad_size") is not None


@pytest.mark.parametrize(
    "count, text",
    [
        (0, "E_BAD_BODY MPUB invalid message count 0"),
        (-1, "E_BAD_BODY MPUB invalid message count -1"),
        (-2147483648, "E_BAD_BODY MPUB invalid message count -2147483648"),
        (20, "E_BAD_BODY MPUB invalid message count 20"),  # (100 - 4) // 5 = 19
        (2147483647, "E_BAD_BODY MPUB invalid message count 2147483647"),
    ],
)
def test_mpub_message_count_errors(make_nsqd, count, text):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        c.send(b"MPUB t\n" + size(100) + size(count))
        fatal(c, text)


def test_mpub_default_count_limit(conn):
    conn.send(b"MPUB t\n" + size(5242880) + size(1048576))
    fatal(conn, "E_BAD_BODY MPUB invalid message count 1048576")


def test_mpub_max_count_and_max_body_size_are_allowed(make_nsqd):
    nsqd = make_nsqd(max_body_size=100)
    with consumer(nsqd, "mpub_max", rdy=100) as s:
        with Conn(nsqd.tcp_address) as c:
            bodies = [b"%d" % (i % 10) for i in range(19)]
            body = protocol.encode_mpub_body(bodies)
            assert len(body) == 99
            c.cmd(b"MPUB mpub_max", body)
            assert c.read_response() == b"OK"
            # body_size == max_body_size; the inner lengths decide what is read.
            c.send(b"MPUB mpub_max\n" + size(100) + protocol.encode_mpub_body([b"y" * 87]))
            assert c.read_response() == b"OK"
        got = [s.read_message()[3] for _ in range(20)]
        assert got == bodies + [b"y" * 87]


@pytest.mark.parametrize(
    "items, text",
    [
        (mpub_items(b"a") + size(0), "E_BAD_MESSAGE MPUB invalid message(1) body size 0"),
        (size(-1), "E_BAD_MESSAGE MPUB invalid message(0) body size -1"),
        (usize(0x80000000), "E_BAD_MESSAGE MPUB invalid message(0) body size -2147483648"),
        (mpub_items(b"a", b"b") + size(11), "E_BAD_MESSAGE MPUB message too big 11 > 10"),
    ],
)
def test_mpub_message_errors(make_nsqd, items, text):
    nsqd = make_nsqd(max_msg_size=10)
    with Conn(nsqd.tcp_address) as c:
        c.send(b"MPUB mpub_msg_err\n" + size(1000) + size(3) + items)
        fatal(c, text)
    # Nothing is queued unless every message was read.
    assert nsqd.get_existing_topic("mpub_msg_err").message_count == 0


def test_mpub_message_size_equal_to_max(make_nsqd):
    nsqd = make_nsqd(max_msg_size=10)
    with Conn(nsqd.tcp_address) as c:
        assert c.mpub("t", [b"0123456789", b"x"]) == b"OK"


@pytest.mark.parametrize(
    "data, text",
    [
        (b"\x00\x00", "E_BAD_BODY MPUB failed to read body size"),
        (size(50) + b"\x00\x00\x00", "E_BAD_BODY MPUB failed to read message count"),
        (size(50) + size(2) + mpub_items(b"a") + b"\x00", "E_BAD_MESSAGE MPUB failed to read message(1) body size"),
        (size(50) + size(2) + size(3) + b"ab", "E_BAD_MESSAGE MPUB failed to read message body"),
        (size(50) + size(2) + mpub_items(b"a") + size(4) + b"b", "E_BAD_MESSAGE MPUB failed to read message body"),
    ],
)
def test_mpub_failed_reads(conn, data, text):
    conn.send(b"MPUB t\n" + data)
    half_close(conn)
    fatal(conn, text)


def test_mpub_trusts_inner_lengths_leftover_is_the_next_command(nsqd):
    with consumer(nsqd, "mpub_trust", rdy=10) as s:
        with Conn(nsqd.tcp_address) as c:
            body = protocol.encode_mpub_body([b"a", b"b"])
            # body_size claims 40 more bytes than the content: they are commands.
            leftover = b"NOP\nPUB mpub_trust\n" + size(1) + b"c"
            c.send(b"MPUB mpub_trust\n" + size(len(body) + 40) + body + leftover)
            assert c.read_response() == b"OK"  # MPUB
            assert c.read_response() == b"OK"  # the PUB hidden in the "body"
            c.assert_silent()
        assert [s.read_message()[3] for _ in range(3)] == [b"a", b"b", b"c"]


def test_mpub_leftover_bytes_parsed_as_an_invalid_command(conn):
    body = protocol.encode_mpub_body([b"a"])
    conn.send(b"MPUB t\n" + size(len(body) + 10) + body + b"BOGUS\n")
    assert conn.read_response() == b"OK"
    fatal(conn, "E_INVALID invalid command BOGUS")


def test_mpub_body_size_smaller_than_content_reads_past_it(nsqd):
    with consumer(nsqd, "mpub_short", rdy=10) as s:
        with Conn(nsqd.tcp_address) as c:
            body = protocol.encode_mpub_body([b"first", b"second"])
            c.send(b"MPUB mpub_short\n" + size(5) + body)
            assert c.read_response() == b"OK"
            assert c.pub("mpub_short", b"third") == b"OK"
        assert [s.read_message()[3] for _ in range(3)] == [b"first", b"second", b"third"]


def test_mpub_split_across_many_writes(nsqd):
    with consumer(nsqd, "mpub_split", rdy=10) as s:
        with Conn(nsqd.tcp_address) as c:
            bodies = [b"x" * 3000, b"y", b"z" * 5000]
            data = b"MPUB mpub_split\n" + size(len(protocol.encode_mpub_body(bodies))) + protocol.encode_mpub_body(bodies)
            for i in range(0, len(data), 997):
                c.send(data[i : i + 997])
            assert c.read_response() == b"OK"
        assert [s.read_message()[3] for _ in range(3)] == bodies


# -- E_PUB_FAILED / E_MPUB_FAILED / E_DPUB_FAILED ------------------------------


@pytest.mark.parametrize(
    "line, body, text",
    [
        (b"PUB failing", b"x", "E_PUB_FAILED PUB failed disk full"),
        (b"MPUB failing", protocol.encode_mpub_body([b"x", b"y"]), "E_MPUB_FAILED MPUB failed disk full"),
        (b"DPUB failing 0", b"x", "E_DPUB_FAILED DPUB failed disk full"),
    ],
)
def test_publish_backend_failure(make_nsqd, line, body, text):
    nsqd = make_nsqd(mem_queue_size=0)

    def failing_put(backend, msgs):
        raise BackendError("disk full")

    nsqd.backend_put = failing_put  # every write to the (disk) backend fails
    with Conn(nsqd.tcp_address) as c:
        c.cmd(line, body)
        fatal(c, text)


# -- §10 heartbeats and the read deadline -------------------------------------


def test_silent_client_gets_heartbeats_then_is_disconnected(conn):
    assert conn.identify(heartbeat_interval=1000) == b"OK"
    start = time.monotonic()
    heartbeats = []
    with pytest.raises((EOFError, ConnectionResetError)):
        while True:
            frame = conn.read_raw_frame()
            assert frame == protocol.HEARTBEAT_FRAME
            heartbeats.append(time.monotonic() - start)
    elapsed = time.monotonic() - start
    assert 1 <= len(heartbeats) <= 2
    assert 1.5 < elapsed < 3.5


def test_client_answering_heartbeats_with_nop_stays_connected(conn):
    assert conn.identify(heartbeat_interval=1000) == b"OK"
    start = time.monotonic()
    while time.monotonic() - start < 3.5:
        assert conn.read_raw_frame() == protocol.HEARTBEAT_FRAME
        conn.cmd(b"NOP")
    assert conn.pub("hb_alive", b"x") == b"OK"


def test_partial_line_does_not_extend_the_read_deadline(conn):
    # The deadline is set once per command: trickling bytes of an unfinished
    # line does not keep the connection alive.
    assert conn.identify(heartbeat_interval=1000) == b"OK"
    start = time.monotonic()
    conn.sock.settimeout(0.4)
    closed = False
    while time.monotonic() - start < 5 and not closed:
        try:
            conn.send(b"N")
        except OSError:
            break
        try:
            data = conn.sock.recv(65536)  # paces the loop, at most 0.4 s
            closed = not data
        except socket.timeout:
            pass
        except ConnectionResetError:
            closed = True
    assert closed, "connection still open after %.1f s" % (time.monotonic() - start)
    assert time.monotonic() - start < 3.5


def test_stalled_body_read_times_out_with_an_error_frame(conn):
    assert conn.identify(heartbeat_interval=1000) == b"OK"
    conn.send(b"PUB t\n" + size(10) + b"abc")
    start = time.monotonic()
    fatal(conn, "E_BAD_MESSAGE PUB failed to read message body")
    assert 1.5 < time.monotonic() - start < 3.5


def test_heartbeats_disabled_means_no_heartbeats(conn):
    assert conn.identify(heartbeat_interval=-1) == b"OK"
    conn.assert_silent(1.5)
    assert conn.pub("no_hb", b"x") == b"OK"


# -- "exiting" failures (a topic/channel being deleted while a command runs) --


def set_exiting(obj):
    """Mark a topic or channel as exiting, as its deletion does (white-box)."""
    with obj._lock:
        obj.exiting = True


@pytest.mark.parametrize(
    "line, body, text",
    [
        (b"PUB exiting", b"x", "E_PUB_FAILED PUB failed exiting"),
        (b"MPUB exiting", protocol.encode_mpub_body([b"x"]), "E_MPUB_FAILED MPUB failed exiting"),
        (b"DPUB exiting 10", b"x", "E_DPUB_FAILED DPUB failed exiting"),
    ],
)
def test_publish_to_an_exiting_topic(nsqd, line, body, text):
    set_exiting(nsqd.get_topic("exiting"))
    with Conn(nsqd.tcp_address) as c:
        c.cmd(line, body)
        fatal(c, text)


def test_sub_to_an_exiting_channel(nsqd):
    set_exiting(nsqd.get_topic("sub_exiting").get_channel("c"))
    with Conn(nsqd.tcp_address) as c:
        c.cmd(b"SUB sub_exiting c")
        fatal(c, "E_SUB_FAILED SUB failed exiting")


def test_req_0_while_the_channel_is_exiting(nsqd):
    c, mid = delivered(nsqd, "req_exiting")
    with c:
        set_exiting(channel_of(nsqd, "req_exiting", "c"))
        c.cmd(b"REQ " + mid + b" 0")
        non_fatal(c, "E_REQ_FAILED REQ %s failed exiting" % mid.decode())
