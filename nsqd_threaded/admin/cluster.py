"""What nsqadmin knows of a cluster: lookupd and nsqd HTTP queries in parallel, and their aggregation.

Every question is asked of every lookupd (or every nsqd) at once, on a few
named threads that are joined before the answer is built; each request has
the ``--http-client-connect-timeout`` to connect and the
``--http-client-request-timeout`` to answer.  Nodes that fail do not fail the
question: their errors are collected (:class:`Gathered`), and the API and the
pages report them next to the partial answer, as Go nsqadmin does.

Every document a node or a lookupd sends is checked where it arrives, in
the thread that asked (:func:`read_topic`, :func:`read_producer`...): a
field of the wrong type (a string where Go has a number, a number where it
has a name) makes that node's answer malformed (:class:`Malformed`), which
fails that node only, as Go's ``json.Unmarshal`` error does.  So what the
aggregation and the pages see has the types they expect, and a node that
lies is named in the partial-failure warning instead of breaking the totals.

The aggregated documents (:func:`cluster_topic_stats`, :func:`cluster_channel_stats`) have Go
nsqadmin's field names: ``node`` is a broker's HTTP address
(``broadcast_address:http_port``), ``*`` for a total over nodes.
"""

import http.client
import json
import math
import queue
import re
import socket
import threading
import time
import urllib.parse

from ..internal import httpclient

MAX_QUERY_THREADS = 16  # requests in flight at once, per question
MAX_ANSWER = 256 << 20  # bytes of one node's answer (a /stats with every client of a big broker fits)


# A host nsqadmin connects to: a name or an address, never markup or a path (a registration can say anything).
_HOST = re.compile(r"[A-Za-z0-9._:%-]+\Z|\[[A-Za-z0-9._:%-]+\]\Z")


class UpstreamError(Exception):
    """One node's request failed (connect, timeout, bad status or body); ``status`` is the HTTP status, if any."""

    def __init__(self, address, text, status=None):
        super().__init__("%s: %s" % (address, text))
        self.address = address
        self.text = text
        self.status = status


class Malformed(ValueError):
    """A node's document with a value of the wrong type; the text says where (never the value itself)."""


# -- reading a node's documents: the types Go's structs have ------------------------

INT, NUMBER, STR, BOOL, LIST = "an integer", "a number", "a string", "a boolean", "a list"


def _is(value, kind):
    if kind is INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is STR:
        return isinstance(value, str)
    if kind is BOOL:
        return isinstance(value, bool)
    return isinstance(value, list)


def field(doc, key, kind, where, default=None):
    """``doc[key]`` when it is of ``kind`` (missing or null: ``default``, Go's zero value); else Malformed.

    Without a default the field is required.
    """
    if not isinstance(doc, dict):
        raise Malformed("%s is not an object" % where)
    if doc.get(key) is None and default is not None:  # missing or null: Go leaves the zero value
        return default
    value = doc.get(key)
    if not _is(value, kind):
        raise Malformed("%s.%s is not %s" % (where, key, kind))
    return value


def items(doc, key, where):
    """``doc[key]`` as a list (missing or null: empty), with each item's place for messages."""
    if isinstance(doc, dict) and doc.get(key) is None:
        return []
    return [(value, "%s.%s[%d]" % (where, key, i)) for i, value in enumerate(field(doc, key, LIST, where))]


def strings(doc, key, where):
    """``doc[key]`` as a list of strings (names), or Malformed."""
    out = []
    for value, place in items(doc, key, where):
        if not isinstance(value, str):
            raise Malformed("%s is not a string" % place)
        out.append(value)
    return out


class Gathered:
    """Answers of several nodes: ``results`` (address -> doc), ``errors`` (address -> UpstreamError)."""

    def __init__(self):
        self.results = {}
        self.errors = {}

    @property
    def failed(self):
        return sorted(self.errors)


