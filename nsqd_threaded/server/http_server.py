"""The HTTP edge both daemons share: request framing, deadlines, nsqd-format errors, the router.

nsqd's API (:mod:`.http_api`) and nsqlookupd's (:mod:`nsqd_threaded.lookupd.http`)
are route tables on :class:`Router`; :class:`HTTPServer` serves one with
HTTP/1.1 keep-alive, one thread per connection.  Handlers return a
:class:`Response`; the request handler class only moves bytes.  Query parsing
(Go's ``url.ParseQuery`` rules), the V1 response conventions and body framing
(Go's net/http rules) are plain functions; :class:`RequestBody` is the one
place a body is read, under the request's deadline and the route's limit.
"""

import http
import http.server
import io
import posixpath
import re
import socket
import time
import traceback
import urllib.parse

from ..internal import gocompat
from .listener import Listener
from .park import new_connection_park


X_NSQ = ("X-NSQ-Content-Type", "nsq; version=1.0")
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"


class Response:
    __slots__ = ("status", "body", "headers")

    def __init__(self, status, body=b"", headers=()):
        self.status = status
        self.body = body
        self.headers = list(headers)


def ok_text(text):
    """A V1 string result: 200, raw text (Go sniffs text/plain; an empty body is not sniffed)."""
    body = text if isinstance(text, bytes) else text.encode()
    return Response(200, body, [("Content-Type", TEXT_TYPE), X_NSQ] if body else [X_NSQ])


def ok_empty():
    return Response(200, b"", [X_NSQ])


def ok_json(doc, raw=None):
    body = (raw if raw is not None else gocompat.go_json(doc)).encode()
    return Response(200, body, [("Content-Type", JSON_TYPE), X_NSQ])


class HTTPError(Exception):
    """A V1 error: ``{"message":"TEXT"}`` with a status code."""

    def __init__(self, status, message, headers=()):
        super().__init__(status, message)
        self.status = status
        self.message = message
        self.headers = list(headers)

    def response(self):
        body = ('{"message":"%s"}' % self.message).encode()
        return Response(self.status, body, [("Content-Type", JSON_TYPE), X_NSQ] + self.headers)


# -- query parsing (Go url.ParseQuery) --------------------------------------


class QueryError(ValueError):
    pass


def _unescape(s):
    if "%" in s:
        i = s.find("%")
        while i >= 0:
            h = s[i + 1 : i + 3]
            if len(h) != 2 or any(c not in "0123456789abcdefABCDEF" for c in h):
                raise QueryError("invalid URL escape %r" % s[i : i + 3])
            i = s.find("%", i + 3)
    return urllib.parse.unquote_to_bytes(s.replace("+", " ")).decode("utf-8", "surrogateescape")


def parse_query(qs):
    """Go's url.ParseQuery: first value wins; ``;`` or a bad escape fails the whole parse."""
    out = {}
    if not qs:
        return out
    for part in qs.split("&"):
        if not part:
            continue
        if ";" in part:
            raise QueryError("invalid semicolon separator in query")
        key, _, value = part.partition("=")
        key = _unescape(key)
        value = _unescape(value)
        out.setdefault(key, value)
    return out


def parse_bool(value, default):
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    return default



# -- cross-site requests ------------------------------------------------------------
#
# A page on another origin can make the operator's browser send a form POST
# (or, with a preflight we never grant, anything else) to a daemon it can
# reach.  Browsers say where such a request comes from in ``Origin``; a
# state-changing request whose Origin is not the daemon's own is refused.
# Requests without Origin (curl, client libraries, nsqadmin's server-side
# calls) are not browsers' cross-site requests and pass as before.

STATE_CHANGING = frozenset(("POST", "PUT", "DELETE", "PATCH"))
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url):
    """``(scheme, host, port)`` of an origin or a URL (a Referer), lower-cased; None when it has none.

    ``null`` (a sandboxed or local page's opaque origin) has none, and so is
    never anybody's same origin.
    """
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


