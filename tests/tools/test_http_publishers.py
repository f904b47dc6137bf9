"""nsq_to_http's publishers: one thread driving ``-n`` requests over non-blocking sockets.

The answer reader (``ResponseReader``) is pure, so its split-reply cases are
fed directly; the rest runs the tool against a real broker and real local
endpoints that hold, trickle, reset or never send their answers.
"""

import contextlib
import os
import signal
import socket
import ssl
import struct
import threading

import pytest

from nsqd_threaded.client import Producer
from nsqd_threaded.tools.http_conn import Closed, MalformedResponseError, ResponseReader

from support.http_sink import Endpoint
from support.tools import Tool, channel_counts, make_channels
from support.transport import certs  # noqa: F401 (a fixture)
from support.wire import wait_for

pytestmark = pytest.mark.timeout(120)

FAST_RETRY = ["--consumer-opt=default_requeue_delay,50ms", "--consumer-opt=backoff_multiplier,50ms"]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def publish(broker, topic, bodies):
    with Producer(broker.tcp_addr) as producer:
        producer.mpub(topic, bodies)


def stop(tool):
    tool.signal(signal.SIGTERM)
    code = tool.wait()
    tool.close()
    return code


def reset(sock):
    """Close with an RST (SO_LINGER 0) instead of a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# -- the reader, fed as a socket would feed it ------------------------------------------------

ANSWERS = [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", (200, True)),
    (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\nA\r\n0123456789\r\n"
     b"0\r\nTrailer: t\r\n\r\n", (201, True)),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx", (503, False)),
    (b"HTTP/1.0 204 No Content\r\nConnection: keep-alive\r\n\r\n", (204, True)),
]


@pytest.mark.parametrize("answer,expected", ANSWERS, ids=["length", "chunked", "interim", "no-body"])
def test_a_reply_split_at_any_byte_reads_the_same(answer, expected):
    for cut in range(1, len(answer)):
        reader = ResponseReader()
        assert reader.feed(answer[:cut]) is None, cut
        assert reader.feed(answer[cut:]) == expected, cut
    reader = ResponseReader()
    results = [reader.feed(answer[i:i + 1]) for i in range(len(answer))]
    assert results[-1] == expected and not any(results[:-1])


def test_two_replies_in_one_read_and_a_body_to_the_end_of_the_connection():
    reader = ResponseReader()
    assert reader.feed(ANSWERS[0][0] + ANSWERS[1][0][:30]) == (200, True)
    reader.start()
    assert reader.advance() is None
    assert reader.feed(ANSWERS[1][0][30:]) == (201, True)
    reader.start()
    assert reader.feed(b"HTTP/1.1 200 OK\r\n\r\nruns until") is None
    assert reader.feed(b" the close") is None
    assert reader.feed(b"") == (200, False)


def test_the_end_of_the_connection_before_and_within_a_reply():
    with pytest.raises(Closed):
        ResponseReader().feed(b"")
    reader = ResponseReader()
    reader.feed(b"HTTP/1.1 200 OK\r\nContent-Le")
    with pytest.raises(ConnectionError) as info:
        reader.feed(b"")
    assert not isinstance(info.value, Closed)
    with pytest.raises(MalformedResponseError):
        ResponseReader().feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")


# -- the tool ------------------------------------------------------------------------------------


def tool_threads(tool):
    return len(os.listdir("/proc/%d/task" % tool.proc.pid))


def start_tool(broker, urls, *args):
    """nsq_to_http from topic t's channel nsq_to_http on ``broker``, posting to ``urls``, with ``args``."""
    return Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, *["--post=" + u for u in urls],
                *args)


@contextlib.contextmanager
def to_http(broker, respond, *args, bodies=(), endpoints=1, context=None, path="", gate=None):
    """Topic t gets ``bodies``; nsq_to_http (``args``) posts them to ``endpoints`` fresh ``Endpoint(respond)``.

    The channel exists before the bodies are published.  Yields ``(tool,
    [endpoint, ...])``; on the way out sets ``gate`` (so that held answers
    go), stops the tool with SIGTERM and asserts it exits 0, then shuts the
    endpoints.
    """
    make_channels(broker, "t", "nsq_to_http")
    if bodies:
        publish(broker, "t", bodies)
    with contextlib.ExitStack() as stack:
        es = [stack.enter_context(Endpoint(respond, context)) for _ in range(endpoints)]
        tool = start_tool(broker, [e.url + path for e in es], *args)
        try:
            yield tool, es
        finally:
            if gate is not None:
                gate.set()
            assert stop(tool) == 0


