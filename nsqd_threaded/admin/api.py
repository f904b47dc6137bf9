"""nsqadmin's JSON API: Go nsqadmin 1.3's ``/api/...`` routes, bodies, field names and errors.

Reads (:meth:`AdminAPI.topics` ...) return documents; the pages render the
same documents, so a page and ``curl /api/...`` never disagree.  A question
that some nodes failed to answer still answers, with ``message`` set to
``WARNING: ...`` (and the failed nodes in :attr:`Answer.failed`); one that no
node answered is ``502 UPSTREAM_ERROR``.
"""

import json

from ..wire.protocol_v2 import is_valid_name
from ..server.http_server import HTTPError, Response, X_NSQ, JSON_TYPE
from . import cluster
from .sampler import HOUR_STEP, SAMPLES


class AdminError(HTTPError):
    """An API error ``{"message": ...}`` with the message JSON-escaped (upstream texts carry quotes)."""

    def response(self):
        body = json.dumps({"message": self.message}, separators=(",", ":")).encode()
        return Response(self.status, body, [("Content-Type", JSON_TYPE), X_NSQ] + self.headers)


class Answer:
    """A read's document plus what the pages need besides it: the nodes that failed to answer."""

    def __init__(self, doc, gathered=()):
        self.doc = doc
        gathered = [g for g in gathered if g is not None]
        messages = cluster.partial_messages(*gathered)
        self.doc["message"] = cluster.warning(messages)
        self.failed = sorted({a for g in gathered for a in g.errors})
        self.errors = sorted({str(e) for g in gathered for e in g.errors.values()})


class TopicNotFound(AdminError):
    """Every lookupd said it does not know the topic: Go's ``502 UPSTREAM_ERROR`` on the API (its
    contract), a "not found" page in the UI (:mod:`.pages` catches this)."""


def _upstream(what, gathered):
    """502 when every node asked failed (Go: "failed to query any ...")."""
    if gathered.errors and not gathered.results:
        raise AdminError(502, "UPSTREAM_ERROR: failed to query any %s: %s"
                         % (what, "; ".join(str(e) for _, e in sorted(gathered.errors.items()))))