def _first(value):
    return value.split(",")[0].strip()


def own_origins(request):
    """The origins a request to us may legitimately come from.

    Ours as the browser reached us (this listener's scheme, the ``Host``
    header), and, behind a reverse proxy, the one it names in
    ``X-Forwarded-Proto``/``X-Scheme`` and ``X-Forwarded-Host``: a cross-site
    form cannot set those headers (a script needs a preflight for them).
    """
    scheme = "https" if request.tls else "http"
    host = request.header("Host")
    proxy_scheme = _first(request.header("X-Forwarded-Proto") or request.header("X-Scheme")) or scheme
    proxy_host = _first(request.header("X-Forwarded-Host")) or host
    out = set()
    for s, h in ((scheme, host), (proxy_scheme, host), (proxy_scheme, proxy_host)):
        if h:
            origin = origin_of("%s://%s" % (s.lower(), h))
            if origin is not None:
                out.add(origin)
    return out


def is_cross_origin(request, referer=False):
    """True when a browser says this request comes from a page of another origin.

    ``Origin`` decides; with ``referer``, a request without Origin is judged
    by its ``Referer`` instead.  A request naming neither is not a browser's
    cross-site request.
    """
    source = request.header("Origin")
    if not source and referer:
        source = request.header("Referer")
    if not source:
        return False
    origin = origin_of(source)
    return origin is None or origin not in own_origins(request)


# -- the router (julienschmidt/httprouter as nsqd and nsqlookupd configure it) --


class Router:
    """Routes a request to a handler of ``routes`` (path -> {method: handler}).

    Subclasses set ``routes``, ``_lower_paths`` (lower-cased path -> path)
    and ``log`` (the daemon's Logger), and override :meth:`_methods` and
    :meth:`_canonical` for routes with parameters.  A state-changing request
    that a browser sends from another origin is refused, 403
    ``CROSS_ORIGIN_FORBIDDEN``, before its handler runs (:func:`is_cross_origin`).
    """

    def _methods(self, path):
        """The {method: handler} of a routed path, or None."""
        return self.routes.get(path)

    def _canonical(self, path):
        """httprouter's case-insensitive lookup: the registered spelling of ``path``, or None."""
        return self._lower_paths.get(path.lower())

    def dispatch(self, request):
        """Route a request to its handler; returns a Response (never raises)."""
        path = request.path
        methods = self._methods(path)
        if methods is None:
            return self._redirect_or_404(request)
        allow = ", ".join(sorted(list(methods) + ["OPTIONS"]))
        if request.method == "OPTIONS":
            return Response(200, b"", [("Allow", allow)])
        handler = methods.get(request.method)
        if handler is None:
            return HTTPError(405, "METHOD_NOT_ALLOWED", [("Allow", allow)]).response()
        if request.method in STATE_CHANGING and is_cross_origin(request):
            self.log.warn("HTTP: refused %s %s from %s: Origin %s is another site's",
                          request.method, path, request.client_address[0] if request.client_address else "?",
                          request.header("Origin")[:100])
            return HTTPError(403, "CROSS_ORIGIN_FORBIDDEN").response()
        try:
            return handler(request)
        except HTTPError as e:
            return e.response()
        except Exception:
            self.log.error("HTTP: %s %s failed\n%s", request.method, path, traceback.format_exc())
            return HTTPError(500, "INTERNAL_ERROR").response()

    def _redirect_or_404(self, request):
        """httprouter: redirect to a route *of the same method* (trailing slash, case, unclean path)."""
        path = request.path
        method = request.method
        canonical = None
        if path != "/":
            candidates = []
            if path.endswith("/"):
                candidates.append(path[:-1])  # trailing-slash redirect
            clean = _clean_path(path)
            candidates.append(self._canonical(clean))  # fixed-path redirect
            if clean.endswith("/") and len(clean) > 1:
                candidates.append(self._canonical(clean[:-1]))
            for c in candidates:
                methods = c and self._methods(c)
                if methods and method in methods:
                    canonical = c
                    break
        if canonical is None:
            return HTTPError(404, "NOT_FOUND").response()
        location = urllib.parse.quote(canonical, safe="/:@!$&'()*+,;=") + (
            "?" + request.query if request.query else ""
        )
        status = 301 if method == "GET" else 307
        headers = [("Location", location)]
        body = b""
        if method == "GET":  # Go's http.Redirect writes a body for GET only
            body = ('<a href="%s">Moved Permanently</a>.\n\n' % _html_escape(location)).encode()
            headers.append(("Content-Type", "text/html; charset=utf-8"))
        return Response(status, body, headers)


