"""PUB, DPUB and MPUB over TCP, and their E_*_FAILED errors (tcp.md §7.10-§7.12)."""

import pytest

from nsqd_threaded.storage.backend import BackendError
from nsqd_threaded.wire import protocol_v2

from support.v2 import channel_of, conn, consumer, fatal, half_close, size, usize  # noqa: F401 (fixtures among them)
from support.wire import Conn, wait_for

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
    conn.cmd(b"MPUB " + topic, protocol_v2.encode_mpub_body([b"x"]))
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
            body = protocol_v2.encode_mpub_body(bodies)
            assert len(body) == 99
            c.cmd(b"MPUB mpub_max", body)
            assert c.read_response() == b"OK"
            # body_size == max_body_size; the inner lengths decide what is read.
            c.send(b"MPUB mpub_max\n" + size(100) + protocol_v2.encode_mpub_body([b"y" * 87]))
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
            body = protocol_v2.encode_mpub_body([b"a", b"b"])
            # body_size claims 40 more bytes than the content: they are commands.
            leftover = b"NOP\nPUB mpub_trust\n" + size(1) + b"c"
            c.send(b"MPUB mpub_trust\n" + size(len(body) + 40) + body + leftover)
            assert c.read_response() == b"OK"  # MPUB
            assert c.read_response() == b"OK"  # the PUB hidden in the "body"
            c.assert_silent()
        assert [s.read_message()[3] for _ in range(3)] == [b"a", b"b", b"c"]


def test_mpub_leftover_bytes_parsed_as_an_invalid_command(conn):
    body = protocol_v2.encode_mpub_body([b"a"])
    conn.send(b"MPUB t\n" + size(len(body) + 10) + body + b"BOGUS\n")
    assert conn.read_response() == b"OK"
    fatal(conn, "E_INVALID invalid command BOGUS")


def test_mpub_body_size_smaller_than_content_reads_past_it(nsqd):
    with consumer(nsqd, "mpub_short", rdy=10) as s:
        with Conn(nsqd.tcp_address) as c:
            body = protocol_v2.encode_mpub_body([b"first", b"second"])
            c.send(b"MPUB mpub_short\n" + size(5) + body)
            assert c.read_response() == b"OK"
            assert c.pub("mpub_short", b"third") == b"OK"
        assert [s.read_message()[3] for _ in range(3)] == [b"first", b"second", b"third"]


def test_mpub_split_across_many_writes(nsqd):
    with consumer(nsqd, "mpub_split", rdy=10) as s:
        with Conn(nsqd.tcp_address) as c:
            bodies = [b"x" * 3000, b"y", b"z" * 5000]
            data = b"MPUB mpub_split\n" + size(len(protocol_v2.encode_mpub_body(bodies))) + protocol_v2.encode_mpub_body(bodies)
            for i in range(0, len(data), 997):
                c.send(data[i : i + 997])
            assert c.read_response() == b"OK"
        assert [s.read_message()[3] for _ in range(3)] == bodies


# -- E_PUB_FAILED / E_MPUB_FAILED / E_DPUB_FAILED ------------------------------


@pytest.mark.parametrize(
    "line, body, text",
    [
        (b"PUB failing", b"x", "E_PUB_FAILED PUB failed disk full"),
        (b"MPUB failing", protocol_v2.encode_mpub_body([b"x", b"y"]), "E_MPUB_FAILED MPUB failed disk full"),
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
