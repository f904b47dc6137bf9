"""The HTTP API on port 4151, served by ``http.server`` with HTTP/1.1 keep-alive.

Routes, status codes, bodies and headers follow nsqd 1.3 (spec: http-api.md).
Handlers return a :class:`Response`; the request handler class only moves
bytes.  Query parsing (Go's ``url.ParseQuery`` rules) and the V1 response
conventions are plain functions.
"""

import http.server
import json
import posixpath
import re
import socket
import socketserver
import threading
import traceback
import urllib.parse

from . import gocompat, protocol, stats
from .channel import ChannelError
from .metrics import render_prometheus
from .options import LOG_LEVELS
from .protocol import ProtocolError
from .tcp import PromptShutdownMixIn, split_address
from .topic import TopicError

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


# -- the API -----------------------------------------------------------------


class HTTPAPI:
    """Route table and handlers for one NSQD.  Thread-safe: handlers only call NSQD."""

    def __init__(self, nsqd):
        self.nsqd = nsqd
        self.opts = nsqd.options
        # path -> {method: handler}
        self.routes = {
            "/ping": {"GET": self.ping},
            "/info": {"GET": self.info},
            "/stats": {"GET": self.stats},
            "/metrics": {"GET": self.metrics},
            "/pub": {"POST": self.pub},
            "/mpub": {"POST": self.mpub},
            "/topic/create": {"POST": self.topic_create},
            "/topic/delete": {"POST": self.topic_delete},
            "/topic/empty": {"POST": self.topic_empty},
            "/topic/pause": {"POST": self.topic_pause},
            "/topic/unpause": {"POST": self.topic_pause},
            "/channel/create": {"POST": self.channel_create},
            "/channel/delete": {"POST": self.channel_delete},
            "/channel/empty": {"POST": self.channel_empty},
            "/channel/pause": {"POST": self.channel_pause},
            "/channel/unpause": {"POST": self.channel_pause},
        }
        self._lower_paths = {p.lower(): p for p in self.routes}

    def _methods(self, path):
        """The {method: handler} of a routed path, or None."""
        methods = self.routes.get(path)
        if methods is None and path.startswith("/config/") and path.count("/") == 2 and len(path) > 8:
            methods = {"GET": self.config_get, "PUT": self.config_put}
        return methods

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
        try:
            return handler(request)
        except HTTPError as e:
            return e.response()
        except Exception:
            self.nsqd.log.error("HTTP: %s %s failed\n%s", request.method, path, traceback.format_exc())
            return HTTPError(500, "INTERNAL_ERROR").response()

    def _canonical(self, path):
        """httprouter's case-insensitive lookup: the registered spelling of ``path``, or None."""
        lower = path.lower()
        if lower in self._lower_paths:
            return self._lower_paths[lower]
        if lower.startswith("/config/") and self._methods("/config/" + path[8:]):
            return "/config/" + path[8:]  # the :opt segment keeps its case
        return None

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

    # -- helpers -----------------------------------------------------------

    @staticmethod
    def _query(request):
        try:
            return parse_query(request.query)
        except QueryError:
            raise HTTPError(400, "INVALID_REQUEST") from None

    def _topic_arg(self, request, invalid="INVALID_TOPIC", validate=True):
        q = self._query(request)
        name = q.get("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if validate and not protocol.is_valid_name(name):
            raise HTTPError(400, invalid)
        return name, q

    def _channel_args(self, request):
        q = self._query(request)
        topic = q.get("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not protocol.is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = q.get("channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not protocol.is_valid_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    def _existing_topic(self, name):
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic

    def _existing_channel(self, request):
        topic_name, channel_name = self._channel_args(request)
        topic = self._existing_topic(topic_name)
        channel = topic.get_existing_channel(channel_name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return topic, channel

    def _publish(self, topic, bodies, defer_ns=0):
        try:
            topic.publish(bodies, defer_ns)
        except TopicError:
            raise HTTPError(503, "EXITING") from None

    # -- routes ------------------------------------------------------------

    def ping(self, request):
        health = self.nsqd.health()
        if health == "OK":
            return Response(200, b"OK", [("Content-Type", TEXT_TYPE)])
        return Response(500, health.encode(), [("Content-Type", TEXT_TYPE)])

    def info(self, request):
        opts = self.opts
        doc = {
            "version": opts.version,
            "broadcast_address": opts.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": self.nsqd.http_address[1] if self.nsqd.http_address else 0,
            "tcp_port": self.nsqd.tcp_address[1],
            "start_time": int(self.nsqd.start_time),
            "max_heartbeat_interval": gocompat.ns(opts.max_heartbeat_interval),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": gocompat.ns(opts.max_output_buffer_timeout),
            "max_deflate_level": opts.max_deflate_level,
            "topology_zone": opts.topology_zone,
            "topology_region": opts.topology_region,
        }
        return ok_json(doc)

    def pub(self, request):
        max_size = self.opts.max_msg_size
        body = request.read_body(max_size, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        name, q = self._topic_arg(request)
        topic = self.nsqd.get_topic_or_503(name)
        defer_ns = 0
        if "defer" in q:
            # Go's strconv.ParseInt(s, 10, 64): ASCII digits with an optional sign.
            if not _GO_INT.fullmatch(q["defer"]):
                raise HTTPError(400, "INVALID_DEFER")
            defer_ms = int(q["defer"], 10)
            if not 0 <= defer_ms <= int(self.opts.max_req_timeout * 1000):
                raise HTTPError(400, "INVALID_DEFER")
            defer_ns = defer_ms * 1000000
        self._publish(topic, [body], defer_ns)
        return ok_text("OK")

    def mpub(self, request):
        max_body = self.opts.max_body_size
        if request.content_length is not None and request.content_length > max_body:
            request.discard = True
            raise HTTPError(413, "BODY_TOO_BIG")
        name, q = self._topic_arg(request)
        topic = self.nsqd.get_topic_or_503(name)
        binary = parse_bool(q.get("binary"), False) if "binary" in q else False
        if "binary" in q and q["binary"] not in ("true", "1", "false", "0"):
            binary = True  # any other value is nsqd's deprecated spelling of true
        body = request.read_body(max_body, "BODY_TOO_BIG")
        if binary:
            bodies = self._mpub_binary(body)
        else:
            bodies = []
            for line in body.split(b"\n"):
                if not line:
                    continue
                if len(line) > self.opts.max_msg_size:
                    raise HTTPError(413, "MSG_TOO_BIG")
                bodies.append(line)
        if bodies:
            self._publish(topic, bodies)
        return ok_text("OK")

    def _mpub_binary(self, body):
        try:
            if len(body) < 4:
                raise ProtocolError("E_BAD_BODY", "MPUB failed to read message count")
            count = protocol.decode_size(body[:4])
            protocol.check_mpub_count(count, self.opts.max_body_size)
            bodies = []
            pos = protocol.parse_mpub_messages(body, 4, len(body), 0, count, self.opts.max_msg_size, bodies)
            if len(bodies) < count:
                raise ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")
            del pos
            return bodies
        except ProtocolError as e:
            raise HTTPError(413, e.code[2:]) from None

    def stats(self, request):
        q = self._query(request)
        doc = stats.collect(
            self.nsqd,
            topic_name=q.get("topic"),
            channel_name=q.get("channel"),
            include_clients=parse_bool(q.get("include_clients"), True),
            include_mem=parse_bool(q.get("include_mem"), True),
        )
        if q.get("format") == "json":
            return ok_json(doc)
        return ok_text(stats.render_text(doc, self.nsqd))

    def metrics(self, request):
        doc = stats.collect(self.nsqd, include_clients=True, include_mem=True)
        body = render_prometheus(doc, self.nsqd).encode()
        return Response(200, body, [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")])

    def topic_create(self, request):
        name, _ = self._topic_arg(request)
        self.nsqd.get_topic_or_503(name)
        return ok_empty()

    def topic_delete(self, request):
        name, _ = self._topic_arg(request, validate=False)
        self._existing_topic(name)
        self.nsqd.delete_topic(name)
        return ok_empty()

    def topic_empty(self, request):
        name, _ = self._topic_arg(request)
        self._existing_topic(name).empty()
        return ok_empty()

    def topic_pause(self, request):
        name, _ = self._topic_arg(request, validate=False)
        topic = self._existing_topic(name)
        if "unpause" in request.path:
            topic.unpause()
        else:
            topic.pause()
        self.nsqd.persist_metadata()
        return ok_empty()

    def channel_create(self, request):
        topic_name, channel_name = self._channel_args(request)
        topic = self._existing_topic(topic_name)
        try:
            topic.get_channel(channel_name)
        except (TopicError, ChannelError):
            raise HTTPError(503, "EXITING") from None
        return ok_empty()

    def channel_delete(self, request):
        topic, channel = self._existing_channel(request)
        if topic.delete_channel(channel.name):
            self.nsqd.delete_topic(topic.name)
        return ok_empty()

    def channel_empty(self, request):
        _, channel = self._existing_channel(request)
        channel.empty()
        return ok_empty()

    def channel_pause(self, request):
        _, channel = self._existing_channel(request)
        if "unpause" in request.path:
            channel.unpause()
        else:
            channel.pause()
        self.nsqd.persist_metadata()
        return ok_empty()

    # -- /config/:opt --------------------------------------------------------

    def config_get(self, request):
        name = request.path[len("/config/") :]
        value = self.nsqd.config_value(name)
        if value is _MISSING:
            raise HTTPError(400, "INVALID_OPTION")
        if isinstance(value, str):
            return ok_text(value)
        return ok_json(value)

    def config_put(self, request):
        name = request.path[len("/config/") :]
        max_size = self.opts.max_msg_size
        body = request.read_body(max_size, "INVALID_VALUE")
        if not body:
            raise HTTPError(413, "INVALID_VALUE")
        if name == "nsqlookupd_tcp_addresses":
            try:
                value = json.loads(body.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                raise HTTPError(400, "INVALID_VALUE") from None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise HTTPError(400, "INVALID_VALUE")
            self.nsqd.set_lookupd_addresses(value)
        elif name == "log_level":
            level = body.decode("utf-8", "replace").lower()
            if level not in LOG_LEVELS:
                raise HTTPError(400, "INVALID_VALUE")
            self.nsqd.set_log_level(level)
        else:
            raise HTTPError(400, "INVALID_OPTION")
        return self.config_get(request)


_MISSING = object()


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


_GO_INT = re.compile(r"[+-]?[0-9]+")


# -- the server ----------------------------------------------------------------


class _Request:
    """What a handler sees of a request.  ``read_body`` applies nsqd's size rules."""

    def __init__(self, handler, method, path, query):
        self._handler = handler
        self.method = method
        self.path = path
        self.query = query
        cl = handler.headers.get("Content-Length")
        try:
            self.content_length = int(cl) if cl is not None else None
        except ValueError:
            self.content_length = None
        self.chunked = "chunked" in handler.headers.get("Transfer-Encoding", "").lower()
        self.discard = False
        self._consumed = False

    def read_body(self, limit, too_big):
        """The body, or HTTPError(413, too_big) when it exceeds ``limit`` bytes."""
        if self.content_length is not None and self.content_length > limit:
            raise HTTPError(413, too_big)
        self._consumed = True
        rfile = self._handler.rfile
        if self.chunked:
            data = bytearray()
            while True:
                line = rfile.readline(65537)
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise HTTPError(500, "INTERNAL_ERROR") from None
                if size == 0:
                    while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                data += rfile.read(size)
                rfile.readline(3)
                if len(data) > limit:
                    self._handler.close_connection = True
                    raise HTTPError(413, too_big)
            return bytes(data)
        n = self.content_length or 0
        data = rfile.read(n) if n else b""
        if len(data) < n:
            raise HTTPError(500, "INTERNAL_ERROR")
        return data

    def finish(self):
        """Drain an unread body so the next keep-alive request parses cleanly."""
        if self._consumed:
            return
        if self.discard or (self.content_length and self.content_length > 1 << 20) or self.chunked:
            self._handler.close_connection = True
        elif self.content_length:
            self._handler.rfile.read(self.content_length)


class _HTTPHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "nsqd"

    def setup(self):
        super().setup()
        threading.current_thread().name = "nsqd-http[%s:%s]" % self.client_address[:2]
        self.server.track(self.request)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.untrack(self.request)

    def _serve(self):
        api = self.server.api
        if self.path.startswith("/"):  # origin form; urlsplit would take "//x" for a host
            path, _, query = self.path.partition("?")
            path = path.partition("#")[0]
            query = query.partition("#")[0]
        else:
            split = urllib.parse.urlsplit(self.path)
            path, query = split.path, split.query
        # httprouter routes on the decoded path (req.URL.Path).
        request = _Request(self, self.command, urllib.parse.unquote(path), query)
        response = api.dispatch(request)
        request.finish()
        self.send_response_only(response.status)
        self.send_header("Date", self.date_time_string())
        for k, v in response.headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(response.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":  # Go sends a HEAD response's headers only
            self.wfile.write(response.body)

    do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_HEAD = do_PATCH = _serve

    def log_message(self, fmt, *args):
        self.server.api.nsqd.log.debug("HTTP: %s %s", self.address_string(), fmt % args)


class HTTPServer(PromptShutdownMixIn, socketserver.ThreadingMixIn, http.server.HTTPServer):
    """Threaded HTTP/1.1 server; tracks open connections so stop() can close idle keep-alives."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, address, nsqd):
        host, port = split_address(address)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.api = HTTPAPI(nsqd)
        self._conns_lock = threading.Lock()  # guards _conns
        self._conns = set()
        super().__init__((host, port), _HTTPHandler)

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)  # skip getfqdn(): it can block on DNS

    def track(self, sock):
        with self._conns_lock:
            self._conns.add(sock)

    def untrack(self, sock):
        with self._conns_lock:
            self._conns.discard(sock)

    def close_connections(self):
        with self._conns_lock:
            conns = list(self._conns)
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

