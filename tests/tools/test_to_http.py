"""nsq_to_http against a real broker and real local HTTP endpoints (and Go's tool when present)."""

import base64
import signal
import socket
import urllib.parse

import pytest

from nsqd_threaded.client import Producer

from support.http_sink import ScriptedServer, Sink, then_close
from support.tools import Tool, channel_counts, go_tool, make_channels, run
from support.wire import wait_for

pytestmark = pytest.mark.timeout(120)

BODIES = [b"hello", b"with spaces & a=b?c", "ünïcode/é".encode(), b"\x00\xffbinary", b"x" * 3000, b"~-_.!*'()"]
# go-nsq's requeue delay and backoff, made short so that retries happen within a test
FAST_RETRY = ["--consumer-opt=default_requeue_delay,50ms", "--consumer-opt=backoff_multiplier,50ms"]


def publish(broker, topic, bodies):
    with Producer(broker.tcp_addr) as producer:
        producer.mpub(topic, bodies)


def drained(broker, topic, channel):
    return lambda: channel_counts(broker, topic, channel) == (0, 0, 0)


def stop(tool):
    tool.signal(signal.SIGTERM)
    code = tool.wait()
    tool.close()
    return code


def closed_port():
    """A 127.0.0.1 port nobody listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_post_sends_each_body_once_with_content_type_headers_and_user_agent(broker):
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", BODIES)
    with Sink() as sink:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=%s/in?x=1" % sink.url,
                    "--content-type=text/plain", "--header=x-api-key: s3cret", "--header", "X-Other:two")
        try:
            sink.wait(lambda reqs: len(reqs) == len(BODIES), what="every message")
            wait_for(drained(broker, "t", "nsq_to_http"), what="every message FINed")
        finally:
            assert stop(tool) == 0
    assert sorted(r.body for r in sink.requests) == sorted(BODIES)
    for r in sink.requests:
        assert (r.method, r.path) == ("POST", "/in?x=1")
        assert r.header("Content-Type") == "text/plain"
        assert r.header("X-Api-Key") == "s3cret" and r.header("X-Other") == "two"
        assert r.header("User-Agent") == "nsq_to_http v1.3.0"


def test_get_replaces_the_template_with_the_query_escaped_body(broker):
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", BODIES)
    with Sink() as sink:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr,
                    "--get=%s/q?data=%%s&src=nsq" % sink.url)
        try:
            sink.wait(lambda reqs: len(reqs) == len(BODIES), what="every message")
        finally:
            assert stop(tool) == 0
    assert all(r.method == "GET" and r.body == b"" for r in sink.requests)
    assert sorted(r.path for r in sink.requests) == sorted(
        "/q?data=%s&src=nsq" % urllib.parse.quote_plus(b, safe="") for b in BODIES)
    assert "/q?data=with+spaces+%26+a%3Db%3Fc&src=nsq" in [r.path for r in sink.requests]


def test_a_failing_endpoint_is_retried_and_no_message_is_lost(broker):
    bodies = [b"m%03d" % i for i in range(60)]
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Sink(statuses=[500] * 6 + [503] * 2) as sink:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + sink.url, "-n", "4",
                    *FAST_RETRY)
        try:
            sink.wait(lambda reqs: len({r.body for r in reqs if r.status == 200}) == len(bodies), timeout=60,
                      what="every message accepted")
            wait_for(drained(broker, "t", "nsq_to_http"), timeout=30, what="every message FINed")
        finally:
            assert stop(tool) == 0
    assert sorted(r.body for r in sink.succeeded()) == bodies  # each exactly once
    assert sum(r.status >= 500 for r in sink.requests) == 8
    assert b"got status code 500" in tool.err and b"backing off" in tool.err


def test_round_robin_alternates_between_endpoints(broker):
    bodies = [b"rr%02d" % i for i in range(40)]
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Sink() as a, Sink() as b:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + a.url,
                    "--post=" + b.url, "--mode=round-robin", "--status-every=10")
        try:
            wait_for(lambda: len(a.requests) + len(b.requests) == len(bodies), timeout=30,
                     what="every message (%s)" % tool.err[-3000:])
        finally:
            assert stop(tool) == 0
    assert len(a.requests) == len(b.requests) == 20
    assert sorted(r.body for r in a.requests + b.requests) == bodies
    assert b"[aggregate]: finished 10 - 99th: " in tool.err
    assert ("[%s]: finished 10 - " % a.url).encode() in tool.err


def test_hostpool_leaves_a_dead_endpoint_and_an_unknown_mode_sends_to_every_one(broker):
    bodies = [b"hp%02d" % i for i in range(30)]
    make_channels(broker, "t", "hp", "all")
    publish(broker, "t", bodies)
    dead = "http://127.0.0.1:%d/" % closed_port()
    with Sink() as live:
        tool = Tool("to-http", "--topic=t", "--channel=hp", "--nsqd-tcp-address=" + broker.tcp_addr,
                    "--post=" + dead, "--post=" + live.url, "-n", "1", *FAST_RETRY)
        try:
            live.wait(lambda reqs: len(reqs) == len(bodies), what="every message at the live endpoint")
            wait_for(drained(broker, "t", "hp"), what="every message FINed")
        finally:
            assert stop(tool) == 0
        assert sorted(r.body for r in live.requests) == bodies
        assert tool.err.count(b"connection refused") + tool.err.count(b"Connection refused") == 1  # marked dead
    with Sink() as a, Sink() as b:
        tool = Tool("to-http", "--topic=t", "--channel=all", "--nsqd-tcp-address=" + broker.tcp_addr,
                    "--post=" + a.url, "--post=" + b.url, "--mode=all")
        try:
            wait_for(lambda: len(a.requests) == len(b.requests) == len(bodies), what="every message at both")
        finally:
            assert stop(tool) == 0
        assert sorted(r.body for r in a.requests) == sorted(r.body for r in b.requests) == bodies


def test_sample_sends_a_fraction_and_fins_the_rest(broker):
    bodies = [b"s%03d" % i for i in range(400)]
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Sink() as sink:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + sink.url,
                    "--sample=0.25")
        try:
            wait_for(drained(broker, "t", "nsq_to_http"), timeout=30, what="every message FINed")
        finally:
            assert stop(tool) == 0
    assert 40 < len(sink.requests) < 160


def test_nsq_to_http_refuses_what_go_refuses():
    base = ["to-http", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1"]
    cases = [
        (base + ["--post=http://h/", "--header=nocolon"], "--header value format should be 'key=value'"),
        (["to-http", "--nsqd-tcp-address=127.0.0.1:1", "--post=http://h/"], "--topic and --channel are required"),
        (base + ["--get=http://h/%s", "--content-type=text/plain"], "--content-type only used with --post"),
        (base, "--get or --post required"),
        (base + ["--get=http://h/%s", "--post=http://h/"], "use --get or --post not both"),
        (base + ["--get=http://h/"], "invalid GET address - must be a printf string"),
        (base + ["--post=http://h/", "--sample=1.5"], "--sample must be between 0.0 and 1.0"),
        (["to-http", "--topic=t", "--post=http://h/"], "--nsqd-tcp-address or --lookupd-http-address required"),
    ]
    for argv, message in cases:
        code, _, err = run(*argv)
        assert code == 1 and message in err, (argv, err)


def test_same_requests_as_gos_nsq_to_http(broker):
    go = go_tool("nsq_to_http")
    if go is None:
        pytest.skip("Go's nsq_to_http is not here")
    bodies = BODIES + [b"plain %d" % i for i in range(20)]
    for topic in ("p", "g"):
        make_channels(broker, topic, "ours", "gos")
        publish(broker, topic, bodies)
    seen = {}
    for who in ("ours", "gos"):
        with Sink() as sink:
            for topic, target in (("p", "--post=%s/p" % sink.url), ("g", "--get=%s/g?v=%%s" % sink.url)):
                args = ["--topic=" + topic, "--channel=" + who, "--nsqd-tcp-address=" + broker.tcp_addr, target,
                        "--header=X-Key: v"] + (["--content-type=application/json"] if topic == "p" else [])
                tool = Tool("to-http", *args) if who == "ours" else Tool(argv=[go] + args)
                try:
                    sink.wait(lambda reqs: sum(r.path.startswith("/" + topic) for r in reqs) == len(bodies),
                              what="%s's requests for %s (%s)" % (who, topic, tool.err[-2000:]))
                finally:
                    assert stop(tool) == 0
            seen[who] = sorted((r.method, r.path, r.body, r.header("Content-Type"), r.header("X-Key"),
                                r.header("User-Agent")) for r in sink.requests)
    assert seen["ours"] == seen["gos"]


def test_a_kept_alive_connection_the_endpoint_closed_is_retried_on_a_new_one(broker):
    """An endpoint that closes each connection after one answer (without saying so): nothing is requeued."""
    bodies = [b"ka%02d" % i for i in range(10)]
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    answers = [then_close(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")] * len(bodies)
    with ScriptedServer(answers) as server:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr,
                    "--post=http://127.0.0.1:%d/k" % server.port, "-n", "1")
        try:
            wait_for(drained(broker, "t", "nsq_to_http"), what="every message FINed (%s)" % tool.err[-2000:])
        finally:
            assert stop(tool) == 0
    assert sorted(r.rpartition(b"\r\n\r\n")[2] for r in server.requests) == bodies
    assert server.connections == len(bodies)
    assert b"Handler returned error" not in tool.err


def basic(credentials):
    return "Basic " + base64.b64encode(credentials).decode()


def test_userinfo_in_the_url_is_sent_as_basic_auth_and_never_logged(broker):
    """``user:password@`` is HTTP basic auth, as Go's net/http makes it; logs and status lines show ``***``."""
    bodies = [b"auth%02d" % i for i in range(30)]
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    dead_port = closed_port()
    with Sink() as live:
        host = live.url[len("http://"):]
        live_url = "http://alice:s3cr%%40t pw@%s/in" % host
        dead_url = "http://bob:hunter2@127.0.0.1:%d/" % dead_port
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + dead_url,
                    "--post=" + live_url, "-n", "1", "--status-every=10", *FAST_RETRY)
        try:
            live.wait(lambda reqs: len(reqs) == len(bodies), what="every message at the live endpoint")
            wait_for(drained(broker, "t", "nsq_to_http"), what="every message FINed")
            tool.wait_output(lambda out, err: b"]: finished 10 - " in err, what="a per-endpoint status line")
        finally:
            assert stop(tool) == 0
    assert sorted(r.body for r in live.requests) == bodies
    # %-escapes decoded, as Go's url.Parse does: the password is "s3cr@t pw"
    assert {r.header("Authorization") for r in live.requests} == {basic(b"alice:s3cr@t pw")}
    assert {r.header("Host") for r in live.requests} == {host}  # the userinfo is not part of Host
    logged = tool.out + tool.err
    assert b"hunter2" not in logged and b"s3cr" not in logged
    assert ("POST http://bob:***@127.0.0.1:%d/" % dead_port).encode() in tool.err  # the failure, redacted
    assert ("[http://alice:***@%s/in]: finished 10 - " % host).encode() in tool.err


