"""SUB, RDY, FIN, REQ and TOUCH over TCP (tcp.md §7.4-§7.8)."""

import pytest

from support.v2 import (  # noqa: F401 (fixtures among them)
    NOT_IN_FLIGHT_ID,
    channel_of,
    conn,
    consumer,
    delivered,
    fatal,
    non_fatal,
    publish,
)
from support.wire import Conn, wait_for

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
