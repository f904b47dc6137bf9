"""nsqadmin's actions: create, pause/unpause, empty, delete, tombstone, a channel's policy, a redrive;
who may act; who is told.

Each action is Go nsqadmin's: the same lookupd and nsqd requests in the same
order (producers are found *before* a delete, since the delete makes them
forget the topic).  Setting a channel's policy (ours: ``{"action":
"set_policy"}``) POSTs the broker's ``/channel/policy`` to every node that has
the channel, and a redrive (``{"action": "redrive"}``) the broker's
``/channel/redrive``.  With ``--admin-user``, only a request whose
``--acl-http-header`` names an admin may act (403 ``FORBIDDEN`` otherwise).
With ``--notification-http-endpoint`` every action is POSTed there as Go's
AdminAction JSON, by the :class:`Notifier` thread, so an action never waits
on the endpoint.
"""

import base64
import json
import queue
import socket
import threading
import time
import urllib.parse

from . import cluster
from ..internal import gocompat
from ..wire.protocol_v2 import is_valid_name
from .api import AdminError, body_string, check_channel, check_topic, read_json_body

NOTIFICATION_QUEUE = 100  # actions waiting for the endpoint; more are dropped (and logged)
MAX_ATTEMPTS_LIMIT = 65535  # a message's attempts are a uint16 on the wire
MAX_MSG_TTL_MS = ((1 << 63) - 1) // 1000000  # the longest Go Duration, in milliseconds
POLICY_FIELD_NAMES = ("max_attempts", "dead_letter_topic", "msg_ttl")  # what set_policy's inherit may name


