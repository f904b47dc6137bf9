"""nsq_to_http's publishers: one thread driving ``-n`` requests over non-blocking sockets.

The answer reader (``ResponseReader``) is pure, so its split-reply cases are
fed directly; the rest runs the tool against a real broker and real local
endpoints that hold, trickle, reset or never send their answers.
"""

import os
import signal
import socket
import ssl
import struct
import threading

import pytest

from nsqd_threaded.client import Producer
from nsqd_threaded.tools.http_conn import Closed, ProtocolError, ResponseReader

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


class Endpoint:
    """A raw HTTP endpoint on 127.0.0.1 whose ``respond(number, sock)`` answers request ``number`` (0 on).

    ``respond`` returns False to end the connection.  ``_lock`` (and the
    ``_changed`` condition on it) guards ``requests`` (bodies, in arrival
    order), ``answered`` (the bodies answered 200), ``connections``,
    ``held`` (requests being answered now) and ``peak`` (the most at once).
    """

    def __init__(self, respond, context=None):
        self.respond = respond
        self.context = context
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.requests = []
        self.answered = []
        self.connections = 0
        self.held = 0
        self.peak = 0
        self.closing = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(256)
        self.url = "%s://127.0.0.1:%d" % ("http" if context is None else "https", self.listener.getsockname()[1])
        self._threads = []
        self._acceptor = threading.Thread(target=self._accept, name="endpoint-accept")

    def __enter__(self):
        self._acceptor.start()
        return self

    def __exit__(self, *exc):
        self.closing.set()
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._acceptor.join(10)
        for t in self._threads:
            t.join(10)

    def wait(self, predicate, timeout=30.0, what="requests"):
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self), timeout):
                raise AssertionError("no %s within %ss (requests %d, held %d)"
                                     % (what, timeout, len(self.requests), self.held))

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._changed:
                self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), name="endpoint-conn")
            self._threads.append(t)
            t.start()

    def _serve(self, conn):
        conn.settimeout(30)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                with self._changed:
                    number = len(self.requests)
                    self.requests.append(body)
                    self.held += 1
                    self.peak = max(self.peak, self.held)
                    self._changed.notify_all()
                try:
                    keep = self.respond(number, conn)
                finally:
                    with self._changed:
                        self.held -= 1
                        if keep is not False:
                            self.answered.append(body)
                        self._changed.notify_all()
                if keep is False:
                    return
        except OSError:
            return
        finally:
            conn.close()


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
    with pytest.raises(ProtocolError):
        ResponseReader().feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")


# -- the tool ------------------------------------------------------------------------------------


def tool_threads(tool):
    return len(os.listdir("/proc/%d/task" % tool.proc.pid))


def test_many_slow_endpoints_get_n_requests_at_once_from_a_few_threads(broker):
    """Three endpoints hold every answer until 30 requests wait at once: -n 30 gets there, never past."""
    n = 30
    bodies = [b"slow%03d" % i for i in range(90)]
    gate = threading.Event()
    endpoints = []

    def respond(number, sock):
        if not gate.wait(60):
            return False
        sock.sendall(OK)
        return True

    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Endpoint(respond) as a, Endpoint(respond) as b, Endpoint(respond) as c:
        endpoints[:] = [a, b, c]
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--mode=round-robin",
                    "-n", str(n), *["--post=%s/p" % e.url for e in endpoints])
        try:
            wait_for(lambda: sum(e.held for e in endpoints) == n, timeout=30,
                     what="%d requests held at once (%s)" % (n, tool.err[-2000:]))
            threads = tool_threads(tool)
            started = sum(len(e.requests) for e in endpoints)  # none past the n held
            gate.set()
            wait_for(lambda: sum(len(e.answered) for e in endpoints) == len(bodies), timeout=60,
                     what="every message answered")
            wait_for(lambda: channel_counts(broker, "t", "nsq_to_http") == (0, 0, 0), what="every message FINed")
        finally:
            gate.set()
            assert stop(tool) == 0
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
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Endpoint(respond) as e:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + e.url, "-n", "3")
        try:
            wait_for(lambda: channel_counts(broker, "t", "nsq_to_http") == (0, 0, 0), what="every message FINed")
        finally:
            assert stop(tool) == 0
    assert sorted(e.answered) == bodies and e.connections <= 3
    assert b"Handler returned error" not in tool.err