def wait_all_fined(broker, tool, timeout=30):
    wait_for(lambda: channel_counts(broker, "t", "nsq_to_http") == (0, 0, 0), timeout=timeout,
             what="every message FINed (%s)" % tool.err[-2000:])


def answer_ok(number, sock):
    sock.sendall(OK)
    return True


def test_many_slow_endpoints_get_n_requests_at_once_from_a_few_threads(broker):
    """Three endpoints hold every answer until 30 requests wait at once: -n 30 gets there, never past."""
    n = 30
    bodies = [b"slow%03d" % i for i in range(90)]
    gate = threading.Event()

    def respond(number, sock):
        return gate.wait(60) and answer_ok(number, sock)

    with to_http(broker, respond, "--mode=round-robin", "-n", str(n), bodies=bodies, endpoints=3,
                 path="/p", gate=gate) as (tool, endpoints):
        wait_for(lambda: sum(e.held for e in endpoints) == n, timeout=30,
                 what="%d requests held at once (%s)" % (n, tool.err[-2000:]))
        threads = tool_threads(tool)
        started = sum(len(e.requests) for e in endpoints)  # none past the n held
        gate.set()
        wait_for(lambda: sum(len(e.answered) for e in endpoints) == len(bodies), timeout=60,
                 what="every message answered")
        wait_all_fined(broker, tool)
    assert sorted(sum((e.answered for e in endpoints), [])) == bodies
    assert started == n
    assert all(e.connections <= n for e in endpoints)
    # the main thread, the consumer's reader and lookup threads, the publishers' driver: not one per request
    assert threads < 10, threads
    assert b"Handler returned error" not in tool.err


def test_a_reply_trickled_a_few_bytes_at_a_time(broker):
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n")

    def respond(number, sock):
        for i in range(0, len(chunked), 3):
            sock.sendall(chunked[i:i + 3])  # each its own segment (TCP_NODELAY)
        return True

    bodies = [b"tr%02d" % i for i in range(10)]
    with to_http(broker, respond, "-n", "3", bodies=bodies) as (tool, [e]):
        wait_all_fined(broker, tool)
    assert sorted(e.answered) == bodies and e.connections <= 3
    assert b"Handler returned error" not in tool.err


def test_a_reset_in_the_middle_of_a_reply_is_requeued_and_sent_again(broker):
    def respond(number, sock):
        if number == 0:
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Le")
            reset(sock)
            return False
        return answer_ok(number, sock)

    bodies = [b"rs%02d" % i for i in range(5)]
    with to_http(broker, respond, "-n", "1", *FAST_RETRY, bodies=bodies) as (tool, [e]):
        wait_all_fined(broker, tool)
    assert sorted(e.answered) == bodies  # each answered 200 once
    assert e.bodies.count(e.bodies[0]) == 2  # the reset one came again, from nsqd
    assert b"Handler returned error" in tool.err


def test_a_reset_before_any_reply_on_a_kept_alive_connection_is_retried_at_once(broker):
    def respond(number, sock):
        if number == 1:
            reset(sock)
            return False
        return answer_ok(number, sock)

    bodies = [b"ka%02d" % i for i in range(5)]
    with to_http(broker, respond, "-n", "1", bodies=bodies) as (tool, [e]):
        wait_all_fined(broker, tool)
    assert sorted(e.answered) == bodies and e.connections == 2
    assert b"Handler returned error" not in tool.err  # nothing was requeued


def test_an_endpoint_that_never_answers_times_out_and_the_message_goes_elsewhere_later(broker):
    released = threading.Event()  # set as the test ends

    def respond(number, sock):
        if number == 0:
            released.wait(60)  # keeps the connection, never answers
            return False
        return answer_ok(number, sock)

    bodies = [b"to%02d" % i for i in range(4)]
    with to_http(broker, respond, "-n", "2", "--http-client-request-timeout=300ms", *FAST_RETRY,
                 bodies=bodies, gate=released) as (tool, [e]):
        wait_all_fined(broker, tool)
    assert sorted(e.answered) == bodies
    assert b"timed out" in tool.err and b"Handler returned error" in tool.err


