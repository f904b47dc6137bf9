"""nsqlookupd's HTTP API (port 4161): its routes, served by the broker's HTTP edge.

Routes, bodies, status codes and headers are nsqlookupd 1.3's, including its
router's 404/405/301/307 answers (:class:`~nsqd_threaded.server.http_server.Router`).
Request framing, deadlines and error bodies are the broker's
(:class:`~nsqd_threaded.server.http_server.HTTPServer`).  nsqlookupd reads no
request bodies: the edge skips a small one and closes after a large one.
"""

from ..wire.protocol_v2 import is_valid_name
from ..server import http_server
from ..server.http_server import TEXT_TYPE, HTTPError, QueryError, Response, Router, ok_empty, ok_json, parse_query
from ..server.time_skip import TimeSkipRoutes
from .registration_db import Registration, filter_active


class LookupdHTTPAPI(Router):
    """Route table and handlers for one NSQLookupd.  Thread-safe: handlers only call the RegistrationDB."""

    def __init__(self, lookupd):
        self.lookupd = lookupd
        self.log = lookupd.log
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
        if lookupd.options.time_skipping:  # (not in Go nsqlookupd: without the flag these paths are 404)
            self.routes.update(TimeSkipRoutes(lookupd).routes())
        self._lower_paths = {p.lower(): p for p in self.routes}

    # -- helpers ------------------------------------------------------------------

    @staticmethod
    def _params(request):
        try:
            return parse_query(request.query)
        except QueryError:
            raise HTTPError(400, "INVALID_REQUEST") from None

    def _topic(self, request):
        q = self._params(request)
        topic = q.get("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        return topic, q

    def _topic_channel(self, request):
        topic, q = self._topic(request)
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = q.get("channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    # -- handlers -------------------------------------------------------------------

    def ping(self, request):
        return Response(200, b"OK", [("Content-Type", TEXT_TYPE)])

    def info(self, request):
        return ok_json({"version": self.lookupd.version})

    def topics(self, request):
        return ok_json({"topics": [r.key for r in self.db.find_registrations("topic", "*", "")]})

    def channels(self, request):
        topic, _ = self._topic(request)
        return ok_json({"channels": [r.subkey for r in self.db.find_registrations("channel", topic, "*")]})

    def lookup(self, request):
        topic, _ = self._topic(request)
        db = self.db
        if not db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        channels = [r.subkey for r in db.find_registrations("channel", topic, "*")]
        options = self.lookupd.options
        producers = filter_active(
            db.find_producers("topic", topic, ""), options.inactive_producer_timeout, options.tombstone_lifetime,
            db.clock.monotonic(),
        )
        return ok_json({"channels": channels, "producers": [p.peer.to_json() for p in producers]})

    def nodes(self, request):
        options = self.lookupd.options
        nodes = []
        for peer, topics, tombstones in self.db.nodes(options.inactive_producer_timeout, options.tombstone_lifetime):
            node = peer.to_json()
            node["tombstones"] = tombstones
            node["topics"] = topics
            nodes.append(node)
        return ok_json({"producers": nodes})

    def debug(self, request):
        return ok_json(self.db.debug())

    def topic_create(self, request):
        topic, _ = self._topic(request)
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        self.lookupd.log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return ok_empty()

    def topic_delete(self, request):
        topic, _ = self._topic(request)  # not validated, so "*" deletes every topic, as in nsqlookupd
        db, log = self.db, self.lookupd.log
        for reg in db.find_registrations("channel", topic, "*"):
            log.info("DB: removing channel(%s) from topic(%s)", reg.subkey, topic)
            db.remove_registration(reg)
        for reg in db.find_registrations("topic", topic, ""):
            log.info("DB: removing topic(%s)", topic)
            db.remove_registration(reg)
        return ok_empty()

    def topic_tombstone(self, request):
        topic, q = self._topic(request)
        node = q.get("node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        self.lookupd.log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        self.db.tombstone(topic, node)
        return ok_empty()

    def channel_create(self, request):
        topic, channel = self._topic_channel(request)
        log = self.lookupd.log
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(Registration("channel", topic, channel))
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return ok_empty()

    def channel_delete(self, request):
        topic, channel = self._topic_channel(request)
        regs = self.db.find_registrations("channel", topic, channel)
        if not regs:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        self.lookupd.log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for reg in regs:
            self.db.remove_registration(reg)
        return ok_empty()


class LookupdHTTPServer(http_server.HTTPServer):
    """nsqlookupd's HTTP listener: the shared edge serving this NSQLookupd's :class:`LookupdHTTPAPI`.

    Every request is logged at INFO, as nsqlookupd does.
    """

    def __init__(self, address, lookupd):
        options = lookupd.options
        super().__init__(address, LookupdHTTPAPI(lookupd), lookupd.log, options.http_read_timeout,
                         options.http_idle_timeout, "nsqlookupd-http", log_requests=True)
