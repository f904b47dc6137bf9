"""nsqadmin's HTTP routes (port 4171), served by the broker's HTTP edge.

Go nsqadmin's routes: the pages (``/``, ``/topics``, ``/topics/:topic``,
``/topics/:topic/:channel``, ``/nodes``, ``/nodes/:node``, ``/lookup``,
``/counter``), ``/static/:asset``, ``/ping`` and the ``/api/...`` JSON API;
plus ``/nodes/:node/inside`` and ``/api/nodes/:node/state`` (the inside view
of one of our brokers).  Everything lives under ``--base-path``.  Request
framing, deadlines and error bodies are the shared edge's
(:class:`~nsqd_threaded.server.http_server.HTTPServer`).
"""

import functools

from ..server import http_server
from ..server.http_server import TEXT_TYPE, HTTPError, QueryError, Response, Router, ok_json, parse_query
from . import pages, static
from .actions import Actions
from .api import AdminAPI, AdminError

HTML_TYPE = "text/html; charset=utf-8"
# On every page: the CSP (no inline script, style or handler; see admin.pages) and no content sniffing.
PAGE_HEADERS = (("Content-Type", HTML_TYPE), ("Content-Security-Policy", pages.CONTENT_SECURITY_POLICY),
                ("X-Content-Type-Options", "nosniff"))

# (method, pattern, handler name): ":x" segments are parameters.
ROUTES = (
    ("GET", "/ping", "ping"),
    ("GET", "/", "page_topics"),
    ("GET", "/topics", "page_topics"),
    ("GET", "/topics/:topic", "page_topic"),
    ("GET", "/topics/:topic/:channel", "page_channel"),
    ("GET", "/nodes", "page_nodes"),
    ("GET", "/nodes/:node", "page_node"),
    ("GET", "/nodes/:node/inside", "page_inside"),
    ("GET", "/counter", "page_counter"),
    ("GET", "/lookup", "page_lookup"),
    ("GET", "/static/:asset", "static_asset"),
    ("GET", "/api/topics", "api_topics"),
    ("GET", "/api/topics/:topic", "api_topic"),
    ("GET", "/api/topics/:topic/:channel", "api_channel"),
    ("GET", "/api/nodes", "api_nodes"),
    ("GET", "/api/nodes/:node", "api_node"),
    ("GET", "/api/nodes/:node/state", "api_node_state"),
    ("GET", "/api/counter", "api_counter"),
    ("POST", "/api/topics", "api_create"),
    ("POST", "/api/topics/:topic", "api_topic_action"),
    ("POST", "/api/topics/:topic/:channel", "api_channel_action"),
    ("DELETE", "/api/nodes/:node", "api_tombstone"),
    ("DELETE", "/api/topics/:topic", "api_delete_topic"),
    ("DELETE", "/api/topics/:topic/:channel", "api_delete_channel"),
)


def _segments(path):
    return path.strip("/").split("/") if path.strip("/") else []


