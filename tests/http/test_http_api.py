"""nsqd's HTTP API: /ping and /info, the router, query parsing, and curl's requests as http-api.md records them."""

import json
import shutil
import socket
import subprocess
import time

import pytest

from support.http_api import (  # noqa: F401 (fixtures among them)
    HTTP,
    JSON_TYPE,
    TEXT_TYPE,
    X_NSQ,
    assert_empty,
    assert_error,
    assert_json,
    assert_text,
    h,
    topic_doc,
)

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
