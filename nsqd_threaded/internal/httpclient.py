"""The one small HTTP client: a request whose whole exchange ends by a deadline.

Go nsqd's components share one HTTP client (``internal/http_api``) with a
connect timeout and a request timeout; here :func:`request` plays that part for
every caller: nsqd's auth queries, nsqd's channel queries to nsqlookupd, the
client's nsqlookupd queries and the test helpers.  The deadline bounds the
exchange as a whole: a server that trickles its answer cannot hold the caller
longer than that, as a per-operation socket timeout alone would let it.
"""

import http.client
import io
import json
import socket
import ssl
import time

from .dial import dial
from .gocompat import is_socket_path

# The Accept header of nsqd's and nsqlookupd's V1 HTTP API (unwrapped JSON answers).
NSQ_V1_ACCEPT = "application/vnd.nsq; version=1.0"


def client_ssl_context(root_ca_file="", cert_file="", key_file="", insecure_skip_verify=False):
    """A TLS client context as Go's ``tls.Config`` for these settings is (raises OSError/ssl.SSLError).

    The server's certificate is checked against ``root_ca_file`` (the system's
    roots without one), host name included, unless ``insecure_skip_verify``;
    ``cert_file``/``key_file`` are the client's own certificate.
    """
    context = ssl.create_default_context(cafile=root_ca_file or None)
    if insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


def https_port(body):
    """The ``https_port`` of a broker's 403 ``TLS_REQUIRED`` answer, or 0 (any other 403)."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return 0
    port = doc.get("https_port") if isinstance(doc, dict) else None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return 0
    return port


class ResponseTooLarge(ValueError):
    """The response body is longer than the caller's ``max_size``."""


def request(method, host, port, path, body=None, headers=None, connect_timeout=None, deadline=None,
            ssl_context=None, max_size=None):
    """One HTTP/1.1 exchange: ``(status, reason, body)``.

    ``connect_timeout`` bounds the connection (None: no bound); ``deadline``
    (a ``time.monotonic()`` value, None for none) bounds the whole exchange,
    connection included.  ``ssl_context`` makes it HTTPS.  Raises OSError
    (``socket.timeout`` at the deadline), ``http.client.HTTPException``, or
    :class:`ResponseTooLarge`.  A ``host`` that is a unix socket path (``port``
    ignored) is dialed as one, plain HTTP only.
    """
    if deadline is not None:
        remaining = _remaining(deadline)
        connect_timeout = remaining if connect_timeout is None else min(connect_timeout, remaining)
    if is_socket_path(host):
        conn = UnixHTTPConnection(host, timeout=connect_timeout)
    elif ssl_context is not None:
        conn = http.client.HTTPSConnection(host, port, timeout=connect_timeout, context=ssl_context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=connect_timeout)
    sock = None
    try:
        conn.connect()
        sock = conn.sock
        conn.sock = _DeadlineSocket(sock, deadline)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        chunks = []
        size = 0
        while True:
            chunk = resp.read(65536)
            if not chunk:
                break
            size += len(chunk)
            if max_size is not None and size > max_size:
                raise ResponseTooLarge("response larger than %d bytes" % max_size)
            chunks.append(chunk)
        return resp.status, resp.reason, b"".join(chunks)
    finally:
        conn.close()
        if sock is not None:
            sock.close()


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection over a unix socket; requests carry ``Host: localhost``."""

    def __init__(self, path, timeout=None):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        self.sock = dial(self.socket_path, self.timeout)


def _remaining(deadline):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise socket.timeout("timed out")
    return remaining


class _DeadlineSocket:
    """A connected socket whose every send and recv ends by one deadline (None: no deadline)."""

    def __init__(self, sock, deadline):
        self._sock = sock
        self._deadline = deadline

    def _arm(self):
        if self._deadline is not None:
            self._sock.settimeout(_remaining(self._deadline))
        else:
            self._sock.settimeout(None)

    def sendall(self, data):
        self._arm()
        return self._sock.sendall(data)

    def recv_into(self, buf):
        self._arm()
        return self._sock.recv_into(buf)

    def makefile(self, mode="rb", buffering=None):
        return io.BufferedReader(_SocketReader(self))

    def close(self):
        """http.client closes its connection while the response may still be read: request() closes the socket."""


class _SocketReader(io.RawIOBase):
    """The raw stream http.client reads a response from, over a :class:`_DeadlineSocket`."""

    def __init__(self, sock):
        self._sock = sock

    def readable(self):
        return True

    def readinto(self, buf):
        return self._sock.recv_into(buf)