def basic_auth_user(headers):
    value = (headers.get("Authorization") if headers is not None else None) or ""
    scheme, _, token = value.partition(" ")
    if scheme != "Basic":
        return ""
    try:
        user, sep, _ = base64.b64decode(token, validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return ""
    return user if sep else ""


def admin_action(action, topic, channel, node, request, via):
    """Go nsqadmin's AdminAction document for an action done by ``request``."""
    headers = request.headers
    host = (headers.get("Host") if headers is not None else None) or ""
    scheme = "https" if headers is not None and headers.get("X-Scheme") == "https" else "http"
    url = urllib.parse.urlunsplit((scheme, host, urllib.parse.quote(request.path), request.query, ""))
    doc = {"action": action, "topic": topic}
    if channel:
        doc["channel"] = channel
    if node:
        doc["node"] = node
    doc["timestamp"] = int(time.time())
    user = basic_auth_user(headers)
    if user:
        doc["user"] = user
    addr = request.client_address or ("", 0)
    doc["remote_ip"] = "%s:%s" % (addr[0], addr[1])
    doc["user_agent"] = (headers.get("User-Agent") if headers is not None else None) or ""
    doc["url"] = url
    doc["via"] = via
    return doc


class Notifier:
    """Posts admin actions to the notification endpoint from one thread, ``nsqadmin-notify``.

    :meth:`stop` lets it finish what is queued (each post bounded by the
    HTTP client timeouts), then joins it.
    """

    _STOP = object()

    def __init__(self, endpoint, client, log):
        if "://" not in endpoint:
            endpoint = "http://" + endpoint
        self.endpoint = endpoint
        self.client = client
        self.log = log
        self._queue = queue.Queue(NOTIFICATION_QUEUE)
        self._thread = threading.Thread(target=self._run, name="nsqadmin-notify")

    def start(self):
        self._thread.start()

    def notify(self, doc):
        try:
            self._queue.put_nowait(doc)
        except queue.Full:
            self.log.warn("notification queue full: dropped %s", doc["action"])

    def stop(self):
        self._queue.put(self._STOP)
        self._thread.join()

    def _run(self):
        split = urllib.parse.urlsplit(self.endpoint)
        address = split.netloc
        if ":" not in address.rpartition("]")[2]:
            address += ":443" if split.scheme == "https" else ":80"
        path = (split.path or "/") + ("?" + split.query if split.query else "")
        while True:
            doc = self._queue.get()
            if doc is self._STOP:
                return
            body = json.dumps(doc, separators=(",", ":")).encode()
            try:
                self.client.request("POST", address, path, body, https=split.scheme == "https")
            except (cluster.UpstreamError, socket.error) as e:
                self.log.error("failed to POST notification - %s", e)


class Actions:
    """The actions of one NSQAdmin: each checks the ACL, acts, notifies, and answers ``{"message": ...}``."""

    def __init__(self, admin):
        self.admin = admin
        self.ci = admin.cluster

    def is_admin(self, request):
        """True when the request may act: no ``--admin-user`` given, or its ACL header names one."""
        options = self.admin.options  # one reference: PUT /config replaces the object
        if not options.admin_users:
            return True
        user = request.headers.get(options.acl_http_header) if request.headers is not None else None
        return user in options.admin_users

    def authorize(self, request):
        if not self.is_admin(request):
            raise AdminError(403, "FORBIDDEN")

    def _notify(self, action, topic, channel, node, request):
        notifier = self.admin.notifier
        if notifier is not None:
            notifier.notify(admin_action(action, topic, channel, node, request, self.admin.hostname))

    def _done(self, *gathered):
        messages = cluster.partial_messages(*gathered)
        return {"message": cluster.warning(messages)}

    def _producers_first(self, topic):
        return self.ci.topic_producers(topic)

    # -- /api/topics POST

    def create(self, request):
        self.authorize(request)
        doc = read_json_body(request)
        topic, channel = body_string(doc, "topic"), body_string(doc, "channel")
        check_topic(topic)
        if channel:
            check_channel(channel)
        gathered = []
        if self.ci.lookupds:
            gathered.append(self.ci.lookupd_post("/topic/create?topic=" + cluster.quote(topic)))
            if channel:
                gathered.append(self.ci.lookupd_post("/channel/create?topic=%s&channel=%s"
                                                     % (cluster.quote(topic), cluster.quote(channel))))
                producers, g = self.ci.lookupd_topic_producers(topic)
                gathered.append(self.ci.producers_post(producers, "/channel/create?topic=%s&channel=%s"
                                                       % (cluster.quote(topic), cluster.quote(channel))))
        else:  # no lookupd to remember it: create it on every nsqd given
            producers, g = self.ci.nsqd_producers()
            gathered.append(g)
            gathered.append(self.ci.producers_post(producers, "/topic/create?topic=" + cluster.quote(topic)))
            if channel:
                gathered.append(self.ci.producers_post(producers, "/channel/create?topic=%s&channel=%s"
                                                       % (cluster.quote(topic), cluster.quote(channel))))
        self._raise_if_all_failed(gathered)
        self._notify("create_topic", topic, "", "", request)
        if channel:
            self._notify("create_channel", topic, channel, "", request)
        return self._done(*gathered)

    # -- /api/topics/T and /api/topics/T/C POST {"action": ...}

    def topic_channel_action(self, request, topic, channel=""):
        self.authorize(request)
        doc = read_json_body(request)
        action = body_string(doc, "action")
        if action == "set_policy" and channel:
            return self.set_policy(request, topic, channel, doc)
        if action == "redrive" and channel:
            return self.redrive(request, topic, channel, doc)
        if action not in ("pause", "unpause", "empty"):
            raise AdminError(400, "INVALID_ACTION")
        producers, g = self._producers_first(topic)
        if channel:
            path = "/channel/%s?topic=%s&channel=%s" % (action, cluster.quote(topic), cluster.quote(channel))
        else:
            path = "/topic/%s?topic=%s" % (action, cluster.quote(topic))
        done = self.ci.producers_post(producers, path)
        self._raise_if_all_failed([g, done])
        self._notify("%s_%s" % (action, "channel" if channel else "topic"), topic, channel, "", request)
        return self._done(g, done)

    # -- /api/topics/T/C POST {"action": "set_policy", ...} (ours)

    def set_policy(self, request, topic, channel, doc):
        """Set the given policy fields of a channel on every node that has it (the others stay as they are)."""
        query = [("topic", topic), ("channel", channel)] + policy_query(doc, topic)
        producers, g = self._producers_first(topic)
        # A lookupd's 404 says it knows no such topic: an answer, not a failure (a policy is set where the
        # channel is, so no node having it is a 404 here, never a 200 with a partial-failure warning).
        g = _without_not_found(g)
        if not producers and not g.errors:
            raise AdminError(404, "TOPIC_NOT_FOUND")
        per_node, g2 = self.ci.nsqd_stats(producers, topic, clients=False)
        having = {c["node"] for t in per_node for c in t["channels"] if c["channel_name"] == channel}
        targets = [p for p in producers if cluster.http_address(p) in having]
        if not targets and not g.errors and not g2.errors:
            raise AdminError(404, "CHANNEL_NOT_FOUND")
        done = self.ci.producers_post(targets, "/channel/policy?" + urllib.parse.urlencode(query))
        if done.errors and not done.results and all(e.status == 404 for e in done.errors.values()):
            raise AdminError(404, "CHANNEL_NOT_FOUND")  # (deleted on every node meanwhile)
        self._raise_if_all_failed([done])  # not one node took it: an error, not a warning
        self._notify("set_channel_policy", topic, channel, "", request)
        return self._done(g, g2, done)

    # -- /api/topics/T/C POST {"action": "redrive"[, "to": TOPIC][, "n": N]} (ours)

    def redrive(self, request, topic, channel, doc):
        """Send a dead-letter channel's messages back (the broker's ``/channel/redrive``) on every node that
        has the channel: up to ``n`` on each (absent: all), to each one's source topic or ``to``.
        Answers the total moved beside the message."""
        query = [("topic", topic), ("channel", channel)] + redrive_query(doc, topic)
        producers, g = self._producers_first(topic)
        g = _without_not_found(g)  # (as set_policy: a topic nobody knows is a 404, not a 200 with a warning)
        if not producers and not g.errors:
            raise AdminError(404, "TOPIC_NOT_FOUND")
        per_node, g2 = self.ci.nsqd_stats(producers, topic, clients=False)
        having = {c["node"] for t in per_node for c in t["channels"] if c["channel_name"] == channel}
        targets = [p for p in producers if cluster.http_address(p) in having]
        if not targets and not g.errors and not g2.errors:
            raise AdminError(404, "CHANNEL_NOT_FOUND")
        done = self.ci.producers_post(targets, "/channel/redrive?" + urllib.parse.urlencode(query))
        if done.errors and not done.results and all(e.status == 404 for e in done.errors.values()):
            raise AdminError(404, "CHANNEL_NOT_FOUND")  # (deleted on every node meanwhile)
        self._raise_if_all_failed([done])  # not one node moved any: an error, not a warning
        self._notify("redrive_channel", topic, channel, "", request)
        answer = self._done(g, g2, done)
        answer["moved"] = sum(_moved(text) for text in done.results.values())
        return answer

    # -- DELETE /api/topics/T and /api/topics/T/C

    def delete_topic(self, request, topic):
        self.authorize(request)
        producers, g = self._producers_first(topic)
        gathered = [g]
        if self.ci.lookupds:
            gathered.append(self.ci.lookupd_post("/topic/delete?topic=" + cluster.quote(topic)))
        gathered.append(self.ci.producers_post(producers, "/topic/delete?topic=" + cluster.quote(topic)))
        self._raise_if_all_failed(gathered)
        self._notify("delete_topic", topic, "", "", request)
        return self._done(*gathered)

    def delete_channel(self, request, topic, channel):
        self.authorize(request)
        producers, g = self._producers_first(topic)
        gathered = [g]
        query = "topic=%s&channel=%s" % (cluster.quote(topic), cluster.quote(channel))
        if self.ci.lookupds:
            gathered.append(self.ci.lookupd_post("/channel/delete?" + query))
        gathered.append(self.ci.producers_post(producers, "/channel/delete?" + query))
        self._raise_if_all_failed(gathered)
        self._notify("delete_channel", topic, channel, "", request)
        return self._done(*gathered)

    # -- DELETE /api/nodes/N {"topic": T}

    def tombstone(self, request, node):
        self.authorize(request)
        doc = read_json_body(request, invalid="INVALID_BODY")
        topic = body_string(doc, "topic")
        check_topic(topic)
        query = "topic=%s&node=%s" % (cluster.quote(topic), cluster.quote(node))
        gathered = [self.ci.lookupd_post("/topic/tombstone?" + query)]
        producers, g = self.ci.lookupd_producers()
        gathered.append(g)
        producer = [p for p in producers if cluster.http_address(p) == node]
        if producer:
            gathered.append(self.ci.producers_post(producer, "/topic/delete?topic=" + cluster.quote(topic)))
        self._raise_if_all_failed(gathered)
        self._notify("tombstone_topic_producer", topic, "", node, request)
        return self._done(*gathered)

    @staticmethod
    def _raise_if_all_failed(gathered):
        errors = [e for g in gathered for e in g.errors.values()]
        results = sum(len(g.results) for g in gathered)
        if errors and not results:
            raise AdminError(502, "UPSTREAM_ERROR: %s" % "; ".join(str(e) for e in errors))


def redrive_query(doc, topic):
    """The broker's ``/channel/redrive`` arguments for a redrive action's body, checked: ``to`` a topic
    name other than the channel's own ("" or absent: each message's source), ``n`` a positive integer."""
    query = []
    to = doc.get("to", "")
    if not isinstance(to, str) or (to and (to == topic or not is_valid_name(to) or to.endswith("#ephemeral"))):
        raise AdminError(400, "INVALID_TO")
    if to:
        query.append(("to", to))
    if "n" in doc and doc["n"] is not None:
        n = doc["n"]
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise AdminError(400, "INVALID_N")
        query.append(("n", str(n)))
    return query


def _moved(text):
    """``moved`` of a node's ``/channel/redrive`` answer (0 when it is not that)."""
    try:
        doc = json.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return 0
    moved = doc.get("moved") if isinstance(doc, dict) else None
    return moved if isinstance(moved, int) and not isinstance(moved, bool) and moved >= 0 else 0


def _without_not_found(gathered):
    """``gathered`` without its 404 answers (a node or lookupd that does not know the topic)."""
    out = cluster.Gathered()
    out.results = gathered.results
    out.errors = {a: e for a, e in gathered.errors.items() if e.status != 404}
    return out


def policy_query(doc, topic):
    """The broker's ``/channel/policy`` arguments for the fields an action's body gives, checked.

    ``max_attempts`` is an integer (0: unlimited), ``dead_letter_topic`` a topic name other than the
    channel's own topic ("": none, drop), ``msg_ttl`` milliseconds or a Go duration ("30s"; 0: none): each
    the channel's own; ``inherit`` a list of those names that go back to the broker's default instead.
    """
    query = []
    inherit = doc.get("inherit", [])
    if (not isinstance(inherit, list) or not all(name in POLICY_FIELD_NAMES for name in inherit)
            or any(name in doc for name in inherit)):
        raise AdminError(400, "INVALID_INHERIT")
    if inherit:
        query.append(("inherit", ",".join(inherit)))
    if "max_attempts" in doc:
        n = doc["max_attempts"]
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_ATTEMPTS_LIMIT:
            raise AdminError(400, "INVALID_MAX_ATTEMPTS")
        query.append(("max_attempts", str(n)))
    if "dead_letter_topic" in doc:
        name = doc["dead_letter_topic"]
        if not isinstance(name, str) or (name and (name == topic or not is_valid_name(name))):
            raise AdminError(400, "INVALID_TOPIC")
        query.append(("dead_letter_topic", name))
    if "msg_ttl" in doc:
        ttl = doc["msg_ttl"]
        if isinstance(ttl, str):
            try:
                ns = gocompat.parse_duration_ns(ttl.strip()) if ttl.strip() else 0
            except ValueError:
                raise AdminError(400, "INVALID_MSG_TTL") from None
            if 0 < ns < 1000000:
                raise AdminError(400, "INVALID_MSG_TTL")  # the broker's shortest TTL is 1ms
            ttl = ns // 1000000
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 0 <= ttl <= MAX_MSG_TTL_MS:
            raise AdminError(400, "INVALID_MSG_TTL")
        query.append(("msg_ttl", "%dms" % ttl if ttl else "0"))
    return query