def test_a_reset_in_the_middle_of_a_reply_is_requeued_and_sent_again(broker):
    def respond(number, sock):
        if number == 0:
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Le")
            reset(sock)
            return False
        sock.sendall(OK)
        return True

    bodies = [b"rs%02d" % i for i in range(5)]
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Endpoint(respond) as e:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + e.url, "-n", "1",
                    *FAST_RETRY)
        try:
            wait_for(lambda: channel_counts(broker, "t", "nsq_to_http") == (0, 0, 0),
                     what="every message FINed (%s)" % tool.err[-2000:])
        finally:
            assert stop(tool) == 0
    assert sorted(e.answered) == bodies  # each answered 200 once
    assert e.requests.count(e.requests[0]) == 2  # the reset one came again, from nsqd
    assert b"Handler returned error" in tool.err


def test_a_reset_before_any_reply_on_a_kept_alive_connection_is_retried_at_once(broker):
    def respond(number, sock):
        if number == 1:
            reset(sock)
            return False
        sock.sendall(OK)
        return True

    bodies = [b"ka%02d" % i for i in range(5)]
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Endpoint(respond) as e:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + e.url, "-n", "1")
        try:
            wait_for(lambda: channel_counts(broker, "t", "nsq_to_http") == (0, 0, 0),
                     what="every message FINed (%s)" % tool.err[-2000:])
        finally:
            assert stop(tool) == 0
    assert sorted(e.answered) == bodies and e.connections == 2
    assert b"Handler returned error" not in tool.err  # nothing was requeued


def test_an_endpoint_that_never_answers_times_out_and_the_message_goes_elsewhere_later(broker):
    def respond(number, sock):
        if number == 0:
            e.closing.wait(60)  # keeps the connection, never answers
            return False
        sock.sendall(OK)
        return True

    bodies = [b"to%02d" % i for i in range(4)]
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Endpoint(respond) as e:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + e.url, "-n", "2",
                    "--http-client-request-timeout=300ms", *FAST_RETRY)
        try:
            wait_for(lambda: channel_counts(broker, "t", "nsq_to_http") == (0, 0, 0),
                     what="every message FINed (%s)" % tool.err[-2000:])
        finally:
            assert stop(tool) == 0
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
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr,
                    "--post=http://127.0.0.1:%d/" % address[1], "-n", "1", "--http-client-connect-timeout=200ms",
                    "--http-client-request-timeout=60s", *FAST_RETRY)
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
        if not gate.wait(60):
            return False
        sock.sendall(OK)
        return True

    bodies = [b"st%02d" % i for i in range(10)]
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Endpoint(respond) as e:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + e.url, "-n", "2")
        try:
            e.wait(lambda e: e.held == 2, what="two requests under way")
            tool.signal(signal.SIGTERM)
            gate.set()
            assert tool.wait() == 0
        finally:
            gate.set()
            tool.close()
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
    make_channels(broker, "t", "nsq_to_http")
    publish(broker, "t", bodies)
    with Endpoint(respond, server_context(certs)) as e:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=%s/in" % e.url,
                    "-n", "4")
        try:
            wait_for(lambda: channel_counts(broker, "t", "nsq_to_http") == (0, 0, 0),
                     what="every message FINed (%s)" % tool.err[-2000:])
        finally:
            assert stop(tool) == 0
    assert sorted(e.answered) == bodies and e.connections <= 4
    assert b"Handler returned error" not in tool.err

    monkeypatch.setenv("SSL_CERT_FILE", certs.other_ca)
    publish(broker, "t", [b"untrusted"])
    with Endpoint(respond, server_context(certs)) as e:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=%s/in" % e.url,
                    "-n", "1", *FAST_RETRY)
        try:
            tool.wait_output(lambda out, err: b"Handler returned error" in err, timeout=30, what="a refused server")
        finally:
            assert stop(tool) == 0
    assert e.requests == [] and b"CERTIFICATE_VERIFY_FAILED" in tool.err.upper().replace(b" ", b"_")


def test_a_stream_of_messages_through_many_connections_is_all_sent_once(broker):
    """Thousands of hand-overs from the reader thread to the driver (a lost wake-up would stall it)."""
    def respond(number, sock):
        sock.sendall(OK)
        return True

    bodies = [b"s%05d" % i for i in range(3000)]
    make_channels(broker, "t", "nsq_to_http")
    with Endpoint(respond) as e:
        tool = Tool("to-http", "--topic=t", "--nsqd-tcp-address=" + broker.tcp_addr, "--post=" + e.url, "-n", "20")
        try:
            for start in range(0, len(bodies), 500):  # in bursts, so that the driver also waits in between
                publish(broker, "t", bodies[start:start + 500])
            wait_for(lambda: channel_counts(broker, "t", "nsq_to_http") == (0, 0, 0), timeout=90,
                     what="every message FINed (%s)" % tool.err[-2000:])
        finally:
            assert stop(tool) == 0
    assert sorted(e.answered) == bodies and e.connections <= 20
