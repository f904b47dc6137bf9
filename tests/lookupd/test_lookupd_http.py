"""nsqlookupd's HTTP edge under hostile or broken clients: the broker's framing, deadlines and error bodies.

Raw sockets throughout.  The rules are the broker's: never reuse a connection
whose framing is in doubt (answer 400 and close), never act on bytes that
might be a smuggled request, drop a client that stalls, and every error body
in the ``{"message":"..."}`` form.
"""

import pytest

from nsqd_threaded.lookupd import NSQLookupd

from support.http_raw import RawHTTP
from support.lookupd import get_json, request
from support.wire import wait_for

pytestmark = pytest.mark.timeout(60)

BAD_REQUEST = b'{"message":"BAD_REQUEST"}'


@pytest.fixture
def raw(lookupd):
    clients = []

    def connect(target=lookupd):
        c = RawHTTP(target)
        clients.append(c)
        return c

    yield connect
    for c in clients:
        c.close()


def topics(lookupd):
    return get_json(lookupd, "/topics")["topics"]


def no_traceback(lookupd):
    text = lookupd.log_text()
    assert "Traceback" not in text and "ERROR" not in text, text


@pytest.mark.parametrize(
    "headers",
    [
        b"Content-Length: -1\r\n",
        b"Content-Length: abc\r\n",
        b"Content-Length: 0x10\r\n",
        b"Content-Length: 3\r\nContent-Length: 4\r\n",
        b"Content-Length: 99999999999999999999\r\n",
    ],
    ids=["negative", "not-digits", "hex", "conflicting-duplicates", "over-int63"],
)
def test_bad_content_length_is_400_and_closed(lookupd, raw, headers):
    c = raw()
    c.send(b"POST /topic/create?topic=framed HTTP/1.1\r\n" + headers + b"\r\nabcd")
    reply = c.read_reply()
    assert (reply.status, reply.body) == (400, BAD_REQUEST)
    assert reply.headers["content-type"] == "application/json; charset=utf-8"
    assert reply.headers["connection"] == "close"
    c.assert_closed()
    assert topics(lookupd) == []  # the handler never ran
    no_traceback(lookupd)


def test_agreeing_duplicate_content_lengths_are_one(lookupd, raw):
    c = raw()
    c.send(b"POST /topic/create?topic=a HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nxyz"
           b"GET /ping HTTP/1.1\r\n\r\n")
    assert c.read_reply().status == 200
    assert c.read_reply().body == b"OK"  # the body was skipped exactly: the connection is kept
    assert topics(lookupd) == ["a"]