def _clean_path(p):
    """httprouter's CleanPath: one leading slash, no ``//``, ``.`` or ``..``; a trailing slash kept."""
    if not p.startswith("/"):
        p = "/" + p
    clean = "/" + posixpath.normpath(p).lstrip("/")
    if p.endswith("/") and clean != "/":
        clean += "/"
    return clean


def _html_escape(s):
    """Go's htmlEscape (used by http.Redirect)."""
    for a, b in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&#34;"), ("'", "&#39;")):
        s = s.replace(a, b)
    return s


# -- request bodies ------------------------------------------------------------
#
# BodyFraming and parse_chunk_size decide, free of I/O; RequestBody reads.  The
# rules: never read more than a route's limit, and never reuse a connection
# whose next request might start anywhere but where we think.

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(r"[0-9A-Fa-f]+")
_MAX_CONTENT_LENGTH = (1 << 63) - 1  # Go's strconv.ParseUint(cl, 10, 63)
MAX_CHUNK_LINE = 4096  # a chunk-size line, or one trailer line
MAX_TRAILER_LINES = 100
DRAIN_LIMIT = 256 << 10  # Go's maxPostHandlerReadBytes: an unread body up to this is skipped, not a reason to close
LINGER = 0.5  # Go's rstAvoidanceDelay: how long a closing connection still swallows what the client sends
PARK_AFTER = 0.05  # seconds a kept-alive connection waits for its next request before giving up its thread


class FramingError(Exception):
    """The request cannot be framed: answer ``status`` and close the connection."""

    def __init__(self, status, reason):
        super().__init__(status, reason)
        self.status = status
        self.reason = reason


class BodyFraming:
    """Where a request's body ends: ``chunked``, else ``length`` bytes (0 = no body).

    ``close`` is set when the request is valid but the connection must not be
    reused after it (Transfer-Encoding on an HTTP/1.0 request).
    """

    __slots__ = ("chunked", "length", "close")

    def __init__(self, chunked=False, length=0, close=False):
        self.chunked = chunked
        self.length = length
        self.close = close

    def __repr__(self):
        return "BodyFraming(chunked=%r, length=%r, close=%r)" % (self.chunked, self.length, self.close)

    @classmethod
    def of(cls, version, content_lengths, transfer_encodings):
        """Go net/http's rules for a request with these header values (each a list of raw values).

        Transfer-Encoding must be exactly one ``chunked`` (else 501), and then
        Content-Length is ignored; HTTP/1.0 ignores Transfer-Encoding.
        Content-Length must be ASCII digits below 2**63; repeated, the values
        must agree (else 400).
        """
        close = False
        if transfer_encodings:
            if version == "HTTP/1.0":
                close = True  # ignored, as in Go, but where the body ends is in doubt
            elif len(transfer_encodings) != 1 or _trim(transfer_encodings[0]).lower() != "chunked":
                raise FramingError(501, "unsupported transfer encoding %r" % (transfer_encodings,))
            else:
                return cls(chunked=True)
        if not content_lengths:
            return cls(close=close)
        values = [_trim(v) for v in content_lengths]
        if any(v != values[0] for v in values):
            raise FramingError(400, "conflicting Content-Length %r" % (content_lengths,))
        if not values[0]:
            return cls(close=close)
        if not _DIGITS.fullmatch(values[0]) or int(values[0]) > _MAX_CONTENT_LENGTH:
            raise FramingError(400, "bad Content-Length %r" % content_lengths[0])
        return cls(length=int(values[0]), close=close)


