"""nsqd's HTTP API on port 4151: its routes, served by the shared edge in :mod:`.http_server`.

Routes, status codes, bodies and headers follow nsqd 1.3.  Handlers take a
request (method, path, query, body reader) and return a :class:`Response`.
"""

import dataclasses
import json
import re
import socket

from ..internal import gocompat
from ..wire import protocol_v2
from ..broker import stats
from ..broker.debug_state import broker_state
from ..broker.peek import BODY_ENCODINGS, PEEK_DEFAULT, PEEK_MAX, channel_messages, message_doc
from ..broker.auth import AuthError
from ..broker.channel import ChannelError
from ..broker.redrive import RedriveError
from . import auth_query
from .metrics import render_prometheus
from .time_skip import TimeSkipRoutes
from ..settings.options import DURATION_OPTIONS, INTERNAL_OPTIONS, LOG_LEVELS, MAX_ATTEMPTS_LIMIT, Options
from ..wire.protocol_v2 import ProtocolError
from . import http_server
from .http_server import (
    TEXT_TYPE,
    HTTPError,
    QueryError,
    Response,
    Router,
    ok_empty,
    ok_json,
    ok_text,
    parse_bool,
    parse_query,
)
from ..broker.topic import TopicError

# The header of a /debug/state request that carries an auth secret (a header, not
# the query: URLs end up in logs and browser histories).
AUTH_SECRET_HEADER = "X-NSQ-Auth-Secret"

# -- the API -----------------------------------------------------------------