def test_a_connect_that_does_not_complete_times_out(broker):
    """A listener whose accept queue is full drops the SYN: the connect hangs until the connect timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    try:
        for _ in range(4):  # fill the accept queue (never accepted)
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(address)
            fillers.append(s)
        make_channels(broker, "t", "nsq_to_http")
        publish(broker, "t", [b"never"])
        tool = start_tool(broker, ["http://127.0.0.1:%d/" % address[1]], "-n", "1",
                          "--http-client-connect-timeout=200ms", "--http-client-request-timeout=60s", *FAST_RETRY)
        try:
            tool.wait_output(lambda out, err: b"Handler returned error" in err, timeout=30, what="a failed request")
        finally:
            assert stop(tool) == 0
        assert b"timed out" in tool.err, tool.err[-2000:]
        depth, in_flight, deferred = channel_counts(broker, "t", "nsq_to_http")
        assert depth + deferred == 1 and in_flight == 0
    finally:
        for s in fillers:
            s.close()
        listener.close()


def test_sigterm_finishes_the_requests_under_way_and_requeues_the_rest(broker):
    gate = threading.Event()

    def respond(number, sock):
        return gate.wait(60) and answer_ok(number, sock)

    bodies = [b"st%02d" % i for i in range(10)]
    with to_http(broker, respond, "-n", "2", bodies=bodies, gate=gate) as (tool, [e]):
        e.wait(lambda e: e.held == 2, what="two requests under way")
        tool.signal(signal.SIGTERM)
        gate.set()
        assert tool.wait() == 0
    depth, in_flight, deferred = channel_counts(broker, "t", "nsq_to_http")
    assert in_flight == 0 and len(e.answered) >= 2
    assert depth + deferred + len(e.answered) == len(bodies)  # each sent and FINed, or back in the queue
    assert len(set(e.answered)) == len(e.answered)
    assert b"Handler returned error" not in tool.err


def server_context(certs):  # noqa: F811
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    return context


def test_https_endpoints_through_non_blocking_tls(broker, certs, monkeypatch):  # noqa: F811
    """TLS handshakes and trickled answers in the event loop; a server of an unknown CA is refused."""
    def respond(number, sock):
        for i in range(0, len(OK), 5):
            sock.sendall(OK[i:i + 5])
        return True

    monkeypatch.setenv("SSL_CERT_FILE", certs.ca)  # the tool's default context trusts the test CA
    bodies = [b"tls%02d" % i for i in range(20)]
    with to_http(broker, respond, "-n", "4", bodies=bodies, context=server_context(certs),
                 path="/in") as (tool, [e]):
        wait_all_fined(broker, tool)
    assert sorted(e.answered) == bodies and e.connections <= 4
    assert b"Handler returned error" not in tool.err

    monkeypatch.setenv("SSL_CERT_FILE", certs.other_ca)
    with to_http(broker, respond, "-n", "1", *FAST_RETRY, bodies=[b"untrusted"], context=server_context(certs),
                 path="/in") as (tool, [e]):
        tool.wait_output(lambda out, err: b"Handler returned error" in err, timeout=30, what="a refused server")
    assert e.requests == [] and b"CERTIFICATE_VERIFY_FAILED" in tool.err.upper().replace(b" ", b"_")


def test_a_stream_of_messages_through_many_connections_is_all_sent_once(broker):
    """Thousands of hand-overs from the reader thread to the driver (a lost wake-up would stall it)."""
    bodies = [b"s%05d" % i for i in range(3000)]
    with to_http(broker, answer_ok, "-n", "20") as (tool, [e]):
        for start in range(0, len(bodies), 500):  # in bursts, so that the driver also waits in between
            publish(broker, "t", bodies[start:start + 500])
        wait_all_fined(broker, tool, timeout=90)
    assert sorted(e.answered) == bodies and e.connections <= 20


def test_a_kept_alive_connection_left_unused_is_closed_after_the_idle_timeout(broker):
    """Go's transport closes a connection idle for 90 s; ours too (here made 0.3 s), and a later message
    opens a new one."""
    from nsqd_threaded.tools import nsq_to_http

    make_channels(broker, "t", "nsq_to_http")
    with Endpoint(answer_ok) as e:
        _, params = nsq_to_http.main.parse(["--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr,
                                            "--post=" + e.url, "-n", "1"])
        options, _ = nsq_to_http.main.resolve(params)
        app = nsq_to_http.ToHTTP(options).start()
        try:
            app.publishers.idle_timeout = 0.3  # before any connection turns idle
            publish(broker, "t", [b"first"])
            e.wait(lambda s: s.answered == [b"first"], what="the first answer")
            assert e.connections == 1
            e.wait(lambda s: s.closed == 1, timeout=10, what="the idle connection closed")
            publish(broker, "t", [b"second"])
            e.wait(lambda s: s.answered == [b"first", b"second"], what="the second answer")
            assert e.connections == 2
        finally:
            app.stop()