def test_negative_content_length_smuggles_nothing(lookupd, raw):
    """``Content-Length: -1`` once read as 0 made the body a second request; now the connection ends first."""
    c = raw()
    c.send(b"POST /topic/create?topic=outer HTTP/1.1\r\nContent-Length: -1\r\n\r\n"
           b"POST /topic/create?topic=smuggled HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert c.read_reply().status == 400
    c.assert_closed()
    assert topics(lookupd) == []


def test_chunked_body_hides_no_request(lookupd, raw):
    """A request inside a chunked body (with a decoy Content-Length) is body, read and dropped."""
    inner = b"POST /topic/create?topic=smuggled HTTP/1.1\r\n\r\n"
    c = raw()
    c.send(b"POST /topic/create?topic=outer HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
           + b"%x\r\n" % len(inner) + inner + b"\r\n0\r\n\r\n"
           + b"GET /topics HTTP/1.1\r\n\r\n")
    assert c.read_reply().status == 200
    assert c.read_reply().body == b'{"topics":["outer"]}'


@pytest.mark.parametrize("encoding", [b"gzip", b"chunked, chunked"])
def test_unsupported_transfer_encoding_is_501_and_closed(lookupd, raw, encoding):
    c = raw()
    c.send(b"POST /topic/create?topic=t HTTP/1.1\r\nTransfer-Encoding: " + encoding + b"\r\n\r\n")
    reply = c.read_reply()
    assert (reply.status, reply.body) == (501, b'{"message":"NOT_IMPLEMENTED"}')
    c.assert_closed()
    assert topics(lookupd) == []


def test_malformed_requests_get_json_errors_not_html(lookupd, raw):
    c = raw()
    c.send(b"NONSENSE\r\n\r\n")
    reply = c.read_reply()
    assert (reply.status, reply.body) == (400, BAD_REQUEST)
    c.assert_closed()
    c = raw()
    c.send(b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n")
    assert c.read_reply().status == 414
    no_traceback(lookupd)


def test_large_unread_body_closes_after_the_reply(lookupd, raw):
    c = raw()
    body = b"x" * (1 << 20)
    c.send(b"POST /topic/create?topic=big HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body))
    reply = c.read_reply()  # answered without waiting for the body
    assert (reply.status, reply.headers["connection"]) == (200, "close")
    assert topics(lookupd) == ["big"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "partial",
    [b"", b"POST /topic/create?topic=stall HTTP/1.1\r\nHost: x"],
    ids=["silent", "half-head"],
)
def test_stalled_client_is_dropped(make_lookupd, partial):
    lookupd = make_lookupd(http_read_timeout=0.2, http_idle_timeout=0.2)
    c = RawHTTP(lookupd)
    try:
        c.send(partial)
        assert c.closed_within(10.0)
        assert c.buf == b""  # dropped without a reply
    finally:
        c.close()
    wait_for(lambda: lookupd._http.connection_count() == 0, what="the stalled connection to be dropped")
    assert topics(lookupd) == []
    no_traceback(lookupd)


@pytest.mark.timeout(30)
def test_stalled_body_is_dropped_after_the_reply(make_lookupd):
    """nsqlookupd answers from the head (it reads no bodies); the unfinished body then ends the connection."""
    lookupd = make_lookupd(http_read_timeout=0.2, http_idle_timeout=0.2)
    c = RawHTTP(lookupd)
    try:
        c.send(b"POST /topic/create?topic=t HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
        assert c.closed_within(10.0)
        reply = c.read_reply()
        assert (reply.status, reply.headers["connection"]) == (200, "close")
    finally:
        c.close()
    wait_for(lambda: lookupd._http.connection_count() == 0, what="the stalled connection to be dropped")
    no_traceback(lookupd)


@pytest.mark.timeout(30)
def test_idle_keep_alive_is_dropped_and_others_are_served(make_lookupd):
    lookupd = make_lookupd(http_read_timeout=5.0, http_idle_timeout=0.2)
    idle = RawHTTP(lookupd)
    try:
        idle.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert idle.read_reply().body == b"OK"
        assert idle.closed_within(10.0)
        assert request(lookupd, "GET", "/ping")[::2] == (200, b"OK")
    finally:
        idle.close()


def test_stop_closes_kept_alive_connections(make_lookupd):
    lookupd = make_lookupd()
    c = RawHTTP(lookupd)
    try:
        c.send(b"GET /ping HTTP/1.1\r\n\r\n")
        assert c.read_reply().body == b"OK"
        assert lookupd._http.connection_count() == 1
        lookupd.stop()  # joins the connection thread: it must not wait for the idle timeout
        assert c.closed_within(10.0)
    finally:
        c.close()


def test_requests_are_logged_at_info(lookupd):
    assert request(lookupd, "GET", "/ping?x=1")[0] == 200
    wait_for(lambda: "INFO: 200 GET /ping?x=1 (127.0.0.1:" in lookupd.log_text(), what="the request log line")


def test_deadline_options():
    lookupd = NSQLookupd.local(http_read_timeout=1.5, http_idle_timeout=2.5)
    assert (lookupd.options.http_read_timeout, lookupd.options.http_idle_timeout) == (1.5, 2.5)
    with pytest.raises(ValueError, match="--http-read-timeout"):
        NSQLookupd.local(http_read_timeout=0)


# -- cross-origin requests --------------------------------------------------------------------------


@pytest.mark.parametrize("origin", ["http://evil.example", "http://127.0.0.1:1", "null"])
def test_a_change_from_another_origin_is_refused(lookupd, origin):
    assert request(lookupd, "POST", "/topic/create?topic=kept")[0] == 200
    for path in ("/topic/delete?topic=kept", "/topic/create?topic=planted", "/channel/create?topic=kept&channel=c",
                 "/topic/tombstone?topic=kept&node=x:1"):
        status, headers, body = request(lookupd, "POST", path, headers={"Origin": origin})
        assert (status, body) == (403, b'{"message":"CROSS_ORIGIN_FORBIDDEN"}')
        assert headers["content-type"] == "application/json; charset=utf-8"
    assert topics(lookupd) == ["kept"] and get_json(lookupd, "/channels?topic=kept")["channels"] == []
    assert request(lookupd, "GET", "/topics", headers={"Origin": origin})[0] == 200  # reads stay open
    # without Origin (curl, nsqadmin's server-side calls) or from its own origin: as before
    own = "http://127.0.0.1:%d" % lookupd.http_address[1]
    assert request(lookupd, "POST", "/topic/create?topic=mine", headers={"Origin": own})[0] == 200
    assert request(lookupd, "POST", "/topic/delete?topic=kept")[0] == 200
    assert topics(lookupd) == ["mine"]