def _trim(value):
    return value.strip(" \t\r\n")


def parse_chunk_size(line):
    """The size on a chunk-size line (extensions ignored), as Go's chunked reader accepts it."""
    if not line.endswith(b"\n") or len(line) > MAX_CHUNK_LINE:
        raise FramingError(400, "malformed chunk-size line")
    digits = line.split(b";", 1)[0].strip(b" \t\r\n")
    if not _HEX.fullmatch(digits.decode("latin-1")) or len(digits) > 16:
        raise FramingError(400, "bad chunk size %r" % line[:40])
    return int(digits, 16)


class RequestBody:
    """The one place a request body is read, for a handler or to skip it.

    Reads fail with :class:`HTTPError` only: 413 ``too_big`` before reading
    past ``limit``, 500 ``INTERNAL_ERROR`` (nsqd's answer to a body read
    error) when the body is cut short, malformed or too slow.  After either,
    :meth:`discard` tells the server to close the connection.
    """

    def __init__(self, rfile, framing, log, send_continue=None):
        self._rfile = rfile
        self._framing = framing
        self._log = log
        self._send_continue = send_continue  # "100 Continue" is owed before the first read
        self.consumed = not framing.chunked and framing.length == 0
        self._broken = False  # a read failed midway: the framing is lost

    @property
    def content_length(self):
        return None if self._framing.chunked else self._framing.length

    def check_length(self, limit, too_big):
        """413 ``too_big`` when the declared length is over ``limit`` (nothing is read)."""
        if not self._framing.chunked and self._framing.length > limit:
            raise HTTPError(413, too_big)

    def read(self, limit, too_big):
        """The whole body, at most ``limit`` bytes."""
        self.check_length(limit, too_big)
        if self.consumed:
            return b""
        try:
            if self._send_continue is not None:
                send, self._send_continue = self._send_continue, None
                send()
            if self._framing.chunked:
                data = self._read_chunked(limit, too_big)
            else:
                data = self._read_exactly(self._framing.length)
        except HTTPError:
            self._broken = True
            raise
        except (FramingError, OSError, EOFError) as e:
            # OSError covers the peer leaving and the read deadline (socket.timeout).
            self._broken = True
            self._log.debug("HTTP: failed to read request body - %s", e)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        self.consumed = True
        return data

    def discard(self):
        """Skip an unread body; False when the connection must close instead."""
        if self.consumed:
            return True
        if self._broken or self._send_continue is not None:  # the client still waits for our go-ahead
            return False
        try:
            self.read(DRAIN_LIMIT, "BODY_TOO_BIG")
        except HTTPError:
            return False
        return True

    def _read_exactly(self, n):
        data = self._rfile.read(n)
        if len(data) < n:
            raise EOFError("body ended after %d of %d bytes" % (len(data), n))
        return data

    def _read_chunked(self, limit, too_big):
        data = bytearray()
        while True:
            size = parse_chunk_size(self._rfile.readline(MAX_CHUNK_LINE + 1))
            if size == 0:
                break
            if len(data) + size > limit:
                raise HTTPError(413, too_big)
            data += self._read_exactly(size)
            if self._rfile.read(2) != b"\r\n":
                raise FramingError(400, "chunk not followed by CRLF")
        for _ in range(MAX_TRAILER_LINES + 1):
            line = self._rfile.readline(MAX_CHUNK_LINE + 1)
            if line in (b"\r\n", b"\n"):
                return bytes(data)
            if not line.endswith(b"\n") or len(line) > MAX_CHUNK_LINE:
                raise FramingError(400, "malformed trailer")
        raise FramingError(400, "too many trailer lines")


