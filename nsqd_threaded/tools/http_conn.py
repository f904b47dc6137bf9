"""A kept-alive HTTP/1.1 client connection on a raw socket, for nsq_to_http's per-message requests.

nsq_to_http makes one request per message, from many handler threads at
once.  ``http.client`` costs several times the request itself (its header
handling and its response parser, which goes through ``email.parser``), and
with a hundred threads that Python work is what they queue for the GIL on.
:class:`HTTPConnection` does only what the tool needs: it writes a request
head and body in one ``sendall``, reads the status line and the headers as
bytes, and skips the body (``Content-Length``, chunked, or until close) so
that the connection can carry the next request.

Reading is apart from the socket (as h11 does it): :class:`ResponseReader`
is a pure state machine fed the bytes received, and :func:`parse_head` a
pure function of a response head.  The blocking :class:`HTTPConnection`
feeds it from ``recv``; nsq_to_http's event loop (:mod:`.http_publishers`)
feeds it from non-blocking sockets.

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


class MalformedResponseError(ValueError):
    """The server's answer is not HTTP/1.x as this client reads it."""


class Closed(ConnectionError):
    """The server closed the connection before the response's first byte (a kept-alive one may be retried)."""


# ResponseReader's states
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


def parse_head(head):
    """``(status, keep_alive, content_length or None, chunked)`` of a status line and headers (no blank line).

    Pure: MalformedResponseError for what is not HTTP/1.x as this client reads it.
    """
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit() or rest[3:4] not in (b"", b" "):
        raise MalformedResponseError("malformed status line %r" % lines[0][:100])
    status = int(code)
    keep_alive = version != b"HTTP/1.0"
    length = None
    chunked = False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            raise MalformedResponseError("malformed header line %r" % line[:100])
        name = name.lower()
        if name == b"content-length":
            value = value.strip()
            if not value.isdigit() or (length is not None and int(value) != length):
                raise MalformedResponseError("bad Content-Length %r" % value[:100])
            length = int(value)
        elif name == b"transfer-encoding":
            # Go's rule: chunked is the only encoding it knows (and then Content-Length is ignored)
            if value.strip().lower() != b"chunked":
                raise MalformedResponseError("unsupported Transfer-Encoding %r" % value[:100])
            chunked = True
        elif name == b"connection":
            tokens = [t.strip() for t in value.lower().split(b",")]
            if b"close" in tokens:
                keep_alive = False
            elif b"keep-alive" in tokens:
                keep_alive = True
    return status, keep_alive, length, chunked