class HTTPClient:
    """nsqadmin's client for lookupd and nsqd HTTP APIs: connect and request timeouts, JSON answers.

    As Go's client does, a plain-HTTP request answered ``403`` with an
    ``https_port`` (a broker run with ``--tls-required``) is sent again over
    HTTPS to that port, with ``ssl_context`` (the ``--http-client-tls-*``
    flags; the system's roots without one).
    """

    def __init__(self, connect_timeout, request_timeout, user_agent="nsqadmin-threaded", ssl_context=None):
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.user_agent = user_agent
        self.ssl_context = ssl_context

    def request(self, method, address, path, body=None, https=False):
        """``(status, body bytes)``; UpstreamError when the node cannot be reached in time.

        Connecting takes at most the connect timeout; the whole exchange ends by
        the connect and the request timeouts together (a trickling answer is cut off).
        """
        host, _, port = address.rpartition(":")
        try:
            port = int(port)
        except ValueError:
            raise UpstreamError(address, "invalid address") from None
        if not _HOST.match(host):
            raise UpstreamError(address, "invalid address")
        status, data = self._exchange(method, address, host.strip("[]"), port, path, body, https)
        if status == 403 and not https:
            https_port = httpclient.https_port(data)
            if https_port:
                status, data = self._exchange(method, address, host.strip("[]"), https_port, path, body, True)
        return status, data

    def _exchange(self, method, address, host, port, path, body, https):
        deadline = time.monotonic() + self.connect_timeout + self.request_timeout
        headers = {"Accept": httpclient.NSQ_V1_ACCEPT, "User-Agent": self.user_agent}
        if body is not None:
            headers["Content-Type"] = "application/json"
        context = (self.ssl_context or httpclient.client_ssl_context()) if https else None
        try:
            status, _, data = httpclient.request(method, host, port, path, body=body, headers=headers,
                                                 connect_timeout=self.connect_timeout, deadline=deadline,
                                                 ssl_context=context, max_size=MAX_ANSWER)
            return status, data
        except socket.timeout:
            raise UpstreamError(address, "timed out") from None
        except (OSError, http.client.HTTPException, httpclient.ResponseTooLarge) as e:
            raise UpstreamError(address, str(e) or type(e).__name__) from None

    def get_json(self, address, path):
        status, body = self.request("GET", address, path)
        if status != 200:
            raise UpstreamError(address, "got response %d %s" % (status, body[:200].decode("utf-8", "replace")),
                                status)
        try:
            return json.loads(body.decode("utf-8"))
        except ValueError:
            raise UpstreamError(address, "response is not JSON") from None

    def post(self, address, path, body=None, method="POST"):
        status, text = self.request(method, address, path, body)
        if status != 200:
            raise UpstreamError(address, "got response %d %s" % (status, text[:200].decode("utf-8", "replace")))
        return text


