"""The HTTP edge under hostile or broken clients: body framing, size limits,
deadlines, error bodies, and the listeners' connection tracking.

Raw sockets throughout: each test writes exact bytes and reads the exact reply.
The rule under test: never read more than a limit allows, never reuse a
connection whose framing is in doubt (answer and close), never a traceback for
a client's mistake, and every error body in nsqd's ``{"message":"..."}`` form.
"""

import select
import socket
import struct
import threading
import time

import pytest

from nsqd_threaded.server.http_server import (
    DRAIN_LIMIT,
    BodyFraming,
    FramingError,
    parse_chunk_size,
)
from wire import Conn, wait_for

JSON_TYPE = "application/json; charset=utf-8"


class Reply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def __repr__(self):
        return "Reply(%r, %r, %r)" % (self.status, self.headers, self.body)


class RawHTTP:
    """One client socket to a broker's HTTP port: exact bytes out, parsed replies in."""

    def __init__(self, nsqd, timeout=10.0):
        self.sock = socket.create_connection(nsqd.http_address, timeout=timeout)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("connection closed; unread %r" % self.buf)
        self.buf += chunk

    def read_reply(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        n = int(headers.get("content-length", "0"))
        while len(self.buf) < n:
            self._fill()
        body, self.buf = self.buf[:n], self.buf[n:]
        return Reply(status, headers, body)

    def assert_closed(self, timeout=10.0):
        """The server closes the connection with nothing more to say (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.buf += chunk
        except ConnectionResetError:
            pass
        assert self.buf == b"", "data after the reply: %r" % self.buf

    def closed_within(self, timeout):
        """True when the server closes the connection (EOF or reset) within ``timeout`` seconds.

        Whatever it sends before is kept in ``buf``.
        """
        deadline = time.monotonic() + timeout
        while True:
            r, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                return False
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return True
            if not chunk:
                return True
            self.buf += chunk


@pytest.fixture
def raw(nsqd):
    clients = []

    def connect(broker=nsqd, **kw):
        c = RawHTTP(broker, **kw)
        clients.append(c)
        return c

    yield connect
    for c in clients:
        c.close()


def log_text(nsqd):
    return nsqd.log.stream.getvalue()


def assert_error(reply, status, message, close=False):
    assert (reply.status, reply.body) == (status, b'{"message":"%s"}' % message.encode()), reply
    assert reply.headers["content-type"] == JSON_TYPE
    assert reply.headers["x-nsq-content-type"] == "nsq; version=1.0"
    if close:
        assert reply.headers.get("connection") == "close", reply


def assert_no_traceback(nsqd, capfd=None):
    text = log_text(nsqd)
    assert "Traceback" not in text and "ERROR" not in text, text
    if capfd is not None:
        err = capfd.readouterr().err
        assert "Traceback" not in err, err


def pub_head(topic, extra, method="POST"):
    return ("%s /pub?topic=%s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (method, topic, extra)).encode()


def connections_drained(nsqd):
    wait_for(lambda: nsqd._http_server.connection_count() == 0, what="HTTP connections to close")


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


# -- clients that leave early -----------------------------------------------------------------


def _reset(sock):
    """Close with an RST, as a client killed mid-request does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.timeout(60)
def test_client_leaving_before_the_reply_is_not_a_traceback(nsqd, capfd):
    for _ in range(5):
        c = RawHTTP(nsqd)
        c.send(b"GET /stats HTTP/1.1\r\n\r\n" * 500)  # the replies outgrow the socket buffers
        c.read_reply()
        _reset(c.sock)
        c = RawHTTP(nsqd)
        c.send(pub_head("gone", "Content-Length: 100\r\n") + b"half")
        _reset(c.sock)
    connections_drained(nsqd)
    assert_no_traceback(nsqd, capfd)


# -- deadlines ----------------------------------------------------------------------------------


@pytest.fixture
def strict(make_nsqd):
    """A broker with tiny HTTP deadlines."""
    return make_nsqd(http_read_timeout=0.3, http_idle_timeout=0.3)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "partial",
    [
        b"",  # connected, silent
        b"POST /pub?topic=stall HTTP/1.1\r\nContent-Le",  # half a head
        b"POST /pub?topic=stall HTTP/1.1\r\nContent-Length: 10\r\n\r\nhalf",  # half a body
        b"POST /pub?topic=stall HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",  # half a chunk
    ],
)
def test_stalled_client_is_dropped(strict, partial):
    c = RawHTTP(strict)
    try:
        c.send(partial)
        assert c.closed_within(10.0)
        if partial.endswith(b"\r\n\r\n") or b"\r\n\r\n" in partial:  # a stalled body gets nsqd's read error
            assert c.read_reply().status == 500
        assert c.buf == b""
    finally:
        c.close()
    connections_drained(strict)
    assert strict.get_existing_topic("stall") is None
    assert_no_traceback(strict)


@pytest.mark.timeout(30)
def test_trickling_head_is_dropped_by_the_request_deadline(strict):
    """One byte at a time, each well within any per-read timeout, still ends at the deadline."""
    head = b"GET /ping HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 10000 + b"\r\n\r\n"
    c = RawHTTP(strict)
    sent = 0
    try:
        for byte in head:
            try:
                c.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            if c.closed_within(0.02):
                break
        else:
            pytest.fail("the whole trickled head was accepted")
    finally:
        c.close()
    assert sent < len(head)