class HTTPAPI(Router):
    """Route table and handlers for one NSQD.  Thread-safe: handlers only call NSQD."""

    def __init__(self, nsqd):
        self.nsqd = nsqd
        self.log = nsqd.log
        self.options = nsqd.options
        # path -> {method: handler}
        self.routes = {
            "/ping": {"GET": self.ping},
            "/info": {"GET": self.info},
            "/stats": {"GET": self.stats},
            "/metrics": {"GET": self.metrics},
            "/debug/state": {"GET": self.debug_state},
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
            "/channel/policy": {"GET": self.channel_policy, "POST": self.channel_policy},
            "/channel/redrive": {"POST": self.channel_redrive},
        }
        if self.options.channel_peek:
            self.routes["/channel/peek"] = {"GET": self.channel_peek}
        if self.options.time_skipping:  # (not in Go nsqd: without the flag these paths are 404)
            self.routes.update(TimeSkipRoutes(nsqd).routes())
            self.routes["/debug/sync"] = {"POST": self.debug_sync}  # the crash tests' barrier (BrokerCore.sync)
        self._lower_paths = {p.lower(): p for p in self.routes}

    def _methods(self, path):
        """The {method: handler} of a routed path, or None."""
        methods = self.routes.get(path)
        if methods is None and path.startswith("/config/") and path.count("/") == 2 and len(path) > 8:
            methods = {"GET": self.config_get, "PUT": self.config_put}
        return methods

    def _canonical(self, path):
        """httprouter's case-insensitive lookup: the registered spelling of ``path``, or None."""
        lower = path.lower()
        if lower in self._lower_paths:
            return self._lower_paths[lower]
        if lower.startswith("/config/") and self._methods("/config/" + path[8:]):
            return "/config/" + path[8:]  # the :opt segment keeps its case
        return None

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
        if validate and not protocol_v2.is_valid_name(name):
            raise HTTPError(400, invalid)
        return name, q

    def _channel_args(self, request):
        q = self._query(request)
        topic = q.get("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not protocol_v2.is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = q.get("channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not protocol_v2.is_valid_name(channel):
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

    def _topic(self, name):
        """Get or create a topic; an exiting broker answers 503 EXITING."""
        try:
            return self.nsqd.get_topic(name)
        except TopicError:
            raise HTTPError(503, "EXITING") from None

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
        options = self.options
        doc = {
            "version": options.version,
            "broadcast_address": options.broadcast_address,
            "hostname": socket.gethostname(),
            # -1 for a unix socket, 0 for HTTP disabled, as Go
            "http_port": _info_port(self.nsqd.http_address, self.nsqd.http_port),
            "tcp_port": _info_port(self.nsqd.tcp_address, self.nsqd.tcp_port),
            "start_time": int(self.nsqd.start_time),
            "max_heartbeat_interval": gocompat.ns(options.max_heartbeat_interval),
            "max_output_buffer_size": options.max_output_buffer_size,
            "max_output_buffer_timeout": gocompat.ns(options.max_output_buffer_timeout),
            "max_deflate_level": options.max_deflate_level,
            "topology_zone": options.topology_zone,
            "topology_region": options.topology_region,
        }
        return ok_json(doc)

    def pub(self, request):
        max_size = self.options.max_msg_size
        body = request.read_body(max_size, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        name, q = self._topic_arg(request)
        topic = self._topic(name)
        defer_ns = 0
        if "defer" in q:
            # Go's strconv.ParseInt(s, 10, 64): ASCII digits with an optional sign.
            if not _GO_INT.fullmatch(q["defer"]):
                raise HTTPError(400, "INVALID_DEFER")
            defer_ms = int(q["defer"], 10)
            if not 0 <= defer_ms <= int(self.options.max_req_timeout * 1000):
                raise HTTPError(400, "INVALID_DEFER")
            defer_ns = defer_ms * 1000000
        self._publish(topic, [body], defer_ns)
        return ok_text("OK")

    def mpub(self, request):
        max_body = self.options.max_body_size
        request.check_length(max_body, "BODY_TOO_BIG")  # before the query checks, as in nsqd
        name, q = self._topic_arg(request)
        topic = self._topic(name)
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
                if len(line) > self.options.max_msg_size:
                    raise HTTPError(413, "MSG_TOO_BIG")
                bodies.append(line)
        if bodies:
            self._publish(topic, bodies)
        return ok_text("OK")

    def _mpub_binary(self, body):
        try:
            if len(body) < 4:
                raise ProtocolError("E_BAD_BODY", "MPUB failed to read message count")
            count = protocol_v2.decode_size(body[:4])
            protocol_v2.check_mpub_count(count, self.options.max_body_size)
            bodies = []
            pos = protocol_v2.parse_mpub_messages(body, 4, len(body), 0, count, self.options.max_msg_size, bodies)
            if len(bodies) < count:
                raise ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")
            del pos
            return bodies
        except ProtocolError as e:
            raise HTTPError(413, e.code[2:]) from None

    def stats(self, request):
        q = self._query(request)
        as_json = q.get("format") == "json"
        poller = self.nsqd.net_poller()
        doc = stats.collect(
            self.nsqd,
            topic_name=q.get("topic"),
            channel_name=q.get("channel"),
            include_clients=parse_bool(q.get("include_clients"), True),
            include_mem=parse_bool(q.get("include_mem"), True),
            as_json=as_json,
            # (the walk waits while the poller serves: its clients' turns come first)
            yield_to=None if poller is None else poller.serving,
        )
        if as_json:
            return ok_json(doc)
        return ok_text(stats.render_text(doc, self.nsqd))

    def metrics(self, request):
        doc = stats.collect(self.nsqd, include_clients=True, include_mem=True)
        body = render_prometheus(doc, self.nsqd).encode()
        return Response(200, body, [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")])

    def debug_state(self, request):
        """The inside of this broker (not in Go nsqd): topics, channels, in-flight, threads.

        Message bodies only with ``?bodies=true`` on a broker run with
        ``--debug-state-bodies``, and with ``--auth-http-address`` only where
        the ``X-NSQ-Auth-Secret`` header's secret is granted ``subscribe``.
        """
        q = self._query(request)
        bodies = None
        if parse_bool(q.get("bodies"), False) and self.options.debug_state_bodies:
            bodies = self._body_grant(request)
        doc = broker_state(self.nsqd, bodies=bodies)
        return ok_json(None, json.dumps(doc, separators=(",", ":")))

    def _body_grant(self, request):
        """Who may read bodies here: ``grant(topic, channel)``, or None for nobody.

        Without auth servers, the operator's flag is the whole decision.  With
        them, the request's secret is asked about once (as a TCP AUTH would
        be): a channel's messages need ``subscribe`` on that topic and channel,
        the topic's own queue ``subscribe`` on the topic for some channel.
        """
        if not self.options.auth_http_addresses:
            return lambda topic, channel: True
        secret = request.header(AUTH_SECRET_HEADER)
        if not secret:
            return None
        try:
            state = auth_query.query_any(self.options, request.client_address[0], request.tls, secret,
                                         log=self.log)
        except AuthError as e:
            self.log.warn("HTTP: /debug/state bodies refused to %s - %s", request.client_address[0], e)
            return None
        return lambda topic, channel: state.is_allowed(topic, channel) if channel else state.may_subscribe(topic)

    def debug_sync(self, request):
        """``POST /debug/sync`` (test brokers, with ``--time-skipping``): :meth:`BrokerCore.sync`, then
        ``{"synced": true}``; 500 ``SYNC_FAILED`` when an fsync failed, 503 ``SYNC_TIMEOUT`` when the
        topics' pumps did not catch up."""
        try:
            ok = self.nsqd.sync()
        except TimeoutError:
            raise HTTPError(503, "SYNC_TIMEOUT") from None
        if not ok:
            raise HTTPError(500, "SYNC_FAILED")
        return ok_json({"synced": True})

    def channel_peek(self, request):
        """A channel's next ``n`` messages in delivery order, consuming nothing (not in Go nsqd).

        Served only with ``--channel-peek`` (otherwise 404, as Go).  ``body=base64``
        carries whole bodies instead of /debug/state's preview.  With
        ``--auth-http-address`` the ``X-NSQ-Auth-Secret`` header's secret must be
        granted ``subscribe`` on the topic and channel.
        """
        topic_name, channel_name = self._channel_args(request)
        q = self._query(request)
        n = PEEK_DEFAULT
        if "n" in q:
            if not _GO_INT.fullmatch(q["n"]) or not 0 < int(q["n"], 10) <= PEEK_MAX:
                raise HTTPError(400, "INVALID_N")
            n = int(q["n"], 10)
        encoding = q.get("body", BODY_ENCODINGS[0])
        if encoding not in BODY_ENCODINGS:
            raise HTTPError(400, "INVALID_BODY")
        self._peek_grant(request, topic_name, channel_name)
        _, channel = self._existing_channel(request)
        now_ns = self.nsqd.clock.time_ns()  # (the due times' clock: what a reader's due_in counts from)
        doc = {"now_ns": now_ns, "messages": [message_doc(m, encoding) for m in channel_messages(channel, n)]}
        return ok_json(None, json.dumps(doc, separators=(",", ":")))

    def _peek_grant(self, request, topic, channel):
        """Under auth, the request's secret must be granted ``subscribe`` on ``topic``/``channel``
        (HTTPError 401 AUTH_REQUIRED, 403 AUTH_FAILED or 403 UNAUTHORIZED otherwise)."""
        if not self.options.auth_http_addresses:
            return
        secret = request.header(AUTH_SECRET_HEADER)
        if not secret:
            raise HTTPError(401, "AUTH_REQUIRED")
        try:
            state = auth_query.query_any(self.options, request.client_address[0], request.tls, secret,
                                         log=self.log)
        except AuthError as e:
            self.log.warn("HTTP: /channel/peek refused to %s - %s", request.client_address[0], e)
            raise HTTPError(403, "AUTH_FAILED") from None
        if not state.is_allowed(topic, channel):
            raise HTTPError(403, "UNAUTHORIZED")

    def channel_redrive(self, request):
        """Not in Go nsqd: move up to ``n`` (default all) messages from the head of a channel (of a
        dead-letter topic) back to each one's source topic, or to ``to``; answers ``{"moved": N}``.

        Every argument is checked before anything moves.  With ``--auth-http-address`` the
        ``X-NSQ-Auth-Secret`` header's secret must be granted ``subscribe`` on the channel (as a peek)
        and ``publish`` on every destination (as a publish there).  A stop part-way (a message
        without provenance and no ``to``, a destination not granted, a broker exiting) answers the
        error with what moved so far in the log; what was not moved is back in the channel, in order.
        """
        topic_name, channel_name = self._channel_args(request)
        q = self._query(request)
        if set(q) - _REDRIVE_ARGS:
            raise HTTPError(400, "INVALID_ARG")
        n = None
        if "n" in q:
            if not _GO_INT.fullmatch(q["n"]) or int(q["n"], 10) <= 0:
                raise HTTPError(400, "INVALID_N")
            n = int(q["n"], 10)
        to = q.get("to", "")
        if "to" in q and (not protocol_v2.is_valid_name(to) or to == topic_name or to.endswith("#ephemeral")):
            raise HTTPError(400, "INVALID_TO")  # (its own topic: a loop; an ephemeral one may vanish at once)
        allowed = self._redrive_grant(request, topic_name, channel_name)
        if allowed is not None and to and not allowed(to):
            raise HTTPError(403, "UNAUTHORIZED")
        _, channel = self._existing_channel(request)
        try:
            moved = self.nsqd.redrive(channel, n, to, allowed)
        except RedriveError as e:
            if e.moved:
                self.log.info("CHANNEL(%s:%s): redrove %d messages, then stopped - %s", topic_name, channel_name,
                              e.moved, e.code)
            raise HTTPError(503 if e.code == "EXITING" else 403 if e.code == "UNAUTHORIZED" else 400,
                            e.code) from None
        return ok_json({"moved": moved})

    def _redrive_grant(self, request, topic, channel):
        """Without auth servers None (anyone may); otherwise the secret must be granted ``subscribe`` on
        ``topic``/``channel`` (HTTPError as :meth:`_peek_grant`), and the answer is whether it may
        publish to a topic."""
        if not self.options.auth_http_addresses:
            return None
        secret = request.header(AUTH_SECRET_HEADER)
        if not secret:
            raise HTTPError(401, "AUTH_REQUIRED")
        try:
            state = auth_query.query_any(self.options, request.client_address[0], request.tls, secret,
                                         log=self.log)
        except AuthError as e:
            self.log.warn("HTTP: /channel/redrive refused to %s - %s", request.client_address[0], e)
            raise HTTPError(403, "AUTH_FAILED") from None
        if not state.is_allowed(topic, channel):
            raise HTTPError(403, "UNAUTHORIZED")
        return lambda destination: state.is_allowed(destination)

    def topic_create(self, request):
        name, _ = self._topic_arg(request)
        self._topic(name)
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
        self.nsqd.wait_metadata()  # answered once nsqd.dat lists it
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

    def channel_policy(self, request):
        """Not in Go nsqd: read (GET) or set (POST) a channel's own delivery policy (docs/policies.md).

        A field given is the channel's own (0 and "" included: unlimited, no TTL, drop); one named in
        ``inherit`` goes back to the broker's default; the others stay as they were.  Every given field
        is checked before any is set: bad input changes nothing.
        """
        topic, channel = self._existing_channel(request)
        if request.method == "POST":
            q = self._query(request)
            if set(q) - _POLICY_ARGS:  # a misspelt field (max_attempt=5) must not answer 200 and change nothing
                raise HTTPError(400, "INVALID_ARG")
            inherit = set(filter(None, q.get("inherit", "").split(",")))
            # (a field both set and inherited is ambiguous, an unknown one misspelt)
            if inherit - set(_POLICY_FIELDS) or inherit & set(q):
                raise HTTPError(400, "INVALID_ARG")
            own = channel.own_policy()
            if "max_attempts" in q:
                own = own._replace(max_attempts=_policy_max_attempts(q["max_attempts"]))
            if "msg_ttl" in q:
                own = own._replace(msg_ttl_ns=_policy_msg_ttl(q["msg_ttl"]))
            if "dead_letter_topic" in q:
                name = q["dead_letter_topic"]
                # (an ephemeral topic vanishes with its last consumer, and what was moved there with it)
                if name and (not protocol_v2.is_valid_name(name) or name == topic.name or name.endswith("#ephemeral")):
                    raise HTTPError(400, "INVALID_TOPIC")
                own = own._replace(dead_letter_topic=name)
            own = own._replace(**{_POLICY_FIELDS[field]: None for field in inherit})
            if own != channel.own_policy():
                channel.set_policy(own)
                self.log.info("CHANNEL(%s:%s): policy max_attempts=%s dead_letter_topic=%s msg_ttl=%s", topic.name,
                              channel.name, _own_text(own.max_attempts), _own_text(own.dead_letter_topic, '""'),
                              _own_text(own.msg_ttl_ns, None, gocompat.format_duration_ns))
                self.nsqd.persist_metadata()
        return ok_json(channel.own_policy().as_json())

    # -- /config/:opt --------------------------------------------------------

    def config_get(self, request):
        name = request.path[len("/config/") :]
        value = self._config_value(name)
        if isinstance(value, str):
            return ok_text(value)
        return ok_json(value)

    def config_put(self, request):
        name = request.path[len("/config/") :]
        max_size = self.options.max_msg_size
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

    def _config_value(self, name):
        """An option as /config shows it: durations in ns, the log level as its number."""
        options = self.options
        key = {"id": "node_id"}.get(name, name)
        if name == "node_id" or key in INTERNAL_OPTIONS or key not in _OPTION_FIELDS:
            raise HTTPError(400, "INVALID_OPTION")
        value = getattr(options, key)
        if key in DURATION_OPTIONS:
            return gocompat.ns(value)
        if key == "log_level":
            return LOG_LEVELS[value.lower()]
        if key == "broadcast_tcp_port" and value == 0:
            return self.nsqd.tcp_port or 0  # 0 on a unix socket, as Go
        if key == "broadcast_http_port" and value == 0:
            return self.nsqd.http_port or 0
        if key == "statsd_prefix":
            return self._statsd_prefix()
        return value

    def _statsd_prefix(self):
        """--statsd-prefix as nsqd expands it at startup (the keys the statsd thread sends)."""
        return self.nsqd.statsd_prefix()


def _info_port(address, port):
    """/info's port of a listener: its port, -1 on a unix socket, 0 when it is off."""
    if address is None:
        return 0
    return -1 if port is None else port


_OPTION_FIELDS = frozenset(f.name for f in dataclasses.fields(Options))


_GO_INT = re.compile(r"[+-]?[0-9]+")


def _policy_max_attempts(text):
    """``max_attempts``: a decimal integer in [0, 65535] (empty or 0: unlimited, the channel's own)."""
    if text == "":
        return 0
    if not _GO_INT.fullmatch(text) or not 0 <= int(text, 10) <= MAX_ATTEMPTS_LIMIT:
        raise HTTPError(400, "INVALID_MAX_ATTEMPTS")
    return int(text, 10)


# The fields of a policy as the route names them (and ``inherit`` lists them): the Policy's field.
_POLICY_FIELDS = {"max_attempts": "max_attempts", "dead_letter_topic": "dead_letter_topic", "msg_ttl": "msg_ttl_ns"}

_POLICY_ARGS = frozenset(("topic", "channel", "inherit", *_POLICY_FIELDS))
_REDRIVE_ARGS = frozenset(("topic", "channel", "to", "n"))


def _own_text(value, empty=None, text=str):
    """A field of a channel's own policy in the log: ``inherit`` when it inherits the default."""
    if value is None:
        return "inherit"
    return empty if empty is not None and value == "" else text(value)


def _policy_msg_ttl(text):
    """``msg_ttl``: a Go duration, or a whole number of milliseconds (what GET answers, so that it POSTs
    back unchanged); 0 (no TTL, the channel's own) or at least 1ms (empty: 0) -> nanoseconds, in whole milliseconds (what the
    answer, /stats and nsqd.dat show is what applies)."""
    if text == "":
        return 0
    try:
        if _GO_INT.fullmatch(text) and not text.startswith(("-", "+")):
            ttl_ns = int(text, 10) * 1000000
        else:
            ttl_ns = gocompat.parse_duration_ns(text)
    except ValueError:
        raise HTTPError(400, "INVALID_MSG_TTL") from None
    if ttl_ns != 0 and ttl_ns < 1000000:
        raise HTTPError(400, "INVALID_MSG_TTL")
    return ttl_ns - ttl_ns % 1000000


class TLSRequiredAPI:
    """The plain HTTP listener's answer to everything under --tls-required=true."""

    def __init__(self, nsqd):
        self.nsqd = nsqd

    def dispatch(self, request):
        https = self.nsqd.https_address
        # nsqd writes this body by hand (spaces after the colons).
        body = ('{"message": "TLS_REQUIRED", "https_port": %d}' % (https[1] if https else 0)).encode()
        return http_server.Response(403, body, [("Content-Type", http_server.JSON_TYPE), http_server.X_NSQ])


class NSQDHTTPServer(http_server.HTTPServer):
    """nsqd's HTTP listener (or, with ``ssl_context``, its HTTPS one): the shared edge serving this NSQD's :class:`HTTPAPI`."""

    def __init__(self, address, nsqd, ssl_context=None):
        options = nsqd.options
        if ssl_context is None and options.tls_required == 2:
            api, name = TLSRequiredAPI(nsqd), "nsqd-http"
        else:
            api, name = HTTPAPI(nsqd), "nsqd-https" if ssl_context is not None else "nsqd-http"
        super().__init__(address, api, nsqd.log, options.http_read_timeout, options.http_idle_timeout, name,
                         ssl_context=ssl_context)