def gather(addresses, ask, name):
    """Call ``ask(address)`` for every address on up to MAX_QUERY_THREADS threads; join them all.

    Threads are named ``name[address]``; an UpstreamError is recorded, not raised.
    """
    out = Gathered()
    addresses = list(dict.fromkeys(addresses))
    if not addresses:
        return out
    work = queue.SimpleQueue()
    for address in addresses:
        work.put(address)
    lock = threading.Lock()  # guards out.results and out.errors

    def worker():
        while True:
            try:
                address = work.get_nowait()
            except queue.Empty:
                return
            threading.current_thread().name = "%s[%s]" % (name, _label(address))
            try:
                result = ask(address)
            except UpstreamError as e:
                with lock:
                    out.errors[address] = e
            except Malformed as e:  # a node that sends the wrong types fails alone, as in Go
                with lock:
                    out.errors[address] = UpstreamError(_label(address), "malformed answer: %s" % e)
            except Exception as e:  # a malformed answer: that node failed, the others stand
                with lock:
                    out.errors[address] = UpstreamError(_label(address), "%s: %s" % (type(e).__name__, e))
            else:
                with lock:
                    out.results[address] = result

    # Joined below; daemon as well, so that a request still waiting on a node at the interpreter's exit
    # does not hold the process (its owner, the caller, is what waits for it).
    threads = [threading.Thread(target=worker, name=name, daemon=True)
               for _ in range(min(len(addresses), MAX_QUERY_THREADS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _label(address):
    """An address, or a (lookupd, topic) pair, as text."""
    return address if isinstance(address, str) else " ".join(address)


def quote(value):
    return urllib.parse.quote(value, safe="")


# -- producers (nodes) ---------------------------------------------------------


def http_address(producer):
    return "%s:%s" % (producer["broadcast_address"], producer["http_port"])


def _version_key(version):
    parts = []
    for p in str(version).split("-")[0].split("."):
        try:
            parts.append(int(p))
        except ValueError:
            parts.append(0)
    return parts


def read_producer(p, where):
    """A producer of a lookupd's ``/nodes`` or ``/lookup``, checked against Go's PeerInfo types."""
    tombstones = []
    for value, place in items(p, "tombstones", where):
        if not isinstance(value, bool):
            raise Malformed("%s is not a boolean" % place)
        tombstones.append(value)
    return {
        "remote_address": field(p, "remote_address", STR, where, ""),
        "hostname": field(p, "hostname", STR, where, ""),
        "broadcast_address": field(p, "broadcast_address", STR, where),
        "tcp_port": field(p, "tcp_port", INT, where),
        "http_port": field(p, "http_port", INT, where),
        "version": field(p, "version", STR, where, ""),
        "topics": strings(p, "topics", where),
        "tombstones": tombstones,
    }


def _new_producer(p):
    return {
        "remote_addresses": [], "remote_address": p["remote_address"], "hostname": p["hostname"],
        "broadcast_address": p["broadcast_address"], "tcp_port": p["tcp_port"], "http_port": p["http_port"],
        "version": p["version"], "topics": [], "out_of_date": False,
    }


class ClusterInfo:
    """The questions nsqadmin asks, over ``lookupds`` or (without any) ``nsqds`` (HTTP addresses)."""

    def __init__(self, client, lookupds=(), nsqds=()):
        self.client = client
        self.lookupds = list(lookupds)
        self.nsqds = list(nsqds)

    # -- lookupd questions

    def lookupd_topics(self):
        g = gather(self.lookupds, lambda a: strings(self.client.get_json(a, "/topics"), "topics", "topics"),
                   "nsqadmin-lookupd")
        topics = sorted({t for ts in g.results.values() for t in ts})
        return topics, g

    def _channels(self, lookupd, topic):
        return strings(self.client.get_json(lookupd, "/channels?topic=" + quote(topic)), "channels", "channels")

    def lookupd_topic_channels(self, topic):
        g = gather(self.lookupds, lambda a: self._channels(a, topic), "nsqadmin-lookupd")
        return sorted({c for cs in g.results.values() for c in cs}), g

    def lookupd_channels_of(self, topics_by_lookupd):
        """Each lookupd's channels of each of its topics: gathered over ``(lookupd, topic)`` pairs."""
        pairs = [(lookupd, topic) for lookupd, topics in topics_by_lookupd.items() for topic in topics]
        return gather(pairs, lambda pair: sorted(self._channels(*pair)), "nsqadmin-lookupd")

    def _lookupd_producers(self, lookupd, path):
        doc = self.client.get_json(lookupd, path)
        return [read_producer(p, place) for p, place in items(doc, "producers", path.split("?")[0].strip("/"))]

    def lookupd_producers(self):
        """Every producer the lookupds list in ``/nodes``, merged by HTTP address (Go's Producer docs)."""
        g = gather(self.lookupds, lambda a: self._lookupd_producers(a, "/nodes"), "nsqadmin-lookupd")
        merged = {}
        for lookupd in self.lookupds:
            for p in g.results.get(lookupd) or ():
                key = http_address(p)
                node = merged.get(key)
                if node is None:
                    node = merged[key] = _new_producer(p)
                node["remote_addresses"].append("%s/%s" % (lookupd, p["remote_address"]))
                known = {t["topic"]: t for t in node["topics"]}
                for topic, tombstoned in zip(p["topics"], p["tombstones"]):
                    if topic in known:
                        known[topic]["tombstoned"] = known[topic]["tombstoned"] or tombstoned
                    else:
                        known[topic] = {"topic": topic, "tombstoned": tombstoned}
                node["topics"] = sorted(known.values(), key=lambda t: t["topic"])
        producers = list(merged.values())
        _mark_out_of_date(producers)
        return producers, g

    def lookupd_topic_producers(self, topic):
        # a 404 (TOPIC_NOT_FOUND) is that lookupd's failure, as in Go
        g = gather(self.lookupds, lambda a: self._lookupd_producers(a, "/lookup?topic=" + quote(topic)),
                   "nsqadmin-lookupd")
        merged = {}
        for lookupd in self.lookupds:
            for p in g.results.get(lookupd) or ():
                node = merged.setdefault(http_address(p), _new_producer(p))
                node["remote_addresses"].append("%s/%s" % (lookupd, p["remote_address"]))
        return list(merged.values()), g

    # -- nsqd questions

    def nsqd_producers(self):
        """Producers built from each nsqd's ``/info`` and ``/stats`` (no lookupd)."""

        def ask(a):
            info = self.client.get_json(a, "/info")
            stats = self.client.get_json(a, "/stats?format=json&include_clients=false")
            topics = [field(t, "topic_name", STR, place) for t, place in items(stats, "topics", "stats")]
            return {
                "remote_addresses": [],
                "remote_address": "",
                "hostname": field(info, "hostname", STR, "info", ""),
                "broadcast_address": field(info, "broadcast_address", STR, "info", ""),
                "tcp_port": field(info, "tcp_port", INT, "info", 0),
                "http_port": field(info, "http_port", INT, "info", 0),
                "version": field(info, "version", STR, "info", ""),
                "topics": sorted(({"topic": t, "tombstoned": False} for t in topics), key=lambda t: t["topic"]),
                "out_of_date": False,
                "address": a,  # how we reached it (the broadcast address may not be routable)
            }

        g = gather(self.nsqds, ask, "nsqadmin-nsqd")
        producers = [g.results[a] for a in self.nsqds if a in g.results]
        _mark_out_of_date(producers)
        return producers, g

    def producers(self):
        return self.lookupd_producers() if self.lookupds else self.nsqd_producers()

    def topics(self):
        if self.lookupds:
            return self.lookupd_topics()
        producers, g = self.nsqd_producers()
        return sorted({t["topic"] for p in producers for t in p["topics"]}), g

    def topic_producers(self, topic):
        if self.lookupds:
            return self.lookupd_topic_producers(topic)
        producers, g = self.nsqd_producers()
        return [p for p in producers if any(t["topic"] == topic for t in p["topics"])], g

    def nsqd_stats(self, producers, topic="", clients=True):
        """``(node_topic_stats per node, gathered)``: each node's ``/stats`` as Go nsqadmin's TopicStats docs.

        Each node's answer is checked in the thread that asked for it: one
        with a value of the wrong type anywhere fails that node (Malformed).
        Without ``clients`` the nodes are asked to leave their clients out.
        """
        path = "/stats?format=json"
        if topic:
            path += "&topic=" + quote(topic)
        if not clients:
            path += "&include_clients=false"
        by_address = {producer_address(p): p for p in producers}

        def ask(a):
            p = by_address[a]
            doc = self.client.get_json(a, path)
            return [node_topic_stats(http_address(p), p["hostname"], t, place)
                    for t, place in items(doc, "topics", "stats")]

        g = gather(by_address, ask, "nsqadmin-nsqd")
        per_node = [t for ts in g.results.values() for t in ts if not topic or t["topic_name"] == topic]
        per_node.sort(key=lambda t: (t["topic_name"], t["hostname"], t["node"]))
        return per_node, g

    # -- actions (POSTs to lookupds and nsqds)

    def lookupd_post(self, path):
        return gather(self.lookupds, lambda a: self.client.post(a, path), "nsqadmin-lookupd")

    def producers_post(self, producers, path, method="POST"):
        return gather([producer_address(p) for p in producers], lambda a: self.client.post(a, path, method=method),
                      "nsqadmin-nsqd")


def producer_address(producer):
    """Where nsqadmin reaches a producer: the address it was given, else broadcast_address:http_port."""
    return producer.get("address") or http_address(producer)


def _mark_out_of_date(producers):
    if not producers:
        return
    newest = max(_version_key(p["version"]) for p in producers)
    for p in producers:
        p["out_of_date"] = _version_key(p["version"]) < newest


def public_producer(p):
    """A producer as Go nsqadmin's JSON has it (without the address we reached it by)."""
    return {k: v for k, v in p.items() if k != "address"}


# -- a node's stats, checked, as Go nsqadmin's documents ---------------------------------


def _e2e(e2e, where, topic="", channel="", host=""):
    """A node's e2e_processing_latency (checked) as Go nsqadmin's aggregate document."""
    if e2e is None:
        e2e = {}
    count = field(e2e, "count", INT, where, 0)
    percentiles = None
    for p, place in items(e2e, "percentiles", where):
        percentiles = percentiles or []
        v = field(p, "value", NUMBER, place, 0)
        percentiles.append({"average": v, "count": count, "max": v, "min": v,
                            "quantile": field(p, "quantile", NUMBER, place, 0), "value": v})
    return {"count": count, "percentiles": percentiles, "topic": topic, "channel": channel, "host": host}


def _e2e_add(total, e2e):
    total["host"] = "*"
    total["count"] += e2e["count"]
    for value in e2e["percentiles"] or ():
        ps = total["percentiles"] = total["percentiles"] or []
        for p in ps:
            if p["quantile"] == value["quantile"]:
                break
        else:
            p = {"average": 0, "count": 0, "max": value["max"], "min": value["min"], "quantile": value["quantile"]}
            ps.append(p)
        p["max"] = max(p["max"], value["max"])
        p["min"] = min(p["min"], value["min"])
        p["count"] += value["count"]
        if p["count"]:
            p["average"] += (value["average"] - p["average"]) * value["count"] / p["count"]
    if total["percentiles"]:
        total["percentiles"].sort(key=lambda p: -p["quantile"])


_CLIENT_FIELDS = (
    ("remote_address", STR, ""), ("version", STR, ""), ("client_id", STR, ""), ("hostname", STR, ""),
    ("user_agent", STR, ""), ("connect_ts", INT, 0), ("in_flight_count", INT, 0), ("ready_count", INT, 0),
    ("finish_count", INT, 0), ("requeue_count", INT, 0), ("message_count", INT, 0), ("sample_rate", INT, 0),
    ("deflate", BOOL, False), ("snappy", BOOL, False), ("authed", BOOL, False), ("auth_identity", STR, ""),
    ("auth_identity_url", STR, ""), ("tls", BOOL, False), ("tls_cipher_suite", STR, ""), ("tls_version", STR, ""),
    ("tls_negotiated_protocol", STR, ""), ("tls_negotiated_protocol_is_mutual", BOOL, False),
)


def node_client_stats(node, c, where="client"):
    """A client of a node's channel (checked), with Go nsqadmin's ClientStats fields."""
    doc = {"node": node, "connected": 0}
    for key, kind, default in _CLIENT_FIELDS:
        doc[key] = field(c, key, kind, where, default)
    return doc


# A channel's policy (max attempts, dead-letter topic, message TTL in ms) and what it took out: in a
# broker's /stats only when a policy applies to the channel, so in nsqadmin's documents only then too.
POLICY_FIELDS = (("max_attempts", INT, 0), ("dead_letter_topic", STR, ""), ("msg_ttl", INT, 0))
POLICY_COUNTS = ("dead_letter_count", "expired_count")
POLICY_KEYS = tuple(key for key, _, _ in POLICY_FIELDS) + POLICY_COUNTS


# Beside the effective policy, a broker tells the channel's own (a null field: inherited) and what the
# broker's defaults give the channel, as objects of POLICY_FIELDS' keys.
POLICY_SOURCES = ("own_policy", "default_policy")


def _policy(c, where):
    """The policy fields of a node's channel (checked), or None when the node sent none of them."""
    if all(c.get(key) is None for key in POLICY_KEYS):
        return None
    doc = {key: field(c, key, kind, where, default) for key, kind, default in POLICY_FIELDS}
    doc.update((key, field(c, key, INT, where, 0)) for key in POLICY_COUNTS)
    for source in POLICY_SOURCES:
        # (a broker that does not tell them leaves the key out: nsqadmin shows nothing for it)
        given = c.get(source)
        if given is not None:
            place = "%s.%s" % (where, source)
            if not isinstance(given, dict):
                raise Malformed("%s is not an object" % place)
            # own: null is inherited (kept as None); default: null is Go's zero value
            doc[source] = {key: None if source == "own_policy" and given.get(key) is None
                           else field(given, key, kind, place, default) for key, kind, default in POLICY_FIELDS}
    return doc


def node_channel_stats(node, hostname, topic, c, where="channel"):
    """One channel of a node's ``/stats`` (checked), with its policy fields when the node sent them."""
    depth, backend = field(c, "depth", INT, where, 0), field(c, "backend_depth", INT, where, 0)
    clients = [node_client_stats(node, cl, place) for cl, place in items(c, "clients", where)]
    policy = _policy(c, where)
    doc = {
        "node": node,
        "hostname": hostname,
        "topic_name": topic,
        "channel_name": field(c, "channel_name", STR, where),
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "in_flight_count": field(c, "in_flight_count", INT, where, 0),
        "deferred_count": field(c, "deferred_count", INT, where, 0),
        "requeue_count": field(c, "requeue_count", INT, where, 0),
        "timeout_count": field(c, "timeout_count", INT, where, 0),
        "message_count": field(c, "message_count", INT, where, 0),
        "client_count": field(c, "client_count", INT, where, len(clients)),
        "nodes": None,
        "clients": clients,
        "paused": field(c, "paused", BOOL, where, False),
        "e2e_processing_latency": _e2e(c.get("e2e_processing_latency"), where + ".e2e_processing_latency"),
    }
    if policy is not None:
        doc.update(policy)
    return doc


def node_topic_stats(node, hostname, t, where="topic"):
    """One topic of a node's ``/stats`` (checked: Malformed names the first field of the wrong type)."""
    depth, backend = field(t, "depth", INT, where, 0), field(t, "backend_depth", INT, where, 0)
    name = field(t, "topic_name", STR, where)
    doc = {
        "node": node,
        "hostname": hostname,
        "topic_name": name,
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "message_count": field(t, "message_count", INT, where, 0),
        "nodes": None,
        "channels": sorted((node_channel_stats(node, hostname, name, c, place)
                            for c, place in items(t, "channels", where)), key=lambda c: c["channel_name"]),
        "paused": field(t, "paused", BOOL, where, False),
        "e2e_processing_latency": _e2e(t.get("e2e_processing_latency"), where + ".e2e_processing_latency"),
    }
    # (our brokers say it only of a dead-letter topic; nsqadmin's documents carry it only then too)
    if field(t, "is_dead_letter_topic", BOOL, where, False):
        doc["is_dead_letter_topic"] = True
    return doc


_CHANNEL_SUMS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count", "requeue_count",
                 "timeout_count", "message_count", "client_count")


def cluster_channel_stats(topic, channel, per_node_channels):
    """The total of one channel over nodes (node ``*``), its per-node documents in ``nodes``."""
    total = {
        "node": "*", "hostname": "", "topic_name": topic, "channel_name": channel,
        **{k: 0 for k in _CHANNEL_SUMS},
        "nodes": [], "clients": [], "paused": False,
        "e2e_processing_latency": {"count": 0, "percentiles": None, "topic": topic, "channel": channel, "host": "*"},
    }
    for c in per_node_channels:
        for k in _CHANNEL_SUMS:
            total[k] += c[k]
        total["paused"] = total["paused"] or c["paused"]
        total["nodes"].append(c)
        total["clients"].extend(c["clients"])
        _e2e_add(total["e2e_processing_latency"], c["e2e_processing_latency"])
    _policy_total(total, per_node_channels)
    total["nodes"].sort(key=lambda c: (c["hostname"], c["node"]))
    total["clients"].sort(key=lambda c: (c["hostname"], c["node"], c["remote_address"]))
    return total


def _policy_total(total, per_node_channels):
    """The policy of a channel over nodes, when any node has one: its counters summed, and each policy field
    the nodes' common value, or None when they differ (a node without a policy has none: 0, "", 0)."""
    if not any("max_attempts" in c for c in per_node_channels):
        return
    for key, _, default in POLICY_FIELDS:
        values = {c.get(key, default) for c in per_node_channels}
        total[key] = values.pop() if len(values) == 1 else None
    for source in POLICY_SOURCES:
        # A node without a policy inherits every field, and no default applies there.  The total keeps a
        # field the nodes agree on (None: inherited) and leaves out one they differ on.
        absent = {key: None if source == "own_policy" else default for key, _, default in POLICY_FIELDS}
        docs = [c.get(source) if "max_attempts" in c else absent for c in per_node_channels]
        if all(d is not None for d in docs):
            total[source] = {key: docs[0][key] for key, _, _ in POLICY_FIELDS
                             if len({(type(d[key]), d[key]) for d in docs}) == 1}
    for key in POLICY_COUNTS:
        total[key] = sum(c.get(key, 0) for c in per_node_channels)


def cluster_topic_stats(topic, per_node_topics):
    """The total of one topic over nodes (node ``*``): per-node documents in ``nodes``, channels totalled."""
    total = {
        "node": "*", "hostname": "", "topic_name": topic, "depth": 0, "memory_depth": 0, "backend_depth": 0,
        "message_count": 0, "nodes": [], "channels": [], "paused": False,
        "e2e_processing_latency": {"count": 0, "percentiles": None, "topic": topic, "channel": "", "host": "*"},
    }
    channels = {}
    for t in per_node_topics:
        for k in ("depth", "memory_depth", "backend_depth", "message_count"):
            total[k] += t[k]
        total["paused"] = total["paused"] or t["paused"]
        if t.get("is_dead_letter_topic"):
            total["is_dead_letter_topic"] = True  # (on any node: its dead letters may be redriven there)
        total["nodes"].append(t)
        _e2e_add(total["e2e_processing_latency"], t["e2e_processing_latency"])
        for c in t["channels"]:
            channels.setdefault(c["channel_name"], []).append(c)
    total["channels"] = [cluster_channel_stats(topic, name, cs) for name, cs in sorted(channels.items())]
    return total


def warning(messages):
    """Go nsqadmin's ``message``: empty, or ``WARNING: a; b``."""
    return "WARNING: " + "; ".join(messages) if messages else ""


def partial_messages(*gathered):
    """One message per question that some node failed to answer (Go's PartialErr text)."""
    out = []
    for g in gathered:
        if g is not None and g.errors:
            out.append("partial failure: " + ", ".join(str(e) for _, e in sorted(g.errors.items())))
    return out
