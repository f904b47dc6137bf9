"""The HTTP edge's framing: Content-Length, chunked bodies, Expect: 100-continue, http.server's refusals."""

import socket

import pytest

from nsqd_threaded.server.http_server import (
    DRAIN_LIMIT,
    BodyFraming,
    FramingError,
    parse_chunk_size,
)

from support.http_raw import RawHTTP, assert_error, assert_no_traceback, pub_head, raw  # noqa: F401 (fixtures among them)
from support.wire import Conn

# -- the framing rules, without sockets -----------------------------------------------------


@pytest.mark.parametrize(
    "version, cls, tes, expected",
    [
        ("HTTP/1.1", [], [], (False, 0, False)),
        ("HTTP/1.1", ["12"], [], (False, 12, False)),
        ("HTTP/1.1", [" 12\t"], [], (False, 12, False)),
        ("HTTP/1.1", ["12", "12"], [], (False, 12, False)),
        ("HTTP/1.1", [""], [], (False, 0, False)),
        ("HTTP/1.1", [], ["chunked"], (True, 0, False)),
        ("HTTP/1.1", [], [" Chunked "], (True, 0, False)),
        ("HTTP/1.1", ["5"], ["chunked"], (True, 0, False)),  # Transfer-Encoding wins, as in Go
        ("HTTP/1.1", [str((1 << 63) - 1)], [], (False, (1 << 63) - 1, False)),
        ("HTTP/1.0", ["3"], ["chunked"], (False, 3, True)),  # ignored on 1.0; not reused
    ],
)
def test_body_framing_accepts(version, cls, tes, expected):
    f = BodyFraming.of(version, cls, tes)
    assert (f.chunked, f.length, f.close) == expected


@pytest.mark.parametrize(
    "cls, tes, status",
    [
        (["-1"], [], 400),
        (["abc"], [], 400),
        (["+5"], [], 400),
        (["0x10"], [], 400),
        (["1 2"], [], 400),
        (["5, 5"], [], 400),
        (["\u0665"], [], 400),  # a non-ASCII digit
        ([str(1 << 63)], [], 400),
        (["5", "6"], [], 400),
        (["5", ""], [], 400),
        ([], ["gzip"], 501),
        ([], ["gzip, chunked"], 501),
        ([], ["chunked", "chunked"], 501),
        ([], ["identity"], 501),
    ],
)
def test_body_framing_refuses(cls, tes, status):
    with pytest.raises(FramingError) as e:
        BodyFraming.of("HTTP/1.1", cls, tes)
    assert e.value.status == status


@pytest.mark.parametrize(
    "line, size",
    [(b"0\r\n", 0), (b"1a\r\n", 26), (b"FF;ext=1\r\n", 255), (b"ffffffffffffffff\r\n", (1 << 64) - 1), (b"5\n", 5)],
)
def test_chunk_size_accepts(line, size):
    assert parse_chunk_size(line) == size


@pytest.mark.parametrize(
    "line",
    [b"-1\r\n", b"-3\r\n", b"zz\r\n", b"\r\n", b"0x10\r\n", b"10000000000000000\r\n", b"5", b"+5\r\n",
     b"5" * 5000 + b"\r\n"],
)
def test_chunk_size_refuses(line):
    with pytest.raises(FramingError):
        parse_chunk_size(line)


# -- Content-Length ---------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_negative_content_length_is_400_and_closes(nsqd, raw):
    c = raw()
    c.send(pub_head("neg", "Content-Length: -1\r\n") + b"body that must not be published")
    assert_error(c.read_reply(), 400, "BAD_REQUEST", close=True)
    c.assert_closed()
    assert nsqd.get_existing_topic("neg") is None
    assert_no_traceback(nsqd)


@pytest.mark.timeout(30)
def test_malformed_content_length_closes_so_the_body_is_never_a_request(nsqd, raw):
    smuggled = b"POST /topic/create?topic=smuggled HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    c = raw()
    c.send(pub_head("t", "Content-Length: abc\r\n") + smuggled)
    assert_error(c.read_reply(), 400, "BAD_REQUEST", close=True)
    c.assert_closed()
    assert nsqd.get_existing_topic("smuggled") is None
    assert nsqd.get_existing_topic("t") is None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cl", ["Content-Length: 5\r\nContent-Length: 6\r\n", "Content-Length: 5, 6\r\n"])
def test_conflicting_content_lengths_are_400(nsqd, raw, cl):
    c = raw()
    c.send(pub_head("dup", cl) + b"hello!")
    assert_error(c.read_reply(), 400, "BAD_REQUEST", close=True)
    c.assert_closed()
    assert nsqd.get_existing_topic("dup") is None