class AdminRouter(Router):
    """Route table and handlers of one NSQAdmin; patterns with ``:param`` segments, under the base path."""

    def __init__(self, admin):
        self.admin = admin
        self.log = admin.log
        self.api = AdminAPI(admin)
        self.actions = Actions(admin)
        self.pages = pages.Pages(admin)
        self.assets = static.load_assets()  # {name: (content type, bytes)}, read once from the package
        self.base = admin.options.base_path.rstrip("/")
        self._table = {}  # segment count -> [(pattern segments, method, handler name)]
        for method, pattern, name in ROUTES:
            segs = _segments(pattern)
            self._table.setdefault(len(segs), []).append((segs, method, name))
        self._lower_paths = {}
        self.routes = {}

    def _match(self, path):
        """``{method: handler}`` for a path (handlers bound to its parameters), or None."""
        if self.base:
            if path != self.base and not path.startswith(self.base + "/"):
                return None
            path = path[len(self.base):] or "/"
        segs = _segments(path)
        if path != "/" and path.endswith("/"):
            return None  # the trailing-slash redirect of the shared router
        methods = {}
        for pattern, method, name in self._table.get(len(segs), ()):
            params = {}
            for p, s in zip(pattern, segs):
                if p.startswith(":"):
                    if not s:
                        break
                    params[p[1:]] = s
                elif p != s:
                    break
            else:
                if method not in methods:  # static routes are listed first
                    methods[method] = functools.partial(getattr(self, name), **params)
        return methods or None

    def _methods(self, path):
        return self._match(path)

    def _canonical(self, path):
        return path if self._match(path) else None

    # -- plumbing

    @staticmethod
    def _query(request):
        try:
            return parse_query(request.query)
        except QueryError:
            raise AdminError(400, "INVALID_REQUEST") from None

    @staticmethod
    def _json(answer):
        return ok_json(answer.doc if hasattr(answer, "doc") else answer)

    @staticmethod
    def _html(text, status=200):
        return Response(status, text.encode("utf-8"), PAGE_HEADERS)

    def _page(self, render, *args):
        try:
            return self._html(render(*args))
        except HTTPError as e:
            return self._html(self.pages.error_page(e.status, e.message), e.status)

    # -- pages

    def ping(self, request):
        return Response(200, b"OK", [("Content-Type", TEXT_TYPE)])

    def page_topics(self, request):
        return self._page(self.pages.topics)

    def page_topic(self, request, topic):
        return self._page(self.pages.topic, topic)

    def page_channel(self, request, topic, channel):
        return self._page(self.pages.channel, topic, channel)

    def page_nodes(self, request):
        return self._page(self.pages.nodes)

    def page_node(self, request, node):
        return self._page(self.pages.node, node)

    def page_inside(self, request, node):
        return self._page(self.pages.inside, node, self._query(request).get("topic", ""))

    def page_counter(self, request):
        return self._page(self.pages.counter)

    def page_lookup(self, request):
        return self._page(self.pages.lookup)

    def static_asset(self, request, asset):
        found = self.assets.get(asset)
        if found is None:
            raise AdminError(404, "NOT_FOUND")
        content_type, body = found
        return Response(200, body, [("Content-Type", content_type), ("Cache-Control", "max-age=60"),
                                    ("X-Content-Type-Options", "nosniff")])

    # -- API reads

    def api_topics(self, request):
        inactive = self._query(request).get("inactive") == "true"
        return self._json(self.api.topics(inactive))

    def api_topic(self, request, topic):
        return self._json(self.api.topic(topic))

    def api_channel(self, request, topic, channel):
        return self._json(self.api.channel(topic, channel))

    def api_nodes(self, request):
        return self._json(self.api.nodes())

    def api_node(self, request, node):
        return self._json(self.api.node(node))

    def api_node_state(self, request, node):
        return ok_json(self.api.node_state(node, self._query(request).get("topic", "")))

    def api_counter(self, request):
        return self._json(self.api.counter())

    # -- API actions

    def api_create(self, request):
        return ok_json(self.actions.create(request))

    def api_topic_action(self, request, topic):
        return ok_json(self.actions.topic_channel_action(request, topic))

    def api_channel_action(self, request, topic, channel):
        return ok_json(self.actions.topic_channel_action(request, topic, channel))

    def api_delete_topic(self, request, topic):
        return ok_json(self.actions.delete_topic(request, topic))

    def api_delete_channel(self, request, topic, channel):
        return ok_json(self.actions.delete_channel(request, topic, channel))

    def api_tombstone(self, request, node):
        return ok_json(self.actions.tombstone(request, node))


class HTTPServer(http_server.HTTPServer):
    """nsqadmin's HTTP listener: the shared edge serving one NSQAdmin's :class:`AdminRouter`."""

    def __init__(self, address, admin):
        opts = admin.options
        super().__init__(address, AdminRouter(admin), admin.log, opts.http_read_timeout, opts.http_idle_timeout,
                         "nsqadmin-http", log_requests=True)
