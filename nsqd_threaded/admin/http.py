"""nsqadmin's HTTP routes (port 4171), served by the broker's HTTP edge.

Go nsqadmin's routes: the pages (``/``, ``/topics``, ``/topics/:topic``,
``/topics/:topic/:channel``, ``/nodes``, ``/nodes/:node``, ``/lookup``,
``/counter``), ``/static/:asset``, ``/ping`` and the ``/api/...`` JSON API;
plus ``/nodes/:node/inside`` and ``/api/nodes/:node/state`` (the inside view
of one of our brokers), ``/api/charts/:topic[/:channel]`` (nsqadmin's own
samples, for the charts: :mod:`.sampler`), and Go's ``/config/:opt`` (from
``--allow-config-from-cidr`` only).  Everything lives under ``--base-path``.
Request framing, deadlines and error bodies are the shared edge's
(:class:`~nsqd_threaded.server.http_server.HTTPServer`).

An action (a POST or DELETE under ``/api/``) is refused when a browser sends
it from a page of another origin (``Origin``, or lacking it ``Referer``: 403
``CROSS_ORIGIN_FORBIDDEN``) and when it carries a body that is not declared
``application/json`` (415 ``CONTENT_TYPE_NOT_JSON``): an HTML form can send
neither from another site, and a script needs a CORS preflight that
nsqadmin never grants.
"""

import functools
import ipaddress
import json

from ..internal import gocompat
from ..internal.logger import LOG_LEVELS
from ..server import http_server
from ..server.http_server import TEXT_TYPE, HTTPError, QueryError, Response, Router, ok_json, ok_text, parse_query
from ..settings.options import DURATION
from . import pages, peek, static
from .actions import Actions
from .api import AdminAPI, AdminError, Answer
from .options import SETTINGS

# config-file key -> Setting: what /config/:opt can name (Go: every option with a flag)
CONFIG_KEYS = {s.key: s for s in SETTINGS if s.field and s.key}

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
    ("GET", "/api/peek/:topic/:channel", "api_peek"),
    ("GET", "/api/charts/:topic", "api_charts"),
    ("GET", "/api/charts/:topic/:channel", "api_charts"),
    ("POST", "/api/topics", "api_create"),
    ("POST", "/api/topics/:topic", "api_topic_action"),
    ("POST", "/api/topics/:topic/:channel", "api_channel_action"),
    ("DELETE", "/api/nodes/:node", "api_tombstone"),
    ("DELETE", "/api/topics/:topic", "api_delete_topic"),
    ("DELETE", "/api/topics/:topic/:channel", "api_delete_channel"),
    ("GET", "/config/:opt", "config_get"),
    ("PUT", "/config/:opt", "config_put"),
)

