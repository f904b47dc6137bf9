"""nsq_to_http's HTTP/1.1 connection against a real scripted server on 127.0.0.1 (plain and TLS)."""

import socket
import ssl

import pytest

from nsqd_threaded.tools.http_conn import Closed, HTTPConnection, MalformedResponseError

from support.http_sink import CLOSE, ScriptedServer, then_close
from support.transport import certs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(60)

REQUEST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
def connected(server, context=None, timeout=5.0):
    conn = HTTPConnection("127.0.0.1", server.port, context)
    conn.connect(timeout)
    return conn


def test_content_length_bodies_are_skipped_and_the_connection_is_kept():
    script = [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
              b"HTTP/1.1 503 Busy\r\ncontent-length:  3 \r\nX-A: b\r\n\r\nabc",
              b"HTTP/1.1 204 No Content\r\n\r\n"]
    with ScriptedServer(script) as server:
        conn = connected(server)
        assert [conn.exchange(REQUEST, 5.0) for _ in script] == [(200, True), (503, True), (204, True)]
        conn.close()
    assert server.connections == 1 and server.requests == [REQUEST] * 3


def test_chunked_bodies_with_extensions_and_trailers_then_the_next_request():
    chunked = (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n")
    with ScriptedServer([chunked, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]) as server:
        conn = connected(server)
        assert conn.exchange(REQUEST, 5.0) == (201, True)
        assert conn.exchange(REQUEST, 5.0) == (200, True)
        conn.close()
    assert server.connections == 1


def test_an_interim_100_continue_is_skipped():
    with ScriptedServer([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]) as server:
        conn = connected(server)
        assert conn.exchange(REQUEST, 5.0) == (200, True)
        conn.close()


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    then_close(b"HTTP/1.1 200 OK\r\n\r\nthe body runs to the end of the connection"),
], ids=["connection-close", "http-1.0", "no-length"])
def test_answers_that_end_the_connection_say_so(answer):
    with ScriptedServer([answer]) as server:
        conn = connected(server)
        assert conn.exchange(REQUEST, 5.0) == (200, False)
        conn.close()


def test_http_1_0_keep_alive_keeps_it():
    with ScriptedServer([b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"]) as server:
        conn = connected(server)
        assert conn.exchange(REQUEST, 5.0) == (200, True)
        conn.close()


def test_a_kept_connection_the_server_closed_raises_closed():
    with ScriptedServer([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", CLOSE]) as server:
        conn = connected(server)
        assert conn.exchange(REQUEST, 5.0) == (200, True)
        with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
            conn.exchange(REQUEST, 5.0)
        conn.close()


@pytest.mark.parametrize("answer", [
    b"HTTP/2 200 OK\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
])
def test_malformed_answers_are_protocol_errors(answer):
    with ScriptedServer([answer]) as server:
        conn = connected(server)
        with pytest.raises(MalformedResponseError):
            conn.exchange(REQUEST, 5.0)
        conn.close()


def test_a_mid_response_close_is_an_error_not_a_retryable_close():
    with ScriptedServer([then_close(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")]) as server:
        conn = connected(server)
        with pytest.raises(ConnectionError) as info:
            conn.exchange(REQUEST, 5.0)
        assert not isinstance(info.value, Closed)
        conn.close()


def test_a_server_that_never_answers_times_out():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        conn = HTTPConnection("127.0.0.1", listener.getsockname()[1])
        conn.connect(5.0)
        with pytest.raises(socket.timeout):
            conn.exchange(REQUEST, 0.2)
        conn.close()
    finally:
        listener.close()


def test_https_through_the_ssl_context(certs):  # noqa: F811
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(certs.server_cert, certs.server_key)
    with ScriptedServer([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"] * 2, server_context) as server:
        conn = connected(server, certs.client_context())
        assert conn.exchange(REQUEST, 5.0) == (200, True)
        assert conn.exchange(REQUEST, 5.0) == (200, True)
        conn.close()
        with pytest.raises(ssl.SSLError):
            connected(server, certs.client_context(ca=certs.other_ca))
    assert server.requests == [REQUEST] * 2