# -- the server ----------------------------------------------------------------


class _Request:
    """What a handler sees of a request: method, decoded path, raw query, headers, peer, TLS, and its body."""

    __slots__ = ("method", "path", "query", "_body", "headers", "client_address", "tls")

    def __init__(self, method, path, query, body, headers=None, client_address=None, tls=False):
        self.method = method
        self.path = path
        self.query = query
        self._body = body
        self.headers = headers  # an email.message.Message (case-insensitive get), or None
        self.client_address = client_address  # (host, port) of the peer
        self.tls = tls  # it came over an HTTPS listener

    def header(self, name):
        """A request header's value, or "" (absent, or a request built without headers)."""
        return (self.headers.get(name) if self.headers is not None else None) or ""

    @property
    def content_length(self):
        return self._body.content_length

    def check_length(self, limit, too_big):
        self._body.check_length(limit, too_big)

    def read_body(self, limit, too_big):
        """The body, or HTTPError(413, too_big) when it exceeds ``limit`` bytes."""
        return self._body.read(limit, too_big)


class _DeadlineReader(io.RawIOBase):
    """A socket's receiving side where every read ends by ``deadline`` (a monotonic time).

    Per-read socket timeouts would let a client trickle one byte at a time
    forever; this bounds the whole request, however it is split.
    """

    def __init__(self, sock):
        super().__init__()
        self._sock = sock
        self.deadline = None

    def readable(self):
        return True

    def readinto(self, buf):
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("read deadline passed")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buf)


