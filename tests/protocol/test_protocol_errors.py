"""Protocol V2 over TCP: the connection's start, the command grammar, the state machine, heartbeats and the
read deadline, and commands meeting a topic or channel being deleted (tcp.md §1, §2, §6, §10)."""

import socket
import time

import pytest

from nsqd_threaded.wire import protocol_v2

from support.v2 import (  # noqa: F401 (fixtures among them)
    NOT_IN_FLIGHT_ID,
    channel_of,
    conn,
    consumer,
    delivered,
    fatal,
    half_close,
    non_fatal,
    publish,
    read_all_until_closed,
    size,
)
from support.wire import Conn

# -- §1 connection start -----------------------------------------------------


@pytest.mark.parametrize("magic", [b"  V1", b"V2  ", b"\x00\x00\x00\x00", b"GET "])
def test_bad_magic_gets_exact_bad_protocol_frame_then_close(nsqd, magic):
    with Conn(nsqd.tcp_address, magic=magic) as c:
        assert read_all_until_closed(c) == bytes.fromhex("00000012 00000001 455f4241445f50524f544f434f4c")


def test_http_request_to_the_tcp_port(nsqd):
    with Conn(nsqd.tcp_address, magic=None) as c:
        c.send(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_all_until_closed(c) == protocol_v2.BAD_PROTOCOL_FRAME


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
        c.cmd(b"MPUB closing_works", protocol_v2.encode_mpub_body([b"a"]))
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


# -- §10 heartbeats and the read deadline -------------------------------------


def test_silent_client_gets_heartbeats_then_is_disconnected(conn):
    assert conn.identify(heartbeat_interval=1000) == b"OK"
    start = time.monotonic()
    heartbeats = []
    with pytest.raises((EOFError, ConnectionResetError)):
        while True:
            frame = conn.read_raw_frame()
            assert frame == protocol_v2.HEARTBEAT_FRAME
            heartbeats.append(time.monotonic() - start)
    elapsed = time.monotonic() - start
    assert 1 <= len(heartbeats) <= 2
    assert 1.5 < elapsed < 3.5


def test_client_answering_heartbeats_with_nop_stays_connected(conn):
    assert conn.identify(heartbeat_interval=1000) == b"OK"
    start = time.monotonic()
    while time.monotonic() - start < 3.5:
        assert conn.read_raw_frame() == protocol_v2.HEARTBEAT_FRAME
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
        (b"MPUB exiting", protocol_v2.encode_mpub_body([b"x"]), "E_MPUB_FAILED MPUB failed exiting"),
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
