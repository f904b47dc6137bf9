"""The HTTP API over real HTTP/1.1 connections (spec: http-api.md).

Every route and every error row of the spec: exact status, exact body and the
V1 headers (http-api.md §2).  ``HTTP`` keeps one keep-alive connection per
test, so most tests also exercise several requests on one connection.
"""

import collections
import http.client
import json
import re
import shutil
import socket
import struct
import subprocess
import time
import urllib.parse

import pytest

from nsqd_threaded.broker.topic import TopicError
from wire import Conn, wait_for

JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
X_NSQ = "nsq; version=1.0"

Resp = collections.namedtuple("Resp", "status headers body")


class HTTP:
    """One HTTP/1.1 keep-alive connection to a broker (http.client reconnects if the server closed it)."""

    def __init__(self, nsqd, timeout=10.0):
        host, port = nsqd.http_address
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, chunked=False):
        self.conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        resp = self.conn.getresponse()
        return Resp(resp.status, resp.headers, resp.read())

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body=body, **kw)

    def put(self, path, body=None, **kw):
        return self.request("PUT", path, body=body, **kw)

    def stats(self, **params):
        """/stats?format=json with the given parameters, decoded (key order kept)."""
        r = self.get("/stats?" + urllib.parse.urlencode(dict(format="json", **params)))
        assert r.status == 200, r
        return json.loads(r.body)

    def close(self):
        self.conn.close()


@pytest.fixture
def h(nsqd):
    client = HTTP(nsqd)
    yield client
    client.close()


def error_body(message):
    return b'{"message":"%s"}' % message.encode()


def assert_error(r, status, message):
    """A V1 error (§2): ``{"message":"TEXT"}``, JSON content type, X-NSQ-Content-Type."""
    assert (r.status, r.body) == (status, error_body(message))
    assert r.headers["Content-Type"] == JSON_TYPE
    assert r.headers["X-NSQ-Content-Type"] == X_NSQ


def assert_text(r, body):
    """A V1 string result: 200, raw text, sniffed text/plain, X-NSQ-Content-Type."""
    assert (r.status, r.body) == (200, body)
    assert r.headers["Content-Type"] == TEXT_TYPE
    assert r.headers["X-NSQ-Content-Type"] == X_NSQ


def assert_empty(r):
    """A V1 nil result: 200, empty body, Content-Length 0, no Content-Type."""
    assert (r.status, r.body) == (200, b"")
    assert r.headers["Content-Length"] == "0"
    assert "Content-Type" not in r.headers
    assert r.headers["X-NSQ-Content-Type"] == X_NSQ


def assert_json(r, body):
    """A V1 object/array/number result: compact JSON."""
    assert (r.status, r.body) == (200, body)
    assert r.headers["Content-Type"] == JSON_TYPE
    assert r.headers["X-NSQ-Content-Type"] == X_NSQ


def topic_doc(h, name):
    docs = h.stats(topic=name, include_mem="false")["topics"]
    assert docs is not None and len(docs) == 1, docs
    return docs[0]


def channel_doc(h, topic, channel):
    chans = topic_doc(h, topic)["channels"]
    matching = [c for c in chans if c["channel_name"] == channel]
    assert len(matching) == 1, chans
    return matching[0]


def mpub_body(bodies, count=None):
    out = struct.pack(">i", len(bodies) if count is None else count)
    for b in bodies:
        out += struct.pack(">i", len(b)) + b
    return out


# -- /ping, /info -----------------------------------------------------------------


def test_ping_is_plain_text_without_nsq_header(h):
    r = h.get("/ping")
    assert (r.status, r.body) == (200, b"OK")
    assert r.headers["Content-Type"] == TEXT_TYPE
    assert "X-NSQ-Content-Type" not in r.headers


def test_ping_reports_the_last_backend_write_error(nsqd, h):
    nsqd.health_error = "disk full"
    try:
        r = h.get("/ping")
        assert (r.status, r.body) == (500, b"NOK - disk full")
        assert r.headers["Content-Type"] == TEXT_TYPE
        assert "X-NSQ-Content-Type" not in r.headers
        assert h.stats()["health"] == "NOK - disk full"
    finally:
        nsqd.health_error = None
    assert h.get("/ping").body == b"OK"


def test_info_keys_values_and_order(nsqd, h):
    r = h.get("/info")
    doc = json.loads(r.body)
    expected = (
        '{"version":"1.3.0","broadcast_address":%s,"hostname":%s,"http_port":%d,"tcp_port":%d,'
        '"start_time":%d,"max_heartbeat_interval":60000000000,"max_output_buffer_size":65536,'
        '"max_output_buffer_timeout":30000000000,"max_deflate_level":6,"topology_zone":"",'
        '"topology_region":""}'
        % (
            json.dumps(nsqd.options.broadcast_address),
            json.dumps(socket.gethostname()),
            nsqd.http_address[1],
            nsqd.tcp_address[1],
            doc["start_time"],
        )
    )
    assert_json(r, expected.encode())
    assert abs(doc["start_time"] - time.time()) < 60


def test_info_reflects_options(make_nsqd):
    nsqd = make_nsqd(
        broadcast_address="bc.example",
        max_heartbeat_interval=5.0,
        max_output_buffer_timeout=0.25,
        max_output_buffer_size=1024,
        max_deflate_level=9,
        topology_zone="z1",
        topology_region="r1",
    )
    r = HTTP(nsqd).get("/info")
    doc = json.loads(r.body)
    assert list(doc) == [
        "version", "broadcast_address", "hostname", "http_port", "tcp_port", "start_time",
        "max_heartbeat_interval", "max_output_buffer_size", "max_output_buffer_timeout",
        "max_deflate_level", "topology_zone", "topology_region",
    ]  # fmt: skip
    assert doc["broadcast_address"] == "bc.example"
    assert doc["max_heartbeat_interval"] == 5000000000
    assert doc["max_output_buffer_timeout"] == 250000000
    assert doc["max_output_buffer_size"] == 1024
    assert doc["max_deflate_level"] == 9
    assert (doc["topology_zone"], doc["topology_region"]) == ("z1", "r1")


