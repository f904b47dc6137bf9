"""nsqlookupd's HTTP API (port 4161), served by ``http.server`` with HTTP/1.1 keep-alive.

Routes, bodies, status codes and headers are nsqlookupd 1.3's, including its
router's 404/405/301/307 answers.  :class:`LookupdHTTPAPI` maps a request to a
:class:`~nsqd_threaded.server.http_api.Response`; the handler class only moves bytes.
"""

import http.server
import posixpath
import socket
import socketserver
import threading
import time
import traceback
import urllib.parse

from ..server.http_api import JSON_TYPE, TEXT_TYPE, X_NSQ, HTTPError, QueryError, Response, parse_query
from ..protocol import is_valid_name
from ..server.base import PromptShutdownMixIn, split_address
from .registration_db import Registration, filter_active
from .wire import go_json

# Bodies are never used by nsqlookupd; one up to this size is read and dropped
# to keep the connection, a larger (or chunked) one closes it after the reply.
_MAX_DISCARD = 1 << 20


def _ok_json(doc):
    return Response(200, go_json(doc).encode("utf-8"), [("Content-Type", JSON_TYPE), X_NSQ])


def _ok_empty():
    return Response(200, b"", [X_NSQ])


class LookupdHTTPAPI:
    """Route table and handlers for one NSQLookupd.  Thread-safe: handlers only call the RegistrationDB."""

    def __init__(self, lookupd):
        self.lookupd = lookupd
        self.db = lookupd.db
        self.routes = {  # path -> {method: handler}
            "/ping": {"GET": self.ping},
            "/info": {"GET": self.info},
            "/debug": {"GET": self.debug},
            "/lookup": {"GET": self.lookup},
            "/topics": {"GET": self.topics},
            "/channels": {"GET": self.channels},
            "/nodes": {"GET": self.nodes},
            "/topic/create": {"POST": self.topic_create},
            "/topic/delete": {"POST": self.topic_delete},
            "/channel/create": {"POST": self.channel_create},
            "/channel/delete": {"POST": self.channel_delete},
            "/topic/tombstone": {"POST": self.topic_tombstone},
        }
        self._lower_paths = {p.lower(): p for p in self.routes}

    # -- router (julienschmidt/httprouter as nsqlookupd configures it) --------

    def dispatch(self, method, path, query):
        """A Response for the request (never raises)."""
        methods = self.routes.get(path)
        if methods is None:
            return self._redirect_or_404(method, path, query)
        allow = ", ".join(sorted(list(methods) + ["OPTIONS"]))
        if method == "OPTIONS":
            return Response(200, b"", [("Allow", allow)])
        handler = methods.get(method)
        if handler is None:
            return HTTPError(405, "METHOD_NOT_ALLOWED", [("Allow", allow)]).response()
        try:
            return handler(query)
        except HTTPError as e:
            return e.response()
        except Exception:
            self.lookupd.log.error("HTTP: %s %s failed\n%s", method, path, traceback.format_exc())
            return HTTPError(500, "INTERNAL_ERROR").response()

    def _redirect_or_404(self, method, path, query):
        """Redirect to the route of the same method a trailing slash, case or unclean path hides."""
        target = None
        if path != "/":
            candidates = []
            if path.endswith("/"):
                candidates.append(path[:-1])
            clean = _clean_path(path)
            candidates.append(self._lower_paths.get(clean.lower()))
            if clean.endswith("/") and len(clean) > 1:
                candidates.append(self._lower_paths.get(clean[:-1].lower()))
            for c in candidates:
                if c and method in self.routes.get(c, ()):
                    target = c
                    break
        if target is None:
            return HTTPError(404, "NOT_FOUND").response()
        location = urllib.parse.quote(target, safe="/:@!$&'()*+,;=") + ("?" + query if query else "")
        headers = [("Location", location)]
        if method != "GET":
            return Response(307, b"", headers)
        body = ('<a href="%s">Moved Permanently</a>.\n\n' % _html_escape(location)).encode()
        return Response(301, body, headers + [("Content-Type", "text/html; charset=utf-8")])

    # -- helpers ------------------------------------------------------------------

    @staticmethod
    def _params(query):
        try:
            return parse_query(query)
        except QueryError:
            raise HTTPError(400, "INVALID_REQUEST") from None

    def _topic(self, query):
        q = self._params(query)
        topic = q.get("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        return topic, q

    def _topic_channel(self, query):
        topic, q = self._topic(query)
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = q.get("channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    # -- handlers -------------------------------------------------------------------

    def ping(self, query):
        return Response(200, b"OK", [("Content-Type", TEXT_TYPE)])

    def info(self, query):
        return _ok_json({"version": self.lookupd.version})

    def topics(self, query):
        return _ok_json({"topics": [r.key for r in self.db.find_registrations("topic", "*", "")]})

    def channels(self, query):
        topic, _ = self._topic(query)
        return _ok_json({"channels": [r.subkey for r in self.db.find_registrations("channel", topic, "*")]})

    def lookup(self, query):
        topic, _ = self._topic(query)
        db = self.db
        if not db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        channels = [r.subkey for r in db.find_registrations("channel", topic, "*")]
        opts = self.lookupd.options
        producers = filter_active(
            db.find_producers("topic", topic, ""), opts.inactive_producer_timeout, opts.tombstone_lifetime
        )
        return _ok_json({"channels": channels, "producers": [p.peer.to_json() for p in producers]})

    def nodes(self, query):
        opts = self.lookupd.options
        nodes = []
        for peer, topics, tombstones in self.db.nodes(opts.inactive_producer_timeout, opts.tombstone_lifetime):
            node = peer.to_json()
            node["tombstones"] = tombstones
            node["topics"] = topics
            nodes.append(node)
        return _ok_json({"producers": nodes})

    def debug(self, query):
        return _ok_json(self.db.debug())

    def topic_create(self, query):
        topic, _ = self._topic(query)
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        self.lookupd.log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return _ok_empty()

    def topic_delete(self, query):
        topic, _ = self._topic(query)  # not validated, so "*" deletes every topic, as in nsqlookupd
        db, log = self.db, self.lookupd.log
        for reg in db.find_registrations("channel", topic, "*"):
            log.info("DB: removing channel(%s) from topic(%s)", reg.subkey, topic)
            db.remove_registration(reg)
        for reg in db.find_registrations("topic", topic, ""):
            log.info("DB: removing topic(%s)", topic)
            db.remove_registration(reg)
        return _ok_empty()

    def topic_tombstone(self, query):
        topic, q = self._topic(query)
        node = q.get("node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        self.lookupd.log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        self.db.tombstone(topic, node)
        return _ok_empty()

    def channel_create(self, query):
        topic, channel = self._topic_channel(query)
        log = self.lookupd.log
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(Registration("channel", topic, channel))
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return _ok_empty()

    def channel_delete(self, query):
        topic, channel = self._topic_channel(query)
        regs = self.db.find_registrations("channel", topic, channel)
        if not regs:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        self.lookupd.log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for reg in regs:
            self.db.remove_registration(reg)
        return _ok_empty()


def _clean_path(p):
    """httprouter's CleanPath: one leading slash, no ``//``, ``.`` or ``..``; a trailing slash kept."""
    if not p.startswith("/"):
        p = "/" + p
    clean = "/" + posixpath.normpath(p).lstrip("/")
    if p.endswith("/") and clean != "/":
        clean += "/"
    return clean


def _html_escape(s):
    """Go's htmlEscape, as http.Redirect uses it."""
    for a, b in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&#34;"), ("'", "&#39;")):
        s = s.replace(a, b)
    return s


class _HTTPHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        threading.current_thread().name = "nsqlookupd-http[%s:%s]" % self.client_address[:2]
        self.server.track(self.request)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.untrack(self.request)

    def _serve(self):
        started = time.monotonic()
        # The request target as sent: newer http.server versions collapse a leading "//" in self.path,
        # where httprouter would redirect.
        words = self.requestline.split(" ")
        target = words[1] if len(words) == 3 else self.path
        if target.startswith("/"):  # origin form; urlsplit would take "//x" for a host
            path, _, query = target.partition("?")
            path = path.partition("#")[0]
            query = query.partition("#")[0]
        else:
            split = urllib.parse.urlsplit(target)
            path, query = split.path, split.query
        self._drain_body()
        # httprouter routes on the decoded path.
        response = self.server.api.dispatch(self.command, urllib.parse.unquote(path), query)
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
        self.server.lookupd.log.info(
            "%d %s %s (%s) %dns",
            response.status,
            self.command,
            self.path,
            self.address_string(),
            int((time.monotonic() - started) * 1e9),
        )

    def _drain_body(self):
        length = self.headers.get("Content-Length")
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        try:
            n = int(length) if length is not None else 0
        except ValueError:
            n = _MAX_DISCARD + 1
        if chunked or n > _MAX_DISCARD:
            self.close_connection = True
        elif n > 0:
            self.rfile.read(n)

    do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_HEAD = do_PATCH = _serve

    def address_string(self):
        return "%s:%s" % self.client_address[:2]

    def log_message(self, fmt, *args):
        self.server.lookupd.log.debug("HTTP: %s %s", self.address_string(), fmt % args)


class HTTPServer(PromptShutdownMixIn, socketserver.ThreadingMixIn, http.server.HTTPServer):
    """Threaded HTTP/1.1 server; tracks open connections so stop() can close idle keep-alives."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True
    request_queue_size = 128  # http.server's default of 5 refuses bursts of clients

    def __init__(self, address, lookupd):
        host, port = split_address(address)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.lookupd = lookupd
        self.api = LookupdHTTPAPI(lookupd)
        self._conns_lock = threading.Lock()  # guards _conns and _closing
        self._conns = set()
        self._closing = False
        super().__init__((host, port), _HTTPHandler)

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)  # skip getfqdn(): it can block on DNS

    def track(self, sock):
        with self._conns_lock:
            self._conns.add(sock)
            closing = self._closing
        if closing:
            _shutdown(sock)

    def untrack(self, sock):
        with self._conns_lock:
            self._conns.discard(sock)

    def close_connections(self):
        with self._conns_lock:
            self._closing = True
            conns = list(self._conns)
        for sock in conns:
            _shutdown(sock)

    def handle_error(self, request, client_address):
        self.lookupd.log.debug("HTTP: error on %s:%s\n%s", client_address[0], client_address[1], traceback.format_exc())


def _shutdown(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