@pytest.mark.timeout(30)
def test_repeated_equal_content_lengths_are_one(nsqd, raw):
    c = raw()
    c.send(pub_head("same", "Content-Length: 5\r\nContent-Length: 5\r\n") + b"hello")
    r = c.read_reply()
    assert (r.status, r.body) == (200, b"OK")
    assert nsqd.get_existing_topic("same").depth() == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length : 5\r\n",  # space before the colon
        b"Foo\r\nContent-Length: 5\r\n",  # a line without a colon
        b" Content-Length: 5\r\n",  # a continuation as the first header
    ],
)
def test_headers_that_could_hide_a_content_length_are_400(nsqd, raw, head):
    c = raw()
    c.send(b"POST /pub?topic=hidden HTTP/1.1\r\n" + head + b"\r\nhello")
    assert_error(c.read_reply(), 400, "BAD_REQUEST", close=True)
    c.assert_closed()
    assert nsqd.get_existing_topic("hidden") is None


@pytest.mark.timeout(30)
def test_content_length_over_the_limit_is_refused_unread(make_nsqd):
    nsqd = make_nsqd(max_msg_size=100)
    c = RawHTTP(nsqd)
    try:
        c.send(pub_head("big", "Content-Length: 1073741824\r\n") + b"x" * 1000)
        assert_error(c.read_reply(), 413, "MSG_TOO_BIG", close=True)
    finally:
        c.close()


@pytest.mark.timeout(30)
def test_small_unread_body_is_skipped_and_the_connection_kept(make_nsqd):
    """Like Go, a refused body up to 256 KiB is read past, so keep-alive survives a 413."""
    nsqd = make_nsqd(max_msg_size=100)
    c = RawHTTP(nsqd)
    try:
        c.send(pub_head("small", "Content-Length: 200\r\n") + b"x" * 200)
        r = c.read_reply()
        assert_error(r, 413, "MSG_TOO_BIG")
        assert "connection" not in r.headers
        c.send(pub_head("small", "Content-Length: 2\r\n") + b"ok")
        assert c.read_reply().status == 200
    finally:
        c.close()
    assert DRAIN_LIMIT == 256 << 10


@pytest.mark.timeout(30)
def test_body_ignored_by_a_route_is_skipped_before_the_next_request(nsqd, raw):
    smuggled = b"POST /topic/create?topic=smuggled HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    c = raw()
    head = "POST /topic/create?topic=real HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
    c.send(head.encode() + smuggled + b"GET /ping HTTP/1.1\r\n\r\n")
    assert c.read_reply().status == 200
    assert c.read_reply().body == b"OK"
    assert nsqd.get_existing_topic("real") is not None
    assert nsqd.get_existing_topic("smuggled") is None


@pytest.mark.timeout(30)
def test_truncated_body_is_500_without_a_traceback(nsqd, raw):
    c = raw()
    c.send(pub_head("cut", "Content-Length: 10\r\n") + b"12345")
    c.sock.shutdown(socket.SHUT_WR)
    assert_error(c.read_reply(), 500, "INTERNAL_ERROR", close=True)
    c.assert_closed()
    assert nsqd.get_existing_topic("cut") is None
    assert_no_traceback(nsqd)


# -- chunked bodies ---------------------------------------------------------------------------


CHUNKED = "Transfer-Encoding: chunked\r\n"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("size", [b"-1", b"-3", b"10000000000000000", b"zz", b"0x5", b""])
def test_bad_chunk_size_is_500_closed_and_quiet(nsqd, raw, capfd, size):
    c = raw()
    c.send(pub_head("chunky", CHUNKED) + size + b"\r\nhello\r\n0\r\n\r\n")
    assert_error(c.read_reply(), 500, "INTERNAL_ERROR", close=True)
    c.assert_closed()  # and no HTML error page after the reply
    assert nsqd.get_existing_topic("chunky") is None
    assert_no_traceback(nsqd, capfd)


@pytest.mark.timeout(30)
def test_huge_declared_chunk_is_refused_before_it_is_read(make_nsqd):
    nsqd = make_nsqd(max_msg_size=1000)
    c = RawHTTP(nsqd)
    try:
        c.send(pub_head("huge", CHUNKED) + b"40000000\r\n" + b"x" * 1000)  # 1 GiB declared
        assert_error(c.read_reply(), 413, "MSG_TOO_BIG", close=True)
    finally:
        c.close()
    assert nsqd.get_existing_topic("huge") is None