def test_accept_and_accept_encoding_headers_are_ignored(h):
    plain = h.get("/info")
    for headers in (
        {"Accept": "application/vnd.nsq; version=1.0"},
        {"Accept": "text/html"},
        {"Accept-Encoding": "gzip, deflate"},
    ):
        r = h.get("/info", headers=headers)
        assert r.status == 200 and r.body == plain.body
        assert r.headers["Content-Type"] == JSON_TYPE
        assert "Content-Encoding" not in r.headers


# -- router ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/"),
        ("GET", "/nope"),
        ("POST", "/nope"),
        ("GET", "/topic"),
        ("POST", "/topic/nope"),
        ("GET", "/config"),
        ("GET", "/config/"),
        ("GET", "/config/a/b"),
        ("PUT", "/stats/x"),
    ],
)
def test_unknown_path_is_404(h, method, path):
    assert_error(h.request(method, path), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    "method,path,allow",
    [
        ("GET", "/pub", "OPTIONS, POST"),
        ("PUT", "/pub", "OPTIONS, POST"),
        ("GET", "/mpub", "OPTIONS, POST"),
        ("POST", "/ping", "GET, OPTIONS"),
        ("POST", "/info", "GET, OPTIONS"),
        ("POST", "/stats", "GET, OPTIONS"),
        ("DELETE", "/stats", "GET, OPTIONS"),
        ("GET", "/topic/create", "OPTIONS, POST"),
        ("GET", "/topic/delete", "OPTIONS, POST"),
        ("GET", "/topic/empty", "OPTIONS, POST"),
        ("GET", "/topic/pause", "OPTIONS, POST"),
        ("GET", "/topic/unpause", "OPTIONS, POST"),
        ("GET", "/channel/create", "OPTIONS, POST"),
        ("GET", "/channel/delete", "OPTIONS, POST"),
        ("GET", "/channel/empty", "OPTIONS, POST"),
        ("PATCH", "/channel/pause", "OPTIONS, POST"),
        ("GET", "/channel/unpause", "OPTIONS, POST"),
        ("POST", "/config/log_level", "GET, OPTIONS, PUT"),
        ("DELETE", "/config/nosuch", "GET, OPTIONS, PUT"),
    ],
)
def test_wrong_method_is_405_with_allow(h, method, path, allow):
    r = h.request(method, path)
    assert_error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["Allow"] == allow


def test_head_is_not_routed_and_sends_no_body(nsqd, h):
    r = h.request("HEAD", "/ping")
    assert (r.status, r.body) == (405, b"")
    assert r.headers["Allow"] == "GET, OPTIONS"
    assert r.headers["Content-Type"] == JSON_TYPE
    assert r.headers["X-NSQ-Content-Type"] == X_NSQ
    sock = h.conn.sock
    # No stray body bytes were sent: the next response on the connection parses.
    assert_json(h.get("/config/mem_queue_size"), b"10000")
    assert h.request("HEAD", "/stats").status == 405
    assert h.get("/ping").body == b"OK"
    assert h.conn.sock is sock


@pytest.mark.parametrize(
    "path,allow",
    [
        ("/pub", "OPTIONS, POST"),
        ("/ping", "GET, OPTIONS"),
        ("/stats", "GET, OPTIONS"),
        ("/channel/empty", "OPTIONS, POST"),
        ("/config/log_level", "GET, OPTIONS, PUT"),
    ],
)
def test_options_answers_allow_with_empty_body(h, path, allow):
    r = h.request("OPTIONS", path)
    assert (r.status, r.body) == (200, b"")
    assert r.headers["Allow"] == allow
    assert "X-NSQ-Content-Type" not in r.headers
    assert "Content-Type" not in r.headers


def test_options_on_unknown_path_is_404(h):
    assert_error(h.request("OPTIONS", "/nope"), 404, "NOT_FOUND")


def test_trailing_slash_get_redirects_301_keeping_the_query(h):
    r = h.get("/stats/?format=json&topic=a")
    assert r.status == 301
    assert r.headers["Location"] == "/stats?format=json&topic=a"
    assert r.headers["Content-Type"] == "text/html; charset=utf-8"
    assert r.body == b'<a href="/stats?format=json&amp;topic=a">Moved Permanently</a>.\n\n'
    r = h.get("/config/log_level/")
    assert (r.status, r.headers["Location"]) == (301, "/config/log_level")


def test_trailing_slash_post_redirects_307(h):
    r = h.post("/pub/?topic=x", b"m")
    assert (r.status, r.body) == (307, b"")
    assert r.headers["Location"] == "/pub?topic=x"
    r = h.post("/topic/create/?topic=x")
    assert (r.status, r.headers["Location"]) == (307, "/topic/create?topic=x")


def test_redirects_only_to_a_route_of_the_same_method(h):
    # httprouter looks the fixed path up in the request method's own tree.
    assert_error(h.post("/stats/"), 404, "NOT_FOUND")
    assert_error(h.get("/pub/"), 404, "NOT_FOUND")


def test_wrong_case_redirects_to_the_canonical_path(h):
    r = h.get("/PING")
    assert (r.status, r.headers["Location"]) == (301, "/ping")
    assert r.body == b'<a href="/ping">Moved Permanently</a>.\n\n'
    r = h.get("/Stats?format=json")
    assert (r.status, r.headers["Location"]) == (301, "/stats?format=json")
    r = h.post("/Topic/Create?topic=x")
    assert (r.status, r.headers["Location"]) == (307, "/topic/create?topic=x")


def test_percent_encoded_path_is_decoded_before_routing(h):
    assert h.get("/p%69ng").body == b"OK"