class ResponseReader:
    """The answers of one connection, read from the bytes fed to it: no socket, no clock.

    Call :meth:`start` before each response, then :meth:`feed` each block
    received (``b""`` at the end of the connection) until it returns
    ``(status, keep_alive)``; None means more bytes are needed.  Bytes past
    the end of a response stay buffered for the next.  Raises
    :class:`MalformedResponseError` for a malformed answer, :class:`Closed` when the
    connection ended before the response's first byte and ConnectionError when
    it ended in the middle.  Interim answers (1xx but 101) are skipped; the
    body is dropped.
    """

    __slots__ = ("_buf", "_pos", "_state", "_left", "_status", "_keep_alive", "_first")

    def __init__(self):
        self._buf = b""  # received and not yet consumed, from _pos on
        self._pos = 0
        self.start()

    def start(self):
        """Expect the next response."""
        self._state = _HEAD
        self._left = 0
        self._status = self._keep_alive = None
        self._first = self._pos >= len(self._buf)  # nothing of it received yet: an EOF now is Closed

    def feed(self, data):
        """Take ``data`` (``b""``: the server closed): ``(status, keep_alive)`` once complete, else None."""
        if not data:
            return self._eof()
        if self._state == _UNTIL_CLOSE:
            return None  # the body runs to the end of the connection: dropped
        if self._pos:
            self._buf = self._buf[self._pos:] + data
            self._pos = 0
        else:
            self._buf += data
        self._first = False
        return self.advance()

    def _eof(self):
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            return self._status, False
        if self._first:
            raise Closed("server closed the connection")
        raise ConnectionError("server closed the connection mid-response")

    def advance(self):
        """Go as far as the buffered bytes allow: ``(status, keep_alive)`` once complete, else None."""
        buf = self._buf
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n", self._pos)
                if end < 0:
                    if len(buf) - self._pos > MAX_HEADER_BYTES:
                        raise MalformedResponseError("response headers larger than %d bytes" % MAX_HEADER_BYTES)
                    return None
                status, keep_alive, length, chunked = parse_head(buf[self._pos:end])
                self._pos = end + 4
                if 100 <= status < 200 and status != 101:
                    continue  # an interim answer (100 Continue, 103 Early Hints): the real one follows
                if status == 101:
                    raise MalformedResponseError("unexpected 101 Switching Protocols")
                self._status, self._keep_alive = status, keep_alive
                if status in (204, 304):
                    return self._done()  # never a body
                if chunked:
                    self._state = _CHUNK_SIZE
                elif length is not None:
                    self._state, self._left = _LENGTH, length
                else:
                    self._state = _UNTIL_CLOSE
                    self._buf, self._pos = b"", 0
                    return None
            elif state == _LENGTH or state == _CHUNK_DATA:
                have = len(buf) - self._pos
                if have < self._left:
                    self._left -= have
                    self._buf, self._pos = b"", 0
                    return None
                self._pos += self._left
                self._left = 0
                if state == _LENGTH:
                    return self._done()
                self._state = _CHUNK_END
            else:
                line = self._line()
                if line is None:
                    return None
                if state == _CHUNK_SIZE:
                    size = line.partition(b";")[0].strip()
                    if not size or size.strip(HEX_DIGITS) or len(size) > 16:  # int(, 16) alone takes 0x, _, signs
                        raise MalformedResponseError("bad chunk size %r" % size[:100])
                    n = int(size, 16)
                    if n == 0:
                        self._state = _TRAILERS
                    else:
                        self._state, self._left = _CHUNK_DATA, n
                elif state == _CHUNK_END:
                    if line:
                        raise MalformedResponseError("chunk data not followed by CRLF")
                    self._state = _CHUNK_SIZE
                elif not line:  # _TRAILERS: up to the blank line
                    return self._done()
            buf = self._buf

    def _line(self):
        """The next CRLF-terminated line (without it), or None until it is all here."""
        end = self._buf.find(b"\r\n", self._pos)
        if end < 0:
            if len(self._buf) - self._pos > MAX_LINE:
                raise MalformedResponseError("line longer than %d bytes in a chunked body" % MAX_LINE)
            return None
        line = self._buf[self._pos:end]
        self._pos = end + 2
        return line

    def _done(self):
        self._state = _DONE
        return self._status, self._keep_alive


class HTTPConnection:
    """One connection to ``host``:``port`` (TLS with ``ssl_context``); requests are made one at a time.

    Blocking, and not thread-safe (one user at a time).  After an error the
    connection must be closed (:meth:`exchange` leaves it in an unknown state).
    """

    __slots__ = ("host", "port", "ssl_context", "sock", "_reader", "_timeout")

    def __init__(self, host, port, ssl_context=None):
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.sock = None
        self._reader = None
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
        self._reader = ResponseReader()
        self._timeout = False

    def close(self):
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def exchange(self, request, timeout):
        """Send ``request`` (the whole request, bytes), read the answer: ``(status, keep_alive)``.

        ``timeout`` bounds every send and recv.  Raises OSError (:class:`Closed`
        when the server closed the connection before answering at all,
        ``socket.timeout`` on a timeout) or :class:`MalformedResponseError`.  With
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
            sock.sendall(request)
            reader = self._reader
            reader.start()
            answer = reader.advance()
            while answer is None:
                answer = reader.feed(sock.recv(RECV_SIZE))
            return answer
        except BlockingIOError:  # SO_RCVTIMEO/SO_SNDTIMEO ran out
            raise socket.timeout("timed out") from None