class AdminAPI:
    """The reads and actions of one NSQAdmin, as documents (the router turns them into responses)."""

    def __init__(self, admin):
        self.admin = admin
        self.ci = admin.cluster

    @property
    def _source(self):
        return "nsqlookupd" if self.ci.lookupds else "nsqd"

    # -- reads

    def topics(self, inactive=False):
        topics, g = self.ci.topics()
        _upstream(self._source, g)
        if not inactive:
            return Answer({"topics": topics}, [g])
        inactive_map = {}
        if self.ci.lookupds:
            for topic in topics:
                producers, _ = self.ci.lookupd_topic_producers(topic)
                if not producers:
                    inactive_map[topic] = self.ci.lookupd_topic_channels(topic)[0]
        return Answer({"topics": inactive_map}, [g])

    def _topic_producers(self, topic):
        producers, g = self.ci.topic_producers(topic)
        try:
            _upstream(self._source, g)
        except AdminError as e:
            if all(err.status == 404 for err in g.errors.values()):
                raise TopicNotFound(e.status, e.message) from None
            raise
        return producers, g

    def topic(self, topic):
        producers, g1 = self._topic_producers(topic)
        per_node, g2 = self.ci.nsqd_stats(producers, topic)
        _upstream("nsqd", g2)
        return Answer(cluster.cluster_topic_stats(topic, per_node), [g1, g2])

    def channel(self, topic, channel):
        producers, g1 = self._topic_producers(topic)
        per_node, g2 = self.ci.nsqd_stats(producers, topic)
        _upstream("nsqd", g2)
        channels = [c for t in per_node for c in t["channels"] if c["channel_name"] == channel]
        if not channels:
            return Answer({}, [g1, g2])  # as Go: no channel stats, only the message
        doc = cluster.cluster_channel_stats(topic, channel, channels)
        if any(t.get("is_dead_letter_topic") for t in per_node):
            doc["is_dead_letter_topic"] = True  # (ours, only then: the channel page offers a redrive)
        return Answer(doc, [g1, g2])

    def nodes(self):
        producers, g = self.ci.producers()
        _upstream(self._source, g)
        return Answer({"nodes": [cluster.public_producer(p) for p in producers]}, [g])

    def find_node(self, node):
        producers, g = self.ci.producers()
        for p in producers:
            if cluster.http_address(p) == node:
                return p, g
        raise AdminError(404, "NODE_NOT_FOUND")

    def node(self, node, partial=False):
        """One node's topics; when it does not answer, 502 as in Go, or (``partial``, for the page) an
        empty document whose warning names it."""
        producer, g1 = self.find_node(node)
        per_node, g2 = self.ci.nsqd_stats([producer])
        if g2.errors and not partial:
            raise AdminError(502, "UPSTREAM_ERROR: %s" % g2.errors[cluster.producer_address(producer)])
        total_clients = sum(c["client_count"] for t in per_node for c in t["channels"])
        total_messages = sum(t["message_count"] for t in per_node)
        doc = {"node": node, "topics": per_node, "total_messages": total_messages, "total_clients": total_clients}
        return Answer(doc, [g1, g2] if partial else [g1])

    def node_state(self, node, bodies=False, topic=""):
        """Our broker's ``/debug/state`` (the inside view), through nsqadmin; ``topic`` keeps that topic only.

        Message bodies are asked for only with ``bodies`` (the caller decides
        who may see them); without it, any body the node sends anyway is
        dropped before the document goes on.  Otherwise the document is passed
        on as the broker sent it: the inside view's script checks every
        field's type as it draws it.
        """
        producer, _ = self.find_node(node)
        address = cluster.producer_address(producer)
        try:
            doc = self.admin.client.get_json(address, "/debug/state?bodies=true" if bodies else "/debug/state")
        except cluster.UpstreamError as e:
            raise AdminError(502, "UPSTREAM_ERROR: %s" % e) from None
        if not bodies:
            without_bodies(doc)
        if topic and isinstance(doc, dict) and isinstance(doc.get("topics"), list):
            doc["topics"] = [t for t in doc["topics"] if isinstance(t, dict) and t.get("name") == topic]
        return doc

    def charts(self, topic, channel=""):
        """``GET /api/charts/<topic>[/<channel>]`` (ours): nsqadmin's samples of a topic or channel, as columns
        (see :mod:`.sampler`); empty lists for one not sampled yet, and when sampling is off (interval 0)."""
        sampler = self.admin.sampler
        doc = {"topic": topic}
        if channel:
            doc["channel"] = channel
        doc["interval_ms"] = int(round(sampler.interval * 1000)) if sampler is not None else 0
        doc["samples"] = SAMPLES
        doc["hour_step_ms"] = int(max(HOUR_STEP, sampler.interval) * 1000) if sampler is not None else 0
        if sampler is not None:
            doc.update(sampler.series(topic, channel))
        else:
            doc.update({"time": [], "message_rate": [], "depth": [], "in_flight": [], "recent_from": None})
        return doc

    def counter(self):
        producers, g1 = self.ci.producers()
        _upstream(self._source, g1)
        per_node, g2 = self.ci.nsqd_stats(producers)
        stats = {}
        for t in per_node:
            for c in t["channels"]:
                key = "%s:%s:%s" % (t["topic_name"], c["channel_name"], c["node"])
                entry = stats.setdefault(key, {"node": c["node"], "topic_name": t["topic_name"],
                                               "channel_name": c["channel_name"], "message_count": 0})
                entry["message_count"] += c["message_count"]
        return Answer({"stats": stats}, [g1, g2])


def without_bodies(doc):
    """Remove every ``body`` from a ``/debug/state`` document, whatever its shape; ``bodies`` become false.

    Walked without recursion: the document comes from a node, which decides how deep it is.
    """
    todo = [doc]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            item.pop("body", None)
            if "bodies" in item:
                item["bodies"] = False
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)


# -- request bodies of the actions ---------------------------------------------------


def read_json_body(request, invalid=None):
    """The JSON object of a request body; 400 (Go's decode error text, or ``invalid``) otherwise."""
    raw = request.read_body(1 << 20, "BODY_TOO_BIG")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise AdminError(400, invalid or ("EOF" if not raw.strip() else "invalid JSON: %s" % e)) from None
    if not isinstance(doc, dict):
        raise AdminError(400, invalid or "json: cannot unmarshal into a JSON object")
    return doc


def body_string(doc, key):
    value = doc.get(key, "")
    if not isinstance(value, str):
        raise AdminError(400, "json: cannot unmarshal %s into Go struct field .%s of type string"
                         % (type(value).__name__, key))
    return value


def check_topic(topic):
    if not is_valid_name(topic):
        raise AdminError(400, "INVALID_TOPIC")


def check_channel(channel):
    if not is_valid_name(channel):
        raise AdminError(400, "INVALID_CHANNEL")