@pytest.mark.timeout(30)
def test_idle_keep_alive_connection_is_dropped(strict):
    c = RawHTTP(strict)
    try:
        c.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert c.read_reply().body == b"OK"
        assert c.closed_within(10.0)
    finally:
        c.close()


@pytest.mark.timeout(30)
def test_silent_new_connection_is_bound_by_the_read_timeout_not_the_idle_one(make_nsqd):
    """A connection that never starts a request is stalled, not idle: the long idle timeout is for keep-alives."""
    nsqd = make_nsqd(http_read_timeout=0.3, http_idle_timeout=600.0)
    silent = RawHTTP(nsqd)
    kept = RawHTTP(nsqd)
    try:
        kept.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert kept.read_reply().body == b"OK"
        assert silent.closed_within(10.0)
        assert not kept.closed_within(0.5)  # well past the read timeout: a kept-alive connection stays
        kept.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert kept.read_reply().body == b"OK"
    finally:
        silent.close()
        kept.close()


@pytest.mark.timeout(60)
def test_fifty_stalled_clients_are_dropped_while_others_are_served(strict):
    clients = [RawHTTP(strict) for _ in range(50)]
    try:
        for i, c in enumerate(clients):
            c.send(b"POST /pub?topic=t HTTP/1.1\r\nContent-Length: 10\r\n"[: i % 40])
        ok = RawHTTP(strict)
        ok.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert ok.read_reply().body == b"OK"
        ok.close()
        connections_drained(strict)
    finally:
        for c in clients:
            c.close()


@pytest.mark.timeout(60)
def test_ordinary_keep_alive_client_is_never_dropped(make_nsqd):
    """Pauses between requests and inside a body, all within the deadlines, on one connection."""
    nsqd = make_nsqd(http_read_timeout=5.0, http_idle_timeout=5.0)
    c = RawHTTP(nsqd)
    pause = threading.Event()
    try:
        for i in range(5):
            c.send(pub_head("steady", "Content-Length: 5\r\n") + b"he")
            pause.wait(0.1)
            c.send(b"llo")
            r = c.read_reply()
            assert (r.status, r.body) == (200, b"OK")
            assert "connection" not in r.headers
            pause.wait(0.2)
    finally:
        c.close()
    assert nsqd.get_existing_topic("steady").depth() == 5


def test_deadline_options_are_durations():
    from nsqd_threaded.settings.options import DURATION, DURATION_OPTIONS, SETTINGS, Options, OptionError

    opts = Options()
    assert (opts.http_read_timeout, opts.http_idle_timeout) == (30.0, 60.0)
    kinds = {s.flag: s.kind for s in SETTINGS}
    assert kinds["http-read-timeout"] is kinds["http-idle-timeout"] is DURATION
    assert {"http_read_timeout", "http_idle_timeout"} <= DURATION_OPTIONS
    for field in ("http_read_timeout", "http_idle_timeout"):
        with pytest.raises(OptionError):
            Options(**{field: 0}).validate()


@pytest.mark.timeout(30)
def test_deadlines_from_the_command_line_and_config(tmp_path):
    from nsqd_threaded import cli

    def options_for(*args):
        return cli.resolve(cli.main.make_context("nsqd-threaded", list(args)).params)[0]

    opts = options_for("--http-read-timeout=300ms", "--http-idle-timeout=2m")
    assert (opts.http_read_timeout, opts.http_idle_timeout) == (0.3, 120.0)
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text('http_read_timeout = "1.5s"\nhttp_idle_timeout = 2500\n')
    opts = options_for("--config", str(cfg))
    assert (opts.http_read_timeout, opts.http_idle_timeout) == (1.5, 2.5)


@pytest.mark.timeout(30)
def test_config_shows_the_deadlines_in_ns(make_nsqd):
    nsqd = make_nsqd(http_read_timeout=1.5)
    c = RawHTTP(nsqd)
    try:
        c.send(b"GET /config/http_read_timeout HTTP/1.1\r\n\r\nGET /config/http_idle_timeout HTTP/1.1\r\n\r\n")
        assert c.read_reply().body == b"1500000000"
        assert c.read_reply().body == b"60000000000"
    finally:
        c.close()


# -- the listeners' connections ---------------------------------------------------------------


@pytest.mark.timeout(30)
def test_stop_closes_every_connection_and_joins_its_threads(make_nsqd):
    nsqd = make_nsqd()
    http_idle = RawHTTP(nsqd)
    http_mid = RawHTTP(nsqd)
    http_mid.send(pub_head("mid", "Content-Length: 10\r\n") + b"half")
    tcp = Conn(nsqd.tcp_address)
    tcp.identify()
    http_idle.send(b"GET /ping HTTP/1.1\r\n\r\n")
    assert http_idle.read_reply().body == b"OK"
    ports = {s.getsockname()[1] for s in (http_idle.sock, http_mid.sock, tcp.sock)}
    wait_for(lambda: nsqd._tcp_server.connection_count() == 1 and nsqd._http_server.connection_count() == 2)
    nsqd.stop()
    try:
        assert http_idle.closed_within(10.0)
        assert http_mid.closed_within(10.0)
        tcp.assert_closed()
        for t in threading.enumerate():
            assert not any(str(p) in t.name for p in ports), t.name
        assert nsqd._tcp_server.connection_count() == 0
        assert nsqd._http_server.connection_count() == 0
    finally:
        http_idle.close()
        http_mid.close()
        tcp.close()