def test_keep_alive_serves_many_requests_on_one_connection(make_nsqd):
    nsqd = make_nsqd(max_msg_size=10)
    h = HTTP(nsqd)
    assert h.get("/ping").body == b"OK"
    sock = h.conn.sock
    assert_text(h.post("/pub?topic=ka", b"one"), b"OK")
    assert_error(h.get("/nope"), 404, "NOT_FOUND")
    assert_error(h.get("/pub"), 405, "METHOD_NOT_ALLOWED")
    # A rejected body is drained, so the next request still parses.
    assert_error(h.post("/pub?topic=ka", b"x" * 11), 413, "MSG_TOO_BIG")
    assert_error(h.post("/pub", b"body"), 400, "MISSING_ARG_TOPIC")
    assert_text(h.post("/mpub?topic=ka", b"two\nthree\n"), b"OK")
    assert_empty(h.post("/topic/create?topic=ka2"))
    assert_json(h.get("/config/max_msg_size"), b"10")
    assert topic_doc(h, "ka")["message_count"] == 3
    assert h.conn.sock is sock
    h.close()


# -- query parsing -----------------------------------------------------------------


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/pub?topic=a;b"),
        ("POST", "/pub?topic=a&x=%zz"),
        ("POST", "/mpub?topic=%"),
        ("GET", "/stats?format=json;"),
        ("GET", "/stats?%zz=1"),
        ("POST", "/topic/create?topic=t;x=1"),
        ("POST", "/topic/delete?topic=t&%g0"),
        ("POST", "/topic/empty?;"),
        ("POST", "/topic/pause?topic=%2"),
        ("POST", "/topic/unpause?topic=a;"),
        ("POST", "/channel/create?topic=t&channel=c;"),
        ("POST", "/channel/delete?topic=t&channel=%zz"),
        ("POST", "/channel/empty?a=;"),
        ("POST", "/channel/pause?topic=%"),
        ("POST", "/channel/unpause?;"),
    ],
)
def test_semicolon_or_bad_escape_is_invalid_request(h, method, path):
    assert_error(h.request(method, path, body=b"msg" if "pub" in path else None), 400, "INVALID_REQUEST")


def test_first_value_wins(nsqd, h):
    assert_empty(h.post("/topic/create?topic=first&topic=second"))
    assert [t["topic_name"] for t in h.stats()["topics"]] == ["first"]


def test_plus_decodes_to_space_and_percent_escapes_decode(nsqd, h):
    # "+5" (as %2B5) is a valid signed int; a literal "+" is a space -> " 5" is not.
    assert_text(h.post("/pub?topic=q&defer=%2B5", b"m"), b"OK")
    assert_error(h.post("/pub?topic=q&defer=+5", b"m"), 400, "INVALID_DEFER")
    assert_error(h.post("/topic/create?topic=a+b"), 400, "INVALID_TOPIC")
    assert_empty(h.post("/topic/create?topic=dot%2Ename&unused"))
    assert nsqd.get_existing_topic("dot.name") is not None