def test_get_with_a_user_and_no_password_and_a_header_that_wins(broker):
    make_channels(broker, "t", "a", "b")
    publish(broker, "t", [b"one", b"two"])
    with Sink() as sink:
        url = "http://carol@%s/q?d=%%s" % sink.url[len("http://"):]
        tool = Tool("to-http", "--topic=t", "--channel=a", "--nsqd-tcp-address=" + broker.tcp_addr, "--get=" + url)
        try:
            sink.wait(lambda reqs: len(reqs) == 2, what="both messages")
        finally:
            assert stop(tool) == 0
        assert {r.header("Authorization") for r in sink.requests} == {basic(b"carol:")}
        # A --header Authorization is sent instead, as Go's client only adds one when none is set.
        tool = Tool("to-http", "--topic=t", "--channel=b", "--nsqd-tcp-address=" + broker.tcp_addr, "--get=" + url,
                    "--header=authorization: Bearer tok")
        try:
            sink.wait(lambda reqs: len(reqs) == 4, what="both messages again")
        finally:
            assert stop(tool) == 0
        assert {r.header("Authorization") for r in sink.requests[2:]} == {"Bearer tok"}
    code, _, err = run("to-http", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--post=http://u:p%zz@h/")
    assert code == 1 and "invalid userinfo" in err and "p%zz" not in err


def test_same_basic_auth_as_gos_nsq_to_http(broker):
    go = go_tool("nsq_to_http")
    if go is None:
        pytest.skip("Go's nsq_to_http is not here")
    make_channels(broker, "t", "ours", "gos")
    publish(broker, "t", [b"x"])
    seen = {}
    with Sink() as sink:
        url = "http://us%%3Aer:p%%40ss:w%%2Frd@%s/a" % sink.url[len("http://"):]
        for who in ("ours", "gos"):
            args = ["--topic=t", "--channel=" + who, "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + url]
            tool = Tool("to-http", *args) if who == "ours" else Tool(argv=[go] + args)
            try:
                sink.wait(lambda reqs: len(reqs) == len(seen) + 1, what="%s's request (%s)" % (who, tool.err[-2000:]))
            finally:
                assert stop(tool) == 0
            seen[who] = (sink.requests[-1].header("Authorization"), sink.requests[-1].header("Host"))
    assert seen["ours"] == seen["gos"]
    assert seen["ours"][0] == basic(b"us:er:p@ss:w/rd")