# Go's http.StatusText for what we send (Python's phrases vary between versions: 3.13 says "Content Too Large").
_STATUS_TEXT = {
    200: "OK",
    301: "Moved Permanently",
    307: "Temporary Redirect",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Request Entity Too Large",
    414: "Request URI Too Long",
    417: "Expectation Failed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


def _status_text(status):
    text = _STATUS_TEXT.get(status)
    if text is None:
        try:
            text = http.HTTPStatus(status).phrase
        except ValueError:
            text = "status code %d" % status
    return text


def _status_token(status):
    """An HTTP status as an nsqd-style message: 400 -> BAD_REQUEST."""
    return re.sub(r"[^A-Z0-9]+", "_", _status_text(status).upper())


def _split_target(requestline, parsed_path):
    """A request target -> ``(path, query)``, both still escaped.

    The target is taken from the request line as sent: newer http.server
    versions collapse a leading ``//`` in their parsed path, where httprouter
    redirects to the clean one.
    """
    words = requestline.split(" ")
    target = words[1] if len(words) == 3 else parsed_path
    if target.startswith("/"):  # origin form; urlsplit would take "//x" for a host
        path, _, query = target.partition("?")
        return path.partition("#")[0], query.partition("#")[0]
    split = urllib.parse.urlsplit(target)
    return split.path, split.query


class _HTTPHandler(http.server.BaseHTTPRequestHandler):
    """One connection: requests are read here (head) and in RequestBody (body), both under deadlines."""

    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.rfile.close()  # replaced: reads must honour the request deadlines
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader, 65536)
        self._expect_continue = False
        self._linger = False  # a reply said "Connection: close": close gently
        self._kept_alive = False  # a request was answered on this connection
        self.park = False  # handle() left the connection open for the server to park

    def handle(self):
        """Requests until the connection closes, or until it idles: then it is parked (no thread)."""
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            if self.server.can_park() and self._idle():
                self.park = True
                return
            if not self.close_connection:
                self.handle_one_request()

    def _idle(self):
        """True when no next request starts within PARK_AFTER (nothing buffered either)."""
        self._reader.deadline = time.monotonic() + PARK_AFTER
        try:
            if not self.rfile.peek(1):
                self.close_connection = True  # the client closed
            return False
        except socket.timeout:
            return True
        except OSError:
            self.close_connection = True
            return False

    def finish(self):
        super().finish()
        if self._linger:
            self._linger_close()

    def _linger_close(self):
        """Half-close, then swallow what the client still sends for a moment.

        Closing a socket with unread data makes the kernel send a reset, which
        can destroy our reply (a 413 for a body we refused to read) before the
        client reads it.
        """
        sock = self.connection
        deadline = time.monotonic() + min(LINGER, self.server.read_timeout)
        try:
            sock.shutdown(socket.SHUT_WR)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                sock.settimeout(remaining)
                if not sock.recv(65536):
                    return
        except OSError:
            pass

    def handle_one_request(self):
        server = self.server
        try:
            # A kept-alive connection waits the idle timeout for its next request to begin; a
            # fresh one must start its first request within the read timeout (a client that
            # connects and says nothing is as stalled as one that stops half-way).
            wait = server.idle_timeout if self._kept_alive else server.read_timeout
            self._reader.deadline = time.monotonic() + wait
            if not self.rfile.peek(1):
                self.close_connection = True
                return
            self._kept_alive = True
            # Then the head and the body must arrive within the read timeout.
            self._reader.deadline = time.monotonic() + server.read_timeout
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.requestline = self.request_version = self.command = ""
                self.send_error(414)
                return
            self._expect_continue = False
            if not self.parse_request():  # it has answered (or the line was blank)
                self.close_connection = True
                return
            self._serve()
        except OSError as e:  # the client left, or missed a deadline: drop it without a reply
            self.close_connection = True
            server.log.debug("HTTP: closing %s:%s - %s", self.client_address[0], self.client_address[1], e)

    def handle_expect_100(self):
        """Owe the "100 Continue" until a handler reads the body (as Go does); a refused body is never sent."""
        self._expect_continue = True
        return True

    def _send_continue(self):
        self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _framing(self):
        """The body framing of a parsed head, or FramingError for a head Go would refuse."""
        headers = self.headers
        if headers.defects or headers.get_payload():
            raise FramingError(400, "malformed header line")
        if not _TOKEN.fullmatch(self.command):
            raise FramingError(400, "invalid method")
        for name in headers.keys():
            if not _TOKEN.fullmatch(name):
                raise FramingError(400, "invalid header name %r" % name)
        return BodyFraming.of(
            self.request_version,
            headers.get_all("Content-Length") or [],
            headers.get_all("Transfer-Encoding") or [],
        )

    def _serve(self):
        try:
            framing = self._framing()
        except FramingError as e:
            self.server.log.debug("HTTP: bad request from %s:%s - %s", *self.client_address[:2], e.reason)
            self.send_error(e.status)
            return
        started = time.monotonic()
        path, query = _split_target(self.requestline, self.path)
        body = RequestBody(
            self.rfile, framing, self.server.log, self._send_continue if self._expect_continue else None
        )
        # httprouter routes on the decoded path (req.URL.Path).
        request = _Request(self.command, urllib.parse.unquote(path), query, body, self.headers,
                           self.client_address[:2], self.server.ssl_context is not None)
        response = self.server.api.dispatch(request)
        if response.status >= 400:  # what was refused, and why, for --log-level=debug
            self.server.log.debug(
                "HTTP: %s %s (%s:%s) answered %d %s", self.command, self.path, *self.client_address[:2],
                response.status, response.body[:200].decode("utf-8", "replace"),
            )
        if framing.close or not body.discard():
            self.close_connection = True
        self._write(response)
        if self.server.log_requests:
            self.server.log.info(
                "%d %s %s (%s:%s) %dns", response.status, self.command, self.path, *self.client_address[:2],
                int((time.monotonic() - started) * 1e9),
            )

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals (bad request line, headers too large...) in nsqd's format, then close."""
        self.close_connection = True
        self._write(HTTPError(code, _status_token(code)).response())

    def _write(self, response):
        """Send a response (headers only for HEAD).

        A client that takes longer than the idle timeout to accept it is dropped.
        """
        self.connection.settimeout(self.server.idle_timeout)
        lines = [
            "HTTP/1.1 %d %s" % (response.status, _status_text(response.status)),
            "Date: " + self.date_time_string(),
        ]
        lines.extend("%s: %s" % kv for kv in response.headers)
        lines.append("Content-Length: %d" % len(response.body))
        if self.close_connection:
            lines.append("Connection: close")
            self._linger = True
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if self.command == "HEAD":  # Go sends a HEAD response's headers only
            self.wfile.write(head)
        else:
            self.wfile.write(head + response.body)

    def log_message(self, fmt, *args):
        self.server.log.debug("HTTP: %s %s", self.address_string(), fmt % args)


