"""What nsqadmin knows of a cluster: lookupd and nsqd HTTP queries in parallel, and their aggregation.

Every question is asked of every lookupd (or every nsqd) at once, on a few
named threads that are joined before the answer is built; each request has
the ``--http-client-connect-timeout`` to connect and the
``--http-client-request-timeout`` to answer.  Nodes that fail do not fail the
question: their errors are collected (:class:`Gathered`), and the API and the
pages report them next to the partial answer, as Go nsqadmin does.

The aggregated documents (:func:`topic_stats`, :func:`channel_stats`) have Go
nsqadmin's field names: ``node`` is a broker's HTTP address
(``broadcast_address:http_port``), ``*`` for a total over nodes.
"""

import http.client
import json
import queue
import socket
import threading
import time
import urllib.parse

from ..internal import httpclient

MAX_QUERY_THREADS = 16  # requests in flight at once, per question
MAX_ANSWER = 256 << 20  # bytes of one node's answer (a /stats with every client of a big broker fits)


class UpstreamError(Exception):
    """One node's request failed (connect, timeout, bad status or body)."""

    def __init__(self, address, text):
        super().__init__("%s: %s" % (address, text))
        self.address = address
        self.text = text


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
            raise UpstreamError(address, "got response %d %s" % (status, body[:200].decode("utf-8", "replace")))
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
            label = address if isinstance(address, str) else " ".join(address)
            threading.current_thread().name = "%s[%s]" % (name, label)
            try:
                result = ask(address)
            except UpstreamError as e:
                with lock:
                    out.errors[address] = e
            except Exception as e:  # a malformed answer: that node failed, the others stand
                with lock:
                    out.errors[address] = UpstreamError(address, "%s: %s" % (type(e).__name__, e))
            else:
                with lock:
                    out.results[address] = result

    threads = [threading.Thread(target=worker, name=name) for _ in range(min(len(addresses), MAX_QUERY_THREADS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


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


class ClusterInfo:
    """The questions nsqadmin asks, over ``lookupds`` or (without any) ``nsqds`` (HTTP addresses)."""

    def __init__(self, client, lookupds=(), nsqds=()):
        self.client = client
        self.lookupds = list(lookupds)
        self.nsqds = list(nsqds)

    # -- lookupd questions

    def lookupd_topics(self):
        g = gather(self.lookupds, lambda a: self.client.get_json(a, "/topics")["topics"], "nsqadmin-lookupd")
        topics = sorted({t for ts in g.results.values() for t in ts or ()})
        return topics, g

    def lookupd_topic_channels(self, topic):
        def ask(a):
            return self.client.get_json(a, "/channels?topic=" + quote(topic))["channels"]

        g = gather(self.lookupds, ask, "nsqadmin-lookupd")
        return sorted({c for cs in g.results.values() for c in cs or ()}), g

    def lookupd_producers(self):
        """Every producer the lookupds list in ``/nodes``, merged by HTTP address (Go's Producer docs)."""
        g = gather(self.lookupds, lambda a: self.client.get_json(a, "/nodes")["producers"], "nsqadmin-lookupd")
        merged = {}
        for lookupd in self.lookupds:
            for p in g.results.get(lookupd) or ():
                key = http_address(p)
                node = merged.get(key)
                if node is None:
                    node = merged[key] = {
                        "remote_addresses": [],
                        "remote_address": p.get("remote_address", ""),
                        "hostname": p.get("hostname", ""),
                        "broadcast_address": p["broadcast_address"],
                        "tcp_port": p["tcp_port"],
                        "http_port": p["http_port"],
                        "version": p.get("version", ""),
                        "topics": [],
                        "out_of_date": False,
                    }
                node["remote_addresses"].append("%s/%s" % (lookupd, p.get("remote_address", "")))
                known = {t["topic"]: t for t in node["topics"]}
                for topic, tombstoned in zip(p.get("topics") or (), p.get("tombstones") or ()):
                    if topic in known:
                        known[topic]["tombstoned"] = known[topic]["tombstoned"] or tombstoned
                    else:
                        known[topic] = {"topic": topic, "tombstoned": bool(tombstoned)}
                node["topics"] = sorted(known.values(), key=lambda t: t["topic"])
        producers = list(merged.values())
        _mark_out_of_date(producers)
        return producers, g

    def lookupd_topic_producers(self, topic):
        def ask(a):  # a 404 (TOPIC_NOT_FOUND) is that lookupd's failure, as in Go
            return self.client.get_json(a, "/lookup?topic=" + quote(topic))["producers"]

        g = gather(self.lookupds, ask, "nsqadmin-lookupd")
        merged = {}
        for lookupd in self.lookupds:
            for p in g.results.get(lookupd) or ():
                merged.setdefault(http_address(p), {
                    "remote_addresses": [], "remote_address": p.get("remote_address", ""),
                    "hostname": p.get("hostname", ""), "broadcast_address": p["broadcast_address"],
                    "tcp_port": p["tcp_port"], "http_port": p["http_port"], "version": p.get("version", ""),
                    "topics": [], "out_of_date": False,
                })["remote_addresses"].append("%s/%s" % (lookupd, p.get("remote_address", "")))
        return list(merged.values()), g

    # -- nsqd questions

    def nsqd_producers(self):
        """Producers built from each nsqd's ``/info`` and ``/stats`` (no lookupd)."""

        def ask(a):
            info = self.client.get_json(a, "/info")
            stats = self.client.get_json(a, "/stats?format=json&include_clients=false")
            return info, stats

        g = gather(self.nsqds, ask, "nsqadmin-nsqd")
        producers = []
        for address in self.nsqds:
            if address not in g.results:
                continue
            info, stats = g.results[address]
            producers.append({
                "remote_addresses": [],
                "remote_address": "",
                "hostname": info.get("hostname", ""),
                "broadcast_address": info.get("broadcast_address", ""),
                "tcp_port": info.get("tcp_port", 0),
                "http_port": info.get("http_port", 0),
                "version": info.get("version", ""),
                "topics": sorted(({"topic": t["topic_name"], "tombstoned": False} for t in stats.get("topics") or ()),
                                 key=lambda t: t["topic"]),
                "out_of_date": False,
                "address": address,  # how we reached it (the broadcast address may not be routable)
            })
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

    def nsqd_stats(self, producers, topic=""):
        """``(topic_stats per node, gathered)``: each node's ``/stats`` as Go nsqadmin's TopicStats docs."""
        path = "/stats?format=json"
        if topic:
            path += "&topic=" + quote(topic)
        by_address = {producer_address(p): p for p in producers}
        g = gather(by_address, lambda a: self.client.get_json(a, path), "nsqadmin-nsqd")
        per_node = []
        for address, doc in g.results.items():
            p = by_address[address]
            node = http_address(p)
            for t in doc.get("topics") or ():
                if topic and t["topic_name"] != topic:
                    continue
                per_node.append(node_topic_stats(node, p.get("hostname", ""), t))
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


# -- stats aggregation ------------------------------------------------------------


def _e2e(e2e, topic="", channel="", host=""):
    """A node's e2e_processing_latency as Go nsqadmin's aggregate document."""
    count = (e2e or {}).get("count", 0)
    percentiles = None
    for p in (e2e or {}).get("percentiles") or ():
        percentiles = percentiles or []
        v = p.get("value", 0)
        percentiles.append({"average": v, "count": count, "max": v, "min": v, "quantile": p.get("quantile", 0),
                            "value": v})
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


def client_stats(node, c):
    """A client of a node's channel, with Go nsqadmin's ClientStats fields."""
    return {
        "node": node,
        "remote_address": c.get("remote_address", ""),
        "version": c.get("version", ""),
        "client_id": c.get("client_id", ""),
        "hostname": c.get("hostname", ""),
        "user_agent": c.get("user_agent", ""),
        "connect_ts": c.get("connect_ts", 0),
        "connected": 0,
        "in_flight_count": c.get("in_flight_count", 0),
        "ready_count": c.get("ready_count", 0),
        "finish_count": c.get("finish_count", 0),
        "requeue_count": c.get("requeue_count", 0),
        "message_count": c.get("message_count", 0),
        "sample_rate": c.get("sample_rate", 0),
        "deflate": c.get("deflate", False),
        "snappy": c.get("snappy", False),
        "authed": c.get("authed", False),
        "auth_identity": c.get("auth_identity", ""),
        "auth_identity_url": c.get("auth_identity_url", ""),
        "tls": c.get("tls", False),
        "tls_cipher_suite": c.get("tls_cipher_suite", ""),
        "tls_version": c.get("tls_version", ""),
        "tls_negotiated_protocol": c.get("tls_negotiated_protocol", ""),
        "tls_negotiated_protocol_is_mutual": c.get("tls_negotiated_protocol_is_mutual", False),
    }


def node_channel_stats(node, hostname, topic, c):
    depth, backend = c.get("depth", 0), c.get("backend_depth", 0)
    return {
        "node": node,
        "hostname": hostname,
        "topic_name": topic,
        "channel_name": c["channel_name"],
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "in_flight_count": c.get("in_flight_count", 0),
        "deferred_count": c.get("deferred_count", 0),
        "requeue_count": c.get("requeue_count", 0),
        "timeout_count": c.get("timeout_count", 0),
        "message_count": c.get("message_count", 0),
        "client_count": c.get("client_count", len(c.get("clients") or ())),
        "nodes": None,
        "clients": [client_stats(node, cl) for cl in c.get("clients") or ()],
        "paused": c.get("paused", False),
        "e2e_processing_latency": _e2e(c.get("e2e_processing_latency")),
    }


def node_topic_stats(node, hostname, t):
    depth, backend = t.get("depth", 0), t.get("backend_depth", 0)
    name = t["topic_name"]
    return {
        "node": node,
        "hostname": hostname,
        "topic_name": name,
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "message_count": t.get("message_count", 0),
        "nodes": None,
        "channels": sorted((node_channel_stats(node, hostname, name, c) for c in t.get("channels") or ()),
                           key=lambda c: c["channel_name"]),
        "paused": t.get("paused", False),
        "e2e_processing_latency": _e2e(t.get("e2e_processing_latency")),
    }


_CHANNEL_SUMS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count", "requeue_count",
                 "timeout_count", "message_count", "client_count")


def channel_stats(topic, channel, per_node_channels):
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
    total["nodes"].sort(key=lambda c: (c["hostname"], c["node"]))
    total["clients"].sort(key=lambda c: (c["hostname"], c["node"], c["remote_address"]))
    return total


def topic_stats(topic, per_node_topics):
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
        total["nodes"].append(t)
        _e2e_add(total["e2e_processing_latency"], t["e2e_processing_latency"])
        for c in t["channels"]:
            channels.setdefault(c["channel_name"], []).append(c)
    total["channels"] = [channel_stats(topic, name, cs) for name, cs in sorted(channels.items())]
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