@pytest.mark.timeout(30)
def test_chunked_mpub_over_max_body_size_stops_at_the_limit(make_nsqd):
    nsqd = make_nsqd(max_body_size=1000, max_msg_size=100)
    c = RawHTTP(nsqd)
    try:
        c.send(b"POST /mpub?topic=m HTTP/1.1\r\n" + CHUNKED.encode() + b"\r\n")
        for _ in range(11):
            c.send(b"64\r\n" + b"x" * 99 + b"\n\r\n")
        assert_error(c.read_reply(), 413, "BODY_TOO_BIG", close=True)
    finally:
        c.close()


@pytest.mark.timeout(30)
def test_chunked_body_with_extensions_and_trailers_is_published(nsqd, raw):
    c = raw()
    c.send(pub_head("ext", CHUNKED) + b"3;name=value\r\nhel\r\n2\r\nlo\r\n0\r\nX-Trailer: 1\r\n\r\n")
    assert (c.read_reply().status) == 200
    c.send(b"GET /ping HTTP/1.1\r\n\r\n")  # still framed: the connection is reused
    assert c.read_reply().body == b"OK"
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("ext", "c", rdy=1)
        assert sub.read_message()[3] == b"hello"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("after", [b"XX", b"\n0\r\n\r\n"])
def test_chunk_without_crlf_after_its_data_is_500(nsqd, raw, after):
    c = raw()
    c.send(pub_head("nocrlf", CHUNKED) + b"3\r\nhel" + after)
    assert_error(c.read_reply(), 500, "INTERNAL_ERROR", close=True)
    c.assert_closed()


@pytest.mark.timeout(30)
def test_unsupported_transfer_encoding_is_501(nsqd, raw):
    c = raw()
    c.send(pub_head("gz", "Transfer-Encoding: gzip\r\nContent-Length: 5\r\n") + b"hello")
    assert_error(c.read_reply(), 501, "NOT_IMPLEMENTED", close=True)
    c.assert_closed()
    assert nsqd.get_existing_topic("gz") is None


@pytest.mark.timeout(30)
def test_http10_transfer_encoding_is_ignored_and_the_connection_closed(nsqd, raw):
    c = raw()
    c.send(b"POST /pub?topic=old HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n"
           b"Content-Length: 5\r\n\r\nhello")
    r = c.read_reply()
    assert (r.status, r.body, r.headers.get("connection")) == (200, b"OK", "close")
    c.assert_closed()


# -- Expect: 100-continue ------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_expect_continue_is_sent_only_for_a_body_we_read(make_nsqd):
    nsqd = make_nsqd(max_msg_size=100)
    c = RawHTTP(nsqd)
    try:
        c.send(pub_head("ex", "Content-Length: 1000\r\nExpect: 100-continue\r\n"))
        assert_error(c.read_reply(), 413, "MSG_TOO_BIG", close=True)  # no "100 Continue" first
        c.assert_closed()
    finally:
        c.close()
    c = RawHTTP(nsqd)
    try:
        c.send(pub_head("ex", "Content-Length: 5\r\nExpect: 100-continue\r\n"))
        assert c.read_reply().status == 100
        c.send(b"hello")
        assert c.read_reply().status == 200
    finally:
        c.close()


# -- http.server's own refusals in nsqd's format ----------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "request_bytes, status, message",
    [
        (b"GARBAGE\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /ping HTTP/1.x\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /ping HTTP/2.0\r\n\r\n", 505, "HTTP_VERSION_NOT_SUPPORTED"),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414, "REQUEST_URI_TOO_LONG"),
        (b"GET /ping HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431, "REQUEST_HEADER_FIELDS_TOO_LARGE"),
        (b"G(T /ping HTTP/1.1\r\n\r\n", 400, "BAD_REQUEST"),
    ],
)
def test_malformed_requests_get_nsqd_error_bodies(nsqd, raw, request_bytes, status, message):
    c = raw()
    c.send(request_bytes)
    assert_error(c.read_reply(), status, message, close=True)
    c.assert_closed()


@pytest.mark.timeout(30)
def test_unknown_method_is_routed_like_any_other(nsqd, raw):
    c = raw()
    c.send(b"BREW /ping HTTP/1.1\r\n\r\nBREW /nowhere HTTP/1.1\r\n\r\n")
    r = c.read_reply()
    assert_error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == "GET, OPTIONS"
    assert_error(c.read_reply(), 404, "NOT_FOUND")