CONFIG_BODY_LIMIT = 1 << 20  # Go nsqadmin reads a PUT /config body up to 1 MiB


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
        return self._page(self.pages.channel, topic, channel, self.may_peek(request), self.actions.is_admin(request))

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
        bodies = self.admin.options.inside_view_bodies and self.actions.is_admin(request)
        return ok_json(self.api.node_state(node, bodies=bodies, topic=self._query(request).get("topic", "")))

    def may_peek(self, request):
        """Peeked bodies are for admins only: ``--admin-user`` given and the ACL header naming one."""
        return bool(self.admin.options.admin_users) and self.actions.is_admin(request)

    def api_peek(self, request, topic, channel):
        """(ours) a channel's next messages on each node (:mod:`.peek`): an admin's, same-origin read."""
        if http_server.is_cross_origin(request, referer=True):
            raise AdminError(403, "CROSS_ORIGIN_FORBIDDEN")
        if not self.may_peek(request):
            raise AdminError(403, "FORBIDDEN")
        doc, gathered = peek.channel_peek(self.admin, topic, channel)
        return self._json(Answer(doc, [gathered]))

    def api_counter(self, request):
        return self._json(self.api.counter())

    def api_charts(self, request, topic, channel=""):
        return ok_json(self.api.charts(topic, channel))

    # -- API actions (each first refuses a cross-site request)

    @staticmethod
    def _same_site(request):
        """403 for a browser's request from another origin; 415 for a body not declared as JSON."""
        if http_server.is_cross_origin(request, referer=True):
            raise AdminError(403, "CROSS_ORIGIN_FORBIDDEN")
        if request.method == "POST" or request.content_length != 0:  # None: a chunked body
            media_type = request.header("Content-Type").split(";")[0].strip().lower()
            if media_type != "application/json":
                raise AdminError(415, "CONTENT_TYPE_NOT_JSON")

    def api_create(self, request):
        self._same_site(request)
        return ok_json(self.actions.create(request))

    def api_topic_action(self, request, topic):
        self._same_site(request)
        return ok_json(self.actions.topic_channel_action(request, topic))

    def api_channel_action(self, request, topic, channel):
        self._same_site(request)
        return ok_json(self.actions.topic_channel_action(request, topic, channel))

    def api_delete_topic(self, request, topic):
        self._same_site(request)
        return ok_json(self.actions.delete_topic(request, topic))

    def api_delete_channel(self, request, topic, channel):
        self._same_site(request)
        return ok_json(self.actions.delete_channel(request, topic, channel))

    def api_tombstone(self, request, node):
        self._same_site(request)
        return ok_json(self.actions.tombstone(request, node))

    # -- /config/:opt (Go nsqadmin's): read any setting, change two

    def _config_allowed(self, request):
        cidr = self.admin.options.allow_config_from_cidr
        if not cidr:
            return
        try:
            ip = ipaddress.ip_address((request.client_address or ("",))[0].partition("%")[0])
        except ValueError:
            raise AdminError(400, "INVALID_REMOTE_ADDR") from None
        if getattr(ip, "ipv4_mapped", None) is not None:
            ip = ip.ipv4_mapped  # Go's net.IP holds both forms as one
        if ip not in ipaddress.ip_network(cidr, strict=False):
            raise AdminError(403, "FORBIDDEN")

    def config_get(self, request, opt):
        self._config_allowed(request)
        return self._config_value(opt)

    def config_put(self, request, opt):
        self._config_allowed(request)
        body = request.read_body(CONFIG_BODY_LIMIT, "INVALID_VALUE")
        if not body:
            raise AdminError(413, "INVALID_VALUE")
        if opt == "nsqlookupd_http_addresses":
            try:
                value = json.loads(body.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                raise AdminError(400, "INVALID_VALUE") from None
            if value is None:
                value = []  # Go's json.Unmarshal of null into a slice
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise AdminError(400, "INVALID_VALUE")
            self.admin.change_options(lookupd_http_addresses=value)
        elif opt == "log_level":
            level = body.decode("utf-8", "replace").lower()
            if level not in LOG_LEVELS:
                raise AdminError(400, "INVALID_VALUE")
            self.admin.change_options(log_level=level)
        else:
            raise AdminError(400, "INVALID_OPTION")
        return self._config_value(opt)

    def _config_value(self, opt):
        """A setting as Go shows it: strings as text, durations in ns, the log level as its number."""
        setting = CONFIG_KEYS.get(opt)
        if setting is None:
            raise AdminError(400, "INVALID_OPTION")
        value = getattr(self.admin.options, setting.field)
        if setting.field == "log_level":
            return ok_json(LOG_LEVELS[value])
        if setting.kind is DURATION:
            return ok_json(gocompat.ns(value))
        if isinstance(value, str):
            return ok_text(value)
        return ok_json(value)


class AdminHTTPServer(http_server.HTTPServer):
    """nsqadmin's HTTP listener: the shared edge serving one NSQAdmin's :class:`AdminRouter`."""

    def __init__(self, address, admin):
        opts = admin.options
        super().__init__(address, AdminRouter(admin), admin.log, opts.http_read_timeout, opts.http_idle_timeout,
                         "nsqadmin-http", log_requests=True)