def test_form_bodies_are_ignored(h):
    r = h.post(
        "/topic/create", b"topic=x", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert_error(r, 400, "MISSING_ARG_TOPIC")


# -- /pub --------------------------------------------------------------------------


@pytest.fixture
def small(make_nsqd):
    """A broker with max-msg-size 100, max-body-size 400 and max-req-timeout 10 s."""
    return make_nsqd(max_msg_size=100, max_body_size=400, max_req_timeout=10.0)


def test_pub_accepts_exactly_max_msg_size(small):
    h = HTTP(small)
    assert_text(h.post("/pub?topic=big", b"x" * 100), b"OK")
    assert_error(h.post("/pub?topic=big", b"x" * 101), 413, "MSG_TOO_BIG")
    assert topic_doc(h, "big")["message_count"] == 1
    assert topic_doc(h, "big")["message_bytes"] == 100


def test_pub_chunked_body_over_max_is_msg_too_big(small):
    h = HTTP(small)
    assert_text(h.post("/pub?topic=ch", iter([b"x" * 60, b"y" * 40]), chunked=True), b"OK")
    r = h.post("/pub?topic=ch", iter([b"x" * 60, b"y" * 41]), chunked=True)
    assert_error(r, 413, "MSG_TOO_BIG")
    assert topic_doc(h, "ch")["message_bytes"] == 100


def test_pub_checks_run_in_the_spec_order(small):
    h = HTTP(small)
    # 1. size before everything, 4. empty before the query is parsed
    assert_error(h.post("/pub?topic=a;b", b"x" * 101), 413, "MSG_TOO_BIG")
    assert_error(h.post("/pub?topic=a;b"), 400, "MSG_EMPTY")
    assert_error(h.post("/pub"), 400, "MSG_EMPTY")
    # 5. parse, 6. missing topic, 7. invalid topic
    assert_error(h.post("/pub?topic=a;b", b"m"), 400, "INVALID_REQUEST")
    assert_error(h.post("/pub?topics=a", b"m"), 400, "MISSING_ARG_TOPIC")
    assert_error(h.post("/pub?topic=bad!", b"m"), 400, "INVALID_TOPIC")
    assert_error(h.post("/pub?topic=", b"m"), 400, "INVALID_TOPIC")
    assert_error(h.post("/pub?topic=" + "x" * 65, b"m"), 400, "INVALID_TOPIC")
    # 8. the topic is created before the defer value is validated
    assert_error(h.post("/pub?topic=made&defer=soon", b"m"), 400, "INVALID_DEFER")
    assert small.get_existing_topic("made") is not None
    assert topic_doc(h, "made")["message_count"] == 0
    assert small.get_existing_topic("bad!") is None


@pytest.mark.parametrize(
    "value",
    ["", "abc", "1.5", "5ms", "-1", "10001", "%205", "5%20", "1_0", "0x10", "%D9%A3", "99999999999999999999"],
)
def test_pub_invalid_defer(small, value):
    h = HTTP(small)
    assert_error(h.post("/pub?topic=d&defer=" + value, b"m"), 400, "INVALID_DEFER")
    assert topic_doc(h, "d")["message_count"] == 0


@pytest.mark.parametrize("value", ["0", "%2B0", "-0", "1", "007", "10000"])
def test_pub_valid_defer(small, value):
    h = HTTP(small)
    assert_text(h.post("/pub?topic=d&defer=" + value, b"m"), b"OK")
    assert topic_doc(h, "d")["message_count"] == 1


def test_pub_body_is_raw_bytes(nsqd, h):
    body = bytes(range(256)) + b"\r\n\n\x00tail"
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("raw", "c", rdy=1)
        assert_text(h.post("/pub?topic=raw", body, headers={"Content-Type": "text/plain"}), b"OK")
        assert sub.read_message()[3] == body


def test_deferred_http_pub_is_delivered_no_earlier_than_its_delay(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("later", "c", rdy=1)
        start = time.monotonic()
        assert_text(h.post("/pub?topic=later&defer=700", b"deferred"), b"OK")
        ch = channel_doc(h, "later", "c")
        assert (ch["deferred_count"], ch["depth"], ch["message_count"]) == (1, 0, 1)
        ts, attempts, mid, body = sub.read_message()
        assert time.monotonic() - start >= 0.7
        assert (attempts, body) == (1, b"deferred")
        sub.cmd(b"FIN " + mid)
        wait_for(lambda: channel_doc(h, "later", "c")["in_flight_count"] == 0, what="FIN")
        assert channel_doc(h, "later", "c")["deferred_count"] == 0


def test_pub_and_mpub_answer_503_when_the_put_fails(nsqd, h, monkeypatch):
    assert_empty(h.post("/topic/create?topic=x503"))
    topic = nsqd.get_existing_topic("x503")

    def fail(msgs):
        raise TopicError("exiting")

    monkeypatch.setattr(topic, "put_messages", fail)
    assert_error(h.post("/pub?topic=x503", b"m"), 503, "EXITING")
    assert_error(h.post("/mpub?topic=x503", b"a\nb"), 503, "EXITING")
    assert_error(h.post("/mpub?topic=x503&binary=true", mpub_body([b"a"])), 503, "EXITING")


# -- /mpub text mode ---------------------------------------------------------------


def read_bodies(conn, n):
    return [conn.read_message()[3] for _ in range(n)]


def test_mpub_text_splits_lines_keeps_cr_and_skips_empty_lines(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("lines", "c", rdy=10)
        assert_text(h.post("/mpub?topic=lines", b"a\nb\r\n\n\nc\r\r\n\nlast"), b"OK")
        assert read_bodies(sub, 4) == [b"a", b"b\r", b"c\r\r", b"last"]
        sub.assert_silent(0.2)
    assert topic_doc(h, "lines")["message_count"] == 4


@pytest.mark.parametrize("body", [b"", b"\n", b"\n\n\n"])
def test_mpub_text_with_no_message_is_ok_and_publishes_nothing(nsqd, h, body):
    assert_text(h.post("/mpub?topic=nothing", body), b"OK")
    t = topic_doc(h, "nothing")
    assert (t["message_count"], t["depth"]) == (0, 0)


@pytest.mark.parametrize("binary", ["false", "0"])
def test_mpub_binary_false_is_text_mode(nsqd, h, binary):
    assert_text(h.post("/mpub?topic=txt&binary=" + binary, b"x\ny"), b"OK")
    assert topic_doc(h, "txt")["message_count"] == 2


def test_mpub_text_line_limits(small):
    h = HTTP(small)
    assert_text(h.post("/mpub?topic=tl", b"x" * 100 + b"\n" + b"y" * 100 + b"\n"), b"OK")
    assert topic_doc(h, "tl")["message_count"] == 2
    # A line over max-msg-size fails the whole request: nothing is published.
    assert_error(h.post("/mpub?topic=tl", b"ok\n" + b"x" * 101 + b"\nok"), 413, "MSG_TOO_BIG")
    assert topic_doc(h, "tl")["message_count"] == 2
    # The "\n" does not count towards the line: 100 bytes + "\r" is 101.
    assert_error(h.post("/mpub?topic=tl", b"x" * 100 + b"\r\n"), 413, "MSG_TOO_BIG")


def test_mpub_body_too_big(small):
    h = HTTP(small)
    body = (b"x" * 99 + b"\n") * 4  # exactly max-body-size
    assert_text(h.post("/mpub?topic=bb", body), b"OK")
    assert_error(HTTP(small).post("/mpub?topic=bb", body + b"x"), 413, "BODY_TOO_BIG")
    # The size check comes before the query checks.
    assert_error(HTTP(small).post("/mpub", body + b"x"), 413, "BODY_TOO_BIG")
    assert topic_doc(HTTP(small), "bb")["message_count"] == 4


def test_mpub_query_checks(nsqd, h):
    assert_error(h.post("/mpub?topic=a;", b"m"), 400, "INVALID_REQUEST")
    assert_error(h.post("/mpub", b"m"), 400, "MISSING_ARG_TOPIC")
    assert_error(h.post("/mpub?topic=no/slash", b"m"), 400, "INVALID_TOPIC")


def test_mpub_ignores_defer(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("nodefer", "c", rdy=2)
        assert_text(h.post("/mpub?topic=nodefer&defer=60000", b"a\nb"), b"OK")
        assert read_bodies(sub, 2) == [b"a", b"b"]
        assert channel_doc(h, "nodefer", "c")["deferred_count"] == 0


# -- /mpub binary mode --------------------------------------------------------------


@pytest.mark.parametrize("binary", ["true", "1", "yes", "TRUE", "", "2"])
def test_mpub_binary_mode_spellings(nsqd, h, binary):
    bodies = [b"line\none", b"\x00\x01", b"x" * 1000]
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("bin", "c", rdy=10)
        assert_text(h.post("/mpub?topic=bin&binary=" + binary, mpub_body(bodies)), b"OK")
        assert read_bodies(sub, 3) == bodies


def test_mpub_binary_ignores_trailing_bytes(nsqd, h):
    assert_text(h.post("/mpub?topic=trail&binary=true", mpub_body([b"a", b"bc"]) + b"junk"), b"OK")
    assert topic_doc(h, "trail")["message_count"] == 2


@pytest.mark.parametrize(
    "body,message",
    [
        (b"", "BAD_BODY"),  # count cannot be read
        (b"\x00\x00\x01", "BAD_BODY"),
        (struct.pack(">i", 0), "BAD_BODY"),
        (struct.pack(">i", -1), "BAD_BODY"),
        (struct.pack(">i", 80) + b"\x00" * 100, "BAD_BODY"),  # > (400 - 4) / 5 = 79
        (struct.pack(">i", 1), "BAD_MESSAGE"),  # size cannot be read
        (struct.pack(">ii", 1, 0), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, -5), "BAD_MESSAGE"),
        (struct.pack(">ii", 1, 101) + b"x" * 101, "BAD_MESSAGE"),
        (struct.pack(">ii", 2, 1) + b"a" + struct.pack(">i", 5) + b"bc", "BAD_MESSAGE"),  # truncated
        (struct.pack(">ii", 2, 1) + b"a" + b"\x00\x00", "BAD_MESSAGE"),
    ],
)
def test_mpub_binary_errors_are_413_and_publish_nothing(small, body, message):
    h = HTTP(small)
    assert_error(h.post("/mpub?topic=binerr&binary=true", body), 413, message)
    t = topic_doc(h, "binerr")  # the topic was created before the body was read
    assert t["message_count"] == 0


def test_mpub_binary_count_limit_is_inclusive(small):
    h = HTTP(small)
    body = mpub_body([b"x"] * 79)  # (400 - 4) / 5 = 79 one-byte messages: 399 bytes
    assert len(body) == 399
    assert_text(h.post("/mpub?topic=many&binary=1", body), b"OK")
    assert topic_doc(h, "many")["message_count"] == 79


# -- /topic/* ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "route,query,status,message",
    [
        ("create", "", 400, "MISSING_ARG_TOPIC"),
        ("create", "?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("create", "?topic=bad!", 400, "INVALID_TOPIC"),
        ("create", "?topic=", 400, "INVALID_TOPIC"),
        ("create", "?topic", 400, "INVALID_TOPIC"),
        ("empty", "", 400, "MISSING_ARG_TOPIC"),
        ("empty", "?topic=bad!", 400, "INVALID_TOPIC"),
        ("empty", "?topic=nosuch", 404, "TOPIC_NOT_FOUND"),
        ("delete", "", 400, "MISSING_ARG_TOPIC"),
        ("delete", "?topic=bad!", 404, "TOPIC_NOT_FOUND"),  # no name validation
        ("delete", "?topic=", 404, "TOPIC_NOT_FOUND"),
        ("delete", "?topic=nosuch", 404, "TOPIC_NOT_FOUND"),
        ("pause", "", 400, "MISSING_ARG_TOPIC"),
        ("pause", "?topic=bad!", 404, "TOPIC_NOT_FOUND"),
        ("pause", "?topic=nosuch", 404, "TOPIC_NOT_FOUND"),
        ("unpause", "", 400, "MISSING_ARG_TOPIC"),
        ("unpause", "?topic=bad!", 404, "TOPIC_NOT_FOUND"),
        ("unpause", "?topic=nosuch", 404, "TOPIC_NOT_FOUND"),
    ],
)
def test_topic_route_errors(nsqd, h, route, query, status, message):
    assert_error(h.post("/topic/%s%s" % (route, query)), status, message)
    assert h.stats()["topics"] == []  # nothing was created


def test_topic_create_is_idempotent_and_creates_no_channel(nsqd, h):
    assert_empty(h.post("/topic/create?topic=tc"))
    assert_empty(h.post("/topic/create?topic=tc"))
    assert_empty(h.post("/topic/create?topic=eph%23ephemeral"))
    assert [(t["topic_name"], t["channels"]) for t in h.stats()["topics"]] == [
        ("eph#ephemeral", []),
        ("tc", []),
    ]


def test_paused_topic_keeps_accepting_and_stops_passing_to_channels(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("tp", "c", rdy=10)
        assert_empty(h.post("/topic/pause?topic=tp"))
        assert_empty(h.post("/topic/pause?topic=tp"))  # idempotent
        assert_text(h.post("/pub?topic=tp", b"m1"), b"OK")
        assert_text(h.post("/mpub?topic=tp", b"m2\nm3"), b"OK")
        t = topic_doc(h, "tp")
        assert (t["paused"], t["depth"], t["message_count"]) == (True, 3, 3)
        c = t["channels"][0]
        assert (c["paused"], c["depth"], c["message_count"], c["in_flight_count"]) == (False, 0, 0, 0)
        sub.assert_silent(0.3)
        assert_empty(h.post("/topic/unpause?topic=tp"))
        assert read_bodies(sub, 3) == [b"m1", b"m2", b"m3"]
        assert_empty(h.post("/topic/unpause?topic=tp"))  # idempotent
        t = topic_doc(h, "tp")
        assert (t["paused"], t["depth"], t["channels"][0]["message_count"]) == (False, 0, 3)


def test_topic_empty_drops_the_topic_queue_and_leaves_channels(make_nsqd):
    nsqd = make_nsqd(mem_queue_size=2)
    h = HTTP(nsqd)
    assert_empty(h.post("/topic/create?topic=te"))
    assert_empty(h.post("/channel/create?topic=te&channel=c"))
    assert_text(h.post("/mpub?topic=te", b"1\n2\n3"), b"OK")  # reaches the channel
    assert_empty(h.post("/topic/pause?topic=te"))
    assert_text(h.post("/mpub?topic=te", b"4\n5\n6\n7"), b"OK")  # stays in the topic
    t = topic_doc(h, "te")
    assert (t["depth"], t["backend_depth"]) == (4, 2)
    assert (t["channels"][0]["depth"], t["channels"][0]["backend_depth"]) == (3, 1)
    assert_empty(h.post("/topic/empty?topic=te"))
    t = topic_doc(h, "te")
    assert (t["depth"], t["backend_depth"], t["message_count"]) == (0, 0, 7)
    assert (t["channels"][0]["depth"], t["channels"][0]["backend_depth"]) == (3, 1)
    assert_empty(h.post("/topic/unpause?topic=te"))
    assert channel_doc(h, "te", "c")["message_count"] == 3


def test_topic_delete_closes_consumers_and_removes_it_from_stats(nsqd, h):
    with Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as other:
        sub.sub("gone", "c1", rdy=1)
        other.sub("stays", "c", rdy=1)
        assert_empty(h.post("/channel/create?topic=gone&channel=c2"))
        assert_text(h.post("/pub?topic=gone", b"m"), b"OK")
        assert sub.read_message()[3] == b"m"
        assert_empty(h.post("/topic/delete?topic=gone"))
        sub.assert_closed()
        assert [t["topic_name"] for t in h.stats()["topics"]] == ["stays"]
        assert h.stats(topic="gone")["topics"] is None
        assert_error(h.post("/topic/delete?topic=gone"), 404, "TOPIC_NOT_FOUND")
        assert_error(h.post("/channel/empty?topic=gone&channel=c2"), 404, "TOPIC_NOT_FOUND")
        assert_text(h.post("/pub?topic=stays", b"alive"), b"OK")
        assert other.read_message()[3] == b"alive"


# -- /channel/* ---------------------------------------------------------------------

CHANNEL_ROUTES = ["create", "delete", "empty", "pause", "unpause"]


@pytest.mark.parametrize("route", CHANNEL_ROUTES)
@pytest.mark.parametrize(
    "query,status,message",
    [
        ("", 400, "MISSING_ARG_TOPIC"),
        ("?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("?topic=&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("?topic=nosuch", 400, "MISSING_ARG_CHANNEL"),  # argument checks before existence
        ("?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
        ("?topic=t&channel=", 400, "INVALID_ARG_CHANNEL"),
        ("?topic=t&channel=" + "c" * 65, 400, "INVALID_ARG_CHANNEL"),
        ("?topic=nosuch&channel=c", 404, "TOPIC_NOT_FOUND"),
        ("?topic=t;&channel=c", 400, "INVALID_REQUEST"),
    ],
)
def test_channel_route_errors(nsqd, h, route, query, status, message):
    assert_empty(h.post("/topic/create?topic=t"))
    assert_error(h.post("/channel/%s%s" % (route, query)), status, message)
    assert [(t["topic_name"], t["channels"]) for t in h.stats()["topics"]] == [("t", [])]


@pytest.mark.parametrize("route", ["delete", "empty", "pause", "unpause"])
def test_channel_not_found(nsqd, h, route):
    assert_empty(h.post("/topic/create?topic=t"))
    assert_error(h.post("/channel/%s?topic=t&channel=nosuch" % route), 404, "CHANNEL_NOT_FOUND")


def test_channel_create_needs_an_existing_topic_and_is_idempotent(nsqd, h):
    assert_error(h.post("/channel/create?topic=later&channel=c"), 404, "TOPIC_NOT_FOUND")
    assert h.stats()["topics"] == []
    assert_empty(h.post("/topic/create?topic=later"))
    assert_empty(h.post("/channel/create?topic=later&channel=c"))
    assert_empty(h.post("/channel/create?topic=later&channel=c"))
    assert_empty(h.post("/channel/create?topic=later&channel=e%23ephemeral"))
    names = [c["channel_name"] for c in topic_doc(h, "later")["channels"]]
    assert names == ["c", "e#ephemeral"]


def test_paused_channel_stops_delivering_and_resumes_on_unpause(nsqd, h):
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("cp", "c", rdy=10)
        assert_text(h.post("/pub?topic=cp", b"before"), b"OK")
        _, _, first, _ = sub.read_message()
        assert_empty(h.post("/channel/pause?topic=cp&channel=c"))
        assert_empty(h.post("/channel/pause?topic=cp&channel=c"))  # idempotent
        assert_text(h.post("/mpub?topic=cp", b"p1\np2"), b"OK")
        c = channel_doc(h, "cp", "c")
        assert (c["paused"], c["depth"], c["message_count"], c["in_flight_count"]) == (True, 2, 3, 1)
        sub.assert_silent(0.3)
        # In-flight messages can still be finished while paused.
        sub.cmd(b"FIN " + first)
        wait_for(lambda: channel_doc(h, "cp", "c")["in_flight_count"] == 0, what="FIN while paused")
        sub.assert_silent(0.2)
        assert topic_doc(h, "cp")["paused"] is False
        assert_empty(h.post("/channel/unpause?topic=cp&channel=c"))
        assert read_bodies(sub, 2) == [b"p1", b"p2"]
        assert_empty(h.post("/channel/unpause?topic=cp&channel=c"))  # idempotent
        assert channel_doc(h, "cp", "c")["paused"] is False


def test_channel_empty_discards_queued_in_flight_and_deferred(make_nsqd):
    nsqd = make_nsqd(mem_queue_size=2)
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("ce", "c", rdy=2)
        assert_text(h.post("/mpub?topic=ce", b"a\nb\nc\nd\ne"), b"OK")
        (_, _, id_a, _), (_, _, id_b, _) = sub.read_message(), sub.read_message()
        sub.cmd(b"RDY 0")
        sub.cmd(b"REQ " + id_b + b" 60000")
        wait_for(lambda: channel_doc(h, "ce", "c")["deferred_count"] == 1, what="deferred")
        c = channel_doc(h, "ce", "c")
        assert (c["depth"], c["in_flight_count"], c["deferred_count"]) == (3, 1, 1)
        assert c["clients"][0]["in_flight_count"] == 1
        assert_empty(h.post("/channel/empty?topic=ce&channel=c"))
        c = channel_doc(h, "ce", "c")
        assert (c["depth"], c["backend_depth"], c["in_flight_count"], c["deferred_count"]) == (0, 0, 0, 0)
        assert c["clients"][0]["in_flight_count"] == 0
        assert c["message_count"] == 5
        sub.cmd(b"FIN " + id_a)
        assert sub.read_error().startswith("E_FIN_FAILED FIN %s failed" % id_a.decode())
        # The consumer's in-flight counter was reset: RDY 1 gets the next message.
        sub.cmd(b"RDY 1")
        assert_text(h.post("/pub?topic=ce", b"fresh"), b"OK")
        assert sub.read_message()[3] == b"fresh"


def test_channel_delete_closes_its_consumers_only(nsqd, h):
    with Conn(nsqd.tcp_address) as s1, Conn(nsqd.tcp_address) as s2:
        s1.sub("cd", "c1", rdy=1)
        s2.sub("cd", "c2", rdy=1)
        assert_empty(h.post("/channel/delete?topic=cd&channel=c1"))
        s1.assert_closed()
        assert [c["channel_name"] for c in topic_doc(h, "cd")["channels"]] == ["c2"]
        assert_text(h.post("/pub?topic=cd", b"m"), b"OK")
        assert s2.read_message()[3] == b"m"
        assert_error(h.post("/channel/delete?topic=cd&channel=c1"), 404, "CHANNEL_NOT_FOUND")
    assert [t["topic_name"] for t in h.stats()["topics"]] == ["cd"]


# -- /config --------------------------------------------------------------------------


def test_config_get_values(make_nsqd):
    nsqd = make_nsqd(
        e2e_processing_latency_percentiles=[0.5, 0.99],
        broadcast_address="127.0.0.1",
        nsqlookupd_tcp_addresses=[],
    )
    h = HTTP(nsqd)
    port = nsqd.http_address[1]
    json_cases = {
        "mem_queue_size": b"10000",
        "msg_timeout": b"60000000000",
        "max_msg_timeout": b"900000000000",
        "max_req_timeout": b"3600000000000",
        "sync_timeout": b"2000000000",
        "output_buffer_timeout": b"250000000",
        "min_output_buffer_timeout": b"25000000",
        "e2e_processing_latency_window_time": b"600000000000",
        "log_level": b"2",
        "tls_min_version": b"769",
        "tls_required": b"0",
        "max_msg_size": b"1048576",
        "max_body_size": b"5242880",
        "max_rdy_count": b"2500",
        "statsd_mem_stats": b"true",
        "statsd_exclude_ephemeral": b"false",
        "nsqlookupd_tcp_addresses": b"[]",
        "auth_http_addresses": b"[]",
        "e2e_processing_latency_percentiles": b"[0.99,0.5]",
        "id": b"1",
        "broadcast_tcp_port": str(nsqd.tcp_address[1]).encode(),
        "broadcast_http_port": str(port).encode(),
    }
    for name, body in json_cases.items():
        assert_json(h.get("/config/" + name), body)
    text_cases = {
        "statsd_prefix": b"nsq.127_0_0_1_%d." % port,
        "broadcast_address": b"127.0.0.1",
        "http_address": b"127.0.0.1:0",
        "https_address": b"0.0.0.0:4152",
        "auth_http_request_method": b"get",
        "log_prefix": b"[nsqd] ",
        "data_path": nsqd.options.data_path.encode(),
    }
    for name, body in text_cases.items():
        assert_text(h.get("/config/" + name), body)


def test_config_empty_string_option_is_an_unsniffed_empty_body(nsqd, h):
    # An empty string result writes the same zero bytes as a nil one: nothing to sniff.
    assert_empty(h.get("/config/topology_zone"))
    assert_empty(h.get("/config/tls_cert"))


@pytest.mark.parametrize(
    "name",
    ["node_id", "nosuch", "client_timeout", "queue_scan_interval", "queue_scan_refresh_interval",
     "queue_scan_dirty_percent", "logger", "version", "Log_Level"],
)  # fmt: skip
def test_config_get_invalid_option(h, name):
    assert_error(h.get("/config/" + name), 400, "INVALID_OPTION")


@pytest.mark.parametrize("name", ["validate", "durable_unknown", "__class__"])
def test_config_get_method_names_are_not_options(h, name):
    assert_error(h.get("/config/" + name), 400, "INVALID_OPTION")


def test_config_put_log_level(nsqd, h):
    assert_json(h.put("/config/log_level", b"warn"), b"3")
    assert_json(h.get("/config/log_level"), b"3")
    assert_json(h.put("/config/log_level", b"ERROR"), b"4")
    assert_json(h.put("/config/log_level", b"Debug"), b"1")
    assert_error(h.put("/config/log_level", b"info\n"), 400, "INVALID_VALUE")
    assert_error(h.put("/config/log_level", b" info"), 400, "INVALID_VALUE")
    assert_error(h.put("/config/log_level", b"verbose"), 400, "INVALID_VALUE")
    assert_error(h.put("/config/log_level", b"2"), 400, "INVALID_VALUE")
    assert_error(h.put("/config/log_level", b""), 413, "INVALID_VALUE")
    assert_error(h.put("/config/log_level"), 413, "INVALID_VALUE")
    assert_json(h.get("/config/log_level"), b"1")  # failures changed nothing
    assert_json(h.put("/config/log_level", b"fatal"), b"5")
    assert_json(h.put("/config/log_level", b"info"), b"2")


def test_config_put_body_limit_is_max_msg_size(make_nsqd):
    nsqd = make_nsqd(max_msg_size=10)
    h = HTTP(nsqd)
    assert_error(h.put("/config/log_level", b"x" * 11), 413, "INVALID_VALUE")
    assert_error(h.put("/config/nsqlookupd_tcp_addresses", b'["1234:56"]'), 413, "INVALID_VALUE")
    assert_json(h.put("/config/nsqlookupd_tcp_addresses", b'["1:3456"]'), b'["1:3456"]')  # 10 bytes
    # The size check comes before the option name.
    assert_error(h.put("/config/nosuch", b""), 413, "INVALID_VALUE")
    assert_error(h.put("/config/nosuch", b"x" * 11), 413, "INVALID_VALUE")


def test_config_put_nsqlookupd_tcp_addresses(nsqd, h):
    assert_json(
        h.put("/config/nsqlookupd_tcp_addresses", b'["127.0.0.1:4160", "10.0.0.1:4160"]'),
        b'["127.0.0.1:4160","10.0.0.1:4160"]',
    )
    assert_json(h.get("/config/nsqlookupd_tcp_addresses"), b'["127.0.0.1:4160","10.0.0.1:4160"]')
    for bad in (b"[1]", b'"127.0.0.1:4160"', b"{}", b"[", b"127.0.0.1:4160", b'["a", 2]', b"[[]]"):
        assert_error(h.put("/config/nsqlookupd_tcp_addresses", bad), 400, "INVALID_VALUE")
    assert_json(h.get("/config/nsqlookupd_tcp_addresses"), b'["127.0.0.1:4160","10.0.0.1:4160"]')
    assert_json(h.put("/config/nsqlookupd_tcp_addresses", b"[]"), b"[]")


@pytest.mark.parametrize("name", ["mem_queue_size", "msg_timeout", "statsd_prefix", "nosuch", "node_id"])
def test_config_put_other_options_is_invalid_option(h, name):
    assert_error(h.put("/config/" + name, b"5"), 400, "INVALID_OPTION")


# -- curl, as the spec records it ------------------------------------------------------


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_sequences_from_the_spec(make_nsqd, tmp_path):
    nsqd = make_nsqd(e2e_processing_latency_percentiles=[0.99, 0.5], broadcast_address="127.0.0.1")
    base = "http://%s:%d" % nsqd.http_address
    port = nsqd.http_address[1]

    def curl(*args):
        out = subprocess.run(
            ["curl", "-s", "-w", "\n%{http_code}", *args[:-1], base + args[-1]],
            stdout=subprocess.PIPE,
            timeout=20,
            check=True,
        ).stdout
        body, _, code = out.rpartition(b"\n")
        return int(code), body

    assert curl("/ping") == (200, b"OK")
    assert curl("-X", "POST", "-d", "hello", "/pub?topic=curl") == (200, b"OK")
    assert curl("-X", "POST", "/pub?topic=curl") == (400, b'{"message":"MSG_EMPTY"}')
    assert curl("/pub?topic=curl") == (405, b'{"message":"METHOD_NOT_ALLOWED"}')
    assert curl("/nope") == (404, b'{"message":"NOT_FOUND"}')
    assert curl("-X", "POST", "-d", "topic=x", "/topic/create") == (400, b'{"message":"MISSING_ARG_TOPIC"}')
    assert curl("-X", "POST", "/topic/create?topic=a;b") == (400, b'{"message":"INVALID_REQUEST"}')
    assert curl("-X", "POST", "/topic/create?topic=%zz") == (400, b'{"message":"INVALID_REQUEST"}')
    assert curl("-X", "POST", "/topic/create?topic=a&topic=b") == (200, b"")
    assert curl("-X", "POST", "/topic/delete?topic=b") == (404, b'{"message":"TOPIC_NOT_FOUND"}')
    assert curl("-X", "POST", "/topic/delete?topic=a") == (200, b"")
    assert curl("-X", "POST", "--data-binary", "a\n\n", "/mpub?topic=curl") == (200, b"OK")
    assert curl("-X", "POST", "--data-binary", "\n", "/mpub?topic=curl") == (200, b"OK")
    zero_count = tmp_path / "zero-count"
    zero_count.write_bytes(b"\x00\x00\x00\x00")
    assert curl("-X", "POST", "--data-binary", "@%s" % zero_count, "/mpub?topic=curl&binary=true") == (
        413,
        b'{"message":"BAD_BODY"}',
    )
    assert curl("-X", "POST", "-d", "m", "/pub?topic=curl&defer=-1") == (400, b'{"message":"INVALID_DEFER"}')
    assert curl("/config/mem_queue_size") == (200, b"10000")
    assert curl("/config/msg_timeout") == (200, b"60000000000")
    assert curl("/config/log_level") == (200, b"2")
    assert curl("/config/tls_min_version") == (200, b"769")
    assert curl("/config/tls_required") == (200, b"0")
    assert curl("/config/nsqlookupd_tcp_addresses") == (200, b"[]")
    assert curl("/config/e2e_processing_latency_percentiles") == (200, b"[0.99,0.5]")
    assert curl("/config/statsd_prefix") == (200, b"nsq.127_0_0_1_%d." % port)
    assert curl("/config/broadcast_tcp_port") == (200, str(nsqd.tcp_address[1]).encode())
    assert curl("/config/node_id") == (400, b'{"message":"INVALID_OPTION"}')
    assert curl("-X", "PUT", "-d", "warn", "/config/log_level") == (200, b"3")
    assert curl("-X", "PUT", "--data-binary", "warn\n", "/config/log_level") == (
        400,
        b'{"message":"INVALID_VALUE"}',
    )
    assert curl("-X", "PUT", "/config/log_level") == (413, b'{"message":"INVALID_VALUE"}')
    assert curl("-X", "PUT", "-d", '["127.0.0.1:4160"]', "/config/nsqlookupd_tcp_addresses") == (
        200,
        b'["127.0.0.1:4160"]',
    )
    assert curl("/config/nsqlookupd_tcp_addresses") == (200, b'["127.0.0.1:4160"]')
    assert curl("-X", "POST", "/topic/pause?topic=curl") == (200, b"")
    code, body = curl("/stats?topic=curl&include_mem=false")
    assert code == 200
    assert b"\n*P [curl           ] depth: 2     be-depth: 0     msgs: 2        e2e%: \n" in body


def test_debug_log_names_every_answered_error(make_nsqd):
    """--log-level=debug logs each HTTP error the broker answers (method, path, client, status, body);
    at the default level nothing of it."""
    quiet = make_nsqd()
    h = HTTP(quiet)
    try:
        assert h.get("/nope").status == 404
    finally:
        h.close()
    assert "answered 404" not in quiet.log.stream.getvalue()

    nsqd = make_nsqd(log_level="debug")
    h = HTTP(nsqd)
    try:
        assert h.get("/nope").status == 404
        assert h.post("/pub?topic=bad!name", b"x").status == 400
        assert h.post("/pub?topic=ok", b"x").status == 200
    finally:
        h.close()
    log = nsqd.log.stream.getvalue()
    assert re.search(r"DEBUG: HTTP: GET /nope \(127\.0\.0\.1:\d+\) answered 404 \{\"message\":\"NOT_FOUND\"\}", log), log
    assert re.search(r"DEBUG: HTTP: POST /pub\?topic=bad!name \(127\.0\.0\.1:\d+\) answered 400 "
                     r"\{\"message\":\"INVALID_TOPIC\"\}", log), log
    assert "/pub?topic=ok (" not in log
