"""A kept-alive HTTP/1.1 client connection on a raw socket, for nsq_to_http's per-message requests.

nsq_to_http makes one request per message, from many handler threads at
once.  ``http.client`` costs several times the request itself (its header
handling and its response parser, which goes through ``email.parser``), and
with a hundred threads that Python work is what they queue for the GIL on.
:class:`HTTPConnection` does only what the tool needs: it writes a request
head and body in one ``sendall``, reads the status line and the headers as
bytes, and skips the body (``Content-Length``, chunked, or until close) so
that the connection can carry the next request.

The response body is never kept: nsq_to_http only looks at the status, as
Go's tool does (it reads the body to the end and drops it).
"""

import socket

from ..internal.dial import kernel_timeouts

# Bounds on what a server may send before its body: no buffer grows without limit.
MAX_HEADER_BYTES = 1 << 20
MAX_LINE = 65536  # a chunk-size line or a trailer line
RECV_SIZE = 65536
HEX_DIGITS = b"0123456789abcdefABCDEF"


class ProtocolError(ValueError):
    """The server's answer is not HTTP/1.x as this client reads it."""


class Closed(ConnectionError):
    """The server closed the connection before the response's first byte (a kept-alive one may be retried)."""


class HTTPConnection:
    """One connection to ``host``:``port`` (TLS with ``ssl_context``); requests are made one at a time.

    Not thread-safe: nsq_to_http gives each handler thread its own.  After an
    error the connection must be closed (:meth:`exchange` leaves it in an
    unknown state).
    """

    __slots__ = ("host", "port", "ssl_context", "sock", "_buf", "_pos", "_timeout")

    def __init__(self, host, port, ssl_context=None):
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.sock = None
        self._buf = b""  # received and not yet consumed, from _pos on
        self._pos = 0
        self._timeout = False  # the timeout set on sock (False: none set yet)

    def connect(self, timeout):
        """Connect (and the TLS handshake) within ``timeout`` seconds each; OSError if it fails."""
        sock = socket.create_connection((self.host, self.port), timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._buf, self._pos = b"", 0
        self._timeout = False

    def close(self):
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def exchange(self, request, timeout):
        """Send ``request`` (the whole request, bytes), read the answer: ``(status, keep_alive)``.

        ``timeout`` bounds every send and recv.  Raises OSError (:class:`Closed`
        when the server closed the connection before answering at all,
        ``socket.timeout`` on a timeout) or :class:`ProtocolError`.  With
        ``keep_alive`` False the caller closes the connection.
        """
        sock = self.sock
        if timeout != self._timeout:  # (the same for every request of a connection: set once)
            if self.ssl_context is None:
                # the kernel bounds each recv and send: no poll() before each, as a socket timeout makes
                kernel_timeouts(sock, timeout)
            else:
                sock.settimeout(timeout)
            self._timeout = timeout
        try:
            return self._exchange(sock, request)
        except BlockingIOError:  # SO_RCVTIMEO/SO_SNDTIMEO ran out
            raise socket.timeout("timed out") from None

    def _exchange(self, sock, request):
        sock.sendall(request)
        head_end = self._read_head()
        while True:
            status, keep_alive, length, chunked = self._parse_head(head_end)
            if 100 <= status < 200 and status != 101:
                head_end = self._read_head()  # an interim answer (100 Continue, 103 Early Hints): the real one follows
                continue
            break
        if status == 101:
            raise ProtocolError("unexpected 101 Switching Protocols")
        if status in (204, 304):
            pass  # never a body
        elif chunked:
            self._skip_chunked()
        elif length is not None:
            self._skip(length)
        else:
            self._drain()  # the body runs to the end of the connection
            keep_alive = False
        return status, keep_alive

    # -- reading -------------------------------------------------------------------

    def _more(self, first=False):
        """Append one recv to the buffer (dropping what was consumed); Closed/ConnectionError at EOF."""
        data = self.sock.recv(RECV_SIZE)
        if not data:
            if first:
                raise Closed("server closed the connection")
            raise ConnectionError("server closed the connection mid-response")
        if self._pos:
            self._buf = self._buf[self._pos:] + data
            self._pos = 0
        else:
            self._buf += data

    def _read_head(self):
        """Read until the end of a status line and headers; the index just past their blank line."""
        first = self._pos >= len(self._buf)
        while True:
            end = self._buf.find(b"\r\n\r\n", self._pos)
            if end >= 0:
                return end + 4
            if len(self._buf) - self._pos > MAX_HEADER_BYTES:
                raise ProtocolError("response headers larger than %d bytes" % MAX_HEADER_BYTES)
            self._more(first)
            first = False

    def _parse_head(self, head_end):
        """``(status, keep_alive, content_length or None, chunked)`` of the head ending at ``head_end``."""
        lines = self._buf[self._pos:head_end - 4].split(b"\r\n")
        self._pos = head_end
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit() or rest[3:4] not in (b"", b" "):
            raise ProtocolError("malformed status line %r" % lines[0][:100])
        status = int(code)
        keep_alive = version != b"HTTP/1.0"
        length = None
        chunked = False
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise ProtocolError("malformed header line %r" % line[:100])
            name = name.lower()
            if name == b"content-length":
                value = value.strip()
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise ProtocolError("bad Content-Length %r" % value[:100])
                length = int(value)
            elif name == b"transfer-encoding":
                # Go's rule: chunked is the only encoding it knows (and then Content-Length is ignored)
                if value.strip().lower() != b"chunked":
                    raise ProtocolError("unsupported Transfer-Encoding %r" % value[:100])
                chunked = True
            elif name == b"connection":
                tokens = [t.strip() for t in value.lower().split(b",")]
                if b"close" in tokens:
                    keep_alive = False
                elif b"keep-alive" in tokens:
                    keep_alive = True
        return status, keep_alive, length, chunked

    def _skip(self, n):
        """Consume ``n`` body bytes."""
        while True:
            have = len(self._buf) - self._pos
            if have >= n:
                self._pos += n
                return
            n -= have
            self._buf, self._pos = b"", 0
            self._more()

    def _line(self):
        """The next CRLF-terminated line (without it)."""
        while True:
            end = self._buf.find(b"\r\n", self._pos)
            if end >= 0:
                line = self._buf[self._pos:end]
                self._pos = end + 2
                return line
            if len(self._buf) - self._pos > MAX_LINE:
                raise ProtocolError("line longer than %d bytes in a chunked body" % MAX_LINE)
            self._more()

    def _skip_chunked(self):
        while True:
            size = self._line().partition(b";")[0].strip()
            if not size or size.strip(HEX_DIGITS) or len(size) > 16:  # int(, 16) alone takes 0x, _ and signs
                raise ProtocolError("bad chunk size %r" % size[:100])
            n = int(size, 16)
            if n == 0:
                while self._line():  # trailers, up to the blank line
                    pass
                return
            self._skip(n)
            if self._line():
                raise ProtocolError("chunk data not followed by CRLF")

    def _drain(self):
        self._buf, self._pos = b"", 0
        while self.sock.recv(RECV_SIZE):
            pass