class HTTPServer(Listener):
    """Threaded HTTP/1.1 server with keep-alive for one daemon's ``api`` (a :class:`Router`).

    Connections are registered before their thread ``thread_name[ip:port]``
    starts; the daemon's stop calls :meth:`close_connections`, then
    ``server_close()``, which joins the threads.  ``read_timeout`` bounds a
    request (head and body) and the wait for a new connection's first
    request; ``idle_timeout`` bounds a kept-alive connection's wait for the
    next one and a client's acceptance of a reply.  With ``log_requests``
    every request is logged at INFO, as Go's ``http_api.Log`` does.
    """

    log_name = "HTTP"

    def __init__(self, address, api, log, read_timeout, idle_timeout, thread_name, log_requests=False,
                 ssl_context=None):
        """With ``ssl_context`` it is an HTTPS listener (the handshake is each connection thread's)."""
        self.ssl_context = ssl_context
        self.api = api
        self.read_timeout = read_timeout
        self.idle_timeout = idle_timeout
        self.thread_name = thread_name
        self.log_requests = log_requests
        self._park = None
        super().__init__(address, _HTTPHandler, log)
        if ssl_context is None:
            self._park = new_connection_park(self._resume, self._expire, thread_name + "-idle")

    def refusal(self):
        """503 in nsqd's body style, for a connection the host has no thread for (HTTPS: just closed)."""
        if self.ssl_context is not None:
            return b""
        response = HTTPError(503, "SERVICE_UNAVAILABLE").response()
        lines = ["HTTP/1.1 503 %s" % _status_text(503)]
        lines.extend("%s: %s" % kv for kv in response.headers)
        lines += ["Content-Length: %d" % len(response.body), "Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body

    def get_request(self):
        sock, address = super().get_request()
        if self.ssl_context is not None:
            # No I/O here: the accept loop must not wait on a client's handshake.
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def finish_request(self, request, client_address):
        """Serve a connection; True when it was parked (it stays open without this thread)."""
        if self.ssl_context is not None:
            try:
                request.settimeout(self.read_timeout)
                request.do_handshake()
            except OSError as e:  # includes ssl.SSLError: a plain-HTTP client, an unknown CA...
                self.log.debug("%s: TLS handshake with %s:%s failed - %s", self.log_name, *client_address[:2], e)
                return False
        handler = self.RequestHandlerClass(request, client_address, self)
        if handler.park and self._park is not None:
            return self._park.park(request, client_address, self.idle_timeout)
        return False

    def can_park(self):
        """True if idle kept-alive connections give up their thread here (plain HTTP on Linux).

        Not over TLS: the TLS layer may hold decrypted bytes that no poll sees.
        """
        return self._park is not None

    def _resume(self, request, client_address):
        """A parked connection is readable: a thread for it again (the park's thread)."""
        self.dispatch_request(request, client_address)

    def _expire(self, request, client_address):
        """A parked connection idled for idle_timeout: close it, as Go's IdleTimeout does."""
        self.shutdown_request(request)

    def server_close(self):
        park, self._park = self._park, None
        if park is not None:
            for request, _ in park.stop():
                self.shutdown_request(request)
        super().server_close()
