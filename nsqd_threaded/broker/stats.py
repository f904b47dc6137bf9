"""Stats: snapshots of topics, channels and clients, and their renderings.

:func:`collect` takes a consistent-enough snapshot from the live objects
(each channel under its own lock, as nsqd does) into plain dicts whose key
order is Go nsqd's.  The renderers are pure functions of that snapshot:
:func:`render_text` here (/stats), ``gocompat.go_json`` (/stats?format=json)
and ``metrics.render_prometheus`` (/metrics).

For /stats?format=json, ``collect(as_json=True)`` writes each channel object
as its JSON text at once (:func:`channel_json`, its clients by
:func:`client_json`): a /stats of thousands of channels or clients is mostly
objects of one shape, which a template writes twice as fast as a dict goes
through the general encoder.  The
encoder's one call on the whole document would also hold the GIL for tens of
milliseconds, while the walk here hands it to waiting threads.
"""

import gc
import os
import sys
import time

from ..internal.gil import GILPacer
from ..internal.gocompat import RawMessage, format_duration, format_duration_ns, go_json, go_json_string


# -- snapshot ----------------------------------------------------------------


def client_stats(client, pub_topic=None):
    """One client object, keys in nsqd's order (omitempty keys left out when empty)."""
    doc = {
        "client_id": client.client_id,
        "hostname": client.hostname,
        "version": "V2",
        "remote_address": client.remote_address,
        "state": client.state,
        "ready_count": client.ready_count,
        "in_flight_count": client.in_flight_count,
        "message_count": client.message_count,
        "finish_count": client.finish_count,
        "requeue_count": client.requeue_count,
        "connect_ts": int(client.connect_time),
        "sample_rate": client.sample_rate,
        "deflate": client.deflate,
        "snappy": client.snappy,
        "user_agent": client.user_agent,
    }
    auth_state = client.auth_state  # authed, auth_identity, auth_identity_url: omitted when empty
    if auth_state is not None:
        if auth_state.authorizations:
            doc["authed"] = True
        if auth_state.identity:
            doc["auth_identity"] = auth_state.identity
        if auth_state.identity_url:
            doc["auth_identity_url"] = auth_state.identity_url
    doc["topology_zone"] = client.topology_zone
    doc["topology_region"] = client.topology_region
    counts = client.pub_counts
    if counts:  # a subscriber has none: no copy to make
        counts = dict(counts)
        # nsqd's loop stops after the first entry: at most one topic is shown, and
        # with a topic filter only that topic (nothing if it was not published to).
        topic = next(iter(counts)) if not pub_topic else pub_topic if pub_topic in counts else None
        if topic is not None:
            doc["pub_counts"] = [{"topic": topic, "count": counts[topic]}]
    transport = client.transport
    if client.tls and transport is not None:
        doc["tls"] = True
        doc.update(transport.tls_state())
    else:
        doc.update(_NO_TLS)
    return doc


# The JSON of a client object in the common case (a subscriber: no pub_counts, no TLS, no AUTH).
_CLIENT_JSON = ('{"client_id":%s,"hostname":%s,"version":"V2","remote_address":%s,"state":%d,"ready_count":%d,'
                '"in_flight_count":%d,"message_count":%d,"finish_count":%d,"requeue_count":%d,"connect_ts":%d,'
                '"sample_rate":%d,"deflate":%s,"snappy":%s,"user_agent":%s,"topology_zone":%s,"topology_region":%s,'
                '"tls":false,"tls_cipher_suite":"","tls_version":"","tls_negotiated_protocol":"",'
                '"tls_negotiated_protocol_is_mutual":false}')


def client_json(client, pub_topic=None):
    """``go_json(client_stats(client, pub_topic))``."""
    if client.pub_counts or client.tls or client.auth_state is not None:  # keys the template lacks
        return go_json(client_stats(client, pub_topic))
    return _CLIENT_JSON % (
        go_json_string(client.client_id), go_json_string(client.hostname), go_json_string(client.remote_address),
        client.state, client.ready_count, client.in_flight_count, client.message_count, client.finish_count,
        client.requeue_count, client.connect_time, client.sample_rate, "true" if client.deflate else "false",
        "true" if client.snappy else "false", go_json_string(client.user_agent), go_json_string(client.topology_zone),
        go_json_string(client.topology_region),
    )


_NO_TLS = {
    "tls": False,
    "tls_cipher_suite": "",
    "tls_version": "",
    "tls_negotiated_protocol": "",
    "tls_negotiated_protocol_is_mutual": False,
}


def _e2e(percentiles, quantiles):
    count, values = percentiles
    if not quantiles:
        return {"count": 0, "percentiles": None}
    return {
        "count": count,
        "percentiles": [{"quantile": q, "value": float(v)} for q, v in zip(quantiles, values)],
    }


def channel_stats(channel, include_clients, quantiles, pub_topic=None):
    """One channel's /stats object (Go's keys, in Go's order)."""
    return _channel_doc(channel, channel.snapshot(), include_clients, quantiles, pub_topic)


# The JSON of a channel object in the common case (no delivery policy, no redrive, no
# global count: the keys Go writes), with its values left to fill in.
_CHANNEL_JSON = ('{"channel_name":%s,"depth":%d,"backend_depth":%d,"in_flight_count":%d,"deferred_count":%d,'
                 '"message_count":%d,"requeue_count":%d,"timeout_count":%d,"client_count":%d,"clients":%s,'
                 '"paused":%s,"e2e_processing_latency":%s}')
_NO_E2E_JSON = '{"count":0,"percentiles":null}'


def channel_json(channel, include_clients, quantiles, pub_topic=None):
    """``go_json(channel_stats(...))``."""
    figures = channel.snapshot()
    (memory_depth, backend_depth, in_flight_count, deferred_count, message_count, global_msg_count,
     requeue_count, timeout_count, clients, paused, policy, redrive_count) = figures
    if global_msg_count or policy is not None or redrive_count:  # keys the template lacks
        return go_json(_channel_doc(channel, figures, include_clients, quantiles, pub_topic))
    return _CHANNEL_JSON % (
        go_json_string(channel.name), memory_depth + backend_depth, backend_depth, in_flight_count,
        deferred_count, message_count, requeue_count, timeout_count, len(clients),
        "[%s]" % ",".join([client_json(c, pub_topic) for c in clients]) if include_clients else "null",
        "true" if paused else "false",
        go_json(_e2e(channel.e2e.query(), quantiles)) if quantiles else _NO_E2E_JSON,
    )


def _channel_doc(channel, figures, include_clients, quantiles, pub_topic):
    """The object of :func:`channel_stats` from the channel's ``figures`` (a ``ChannelFigures``)."""
    (memory_depth, backend_depth, in_flight_count, deferred_count, message_count, global_msg_count,
     requeue_count, timeout_count, clients, paused, policy, redrive_count) = figures
    doc = {
        "channel_name": channel.name,
        "depth": memory_depth + backend_depth,
        "backend_depth": backend_depth,
        "in_flight_count": in_flight_count,
        "deferred_count": deferred_count,
        "message_count": message_count,
    }
    if global_msg_count:
        doc["global_msg_count"] = global_msg_count
    doc["requeue_count"] = requeue_count
    doc["timeout_count"] = timeout_count
    if policy is not None:
        # Not in Go nsqd, only where a delivery policy applies: the effective policy and its counters.
        doc.update(policy)
    if redrive_count:
        # Not in Go nsqd, only once the channel was redriven from (POST /channel/redrive).
        doc["redrive_count"] = redrive_count
    doc["client_count"] = len(clients)
    doc["clients"] = [client_stats(c, pub_topic) for c in clients] if include_clients else None
    doc["paused"] = paused
    # Without quantiles the estimator holds no samples: nothing to query.
    doc["e2e_processing_latency"] = (
        _e2e(channel.e2e.query(), quantiles) if quantiles else {"count": 0, "percentiles": None}
    )
    return doc


def topic_stats(topic, channel_name, include_clients, quantiles, pub_topic=None, dead_letter=False,
                as_json=False, pacer=None):
    """A topic object, or None when a channel filter is given and the topic lacks it; ``dead_letter``:
    the topic is a dead-letter topic (``is_dead_letter_topic``, not in Go nsqd, only then);
    ``as_json``: its channels already written as a JSON array (a :class:`RawMessage`); ``pacer``:
    the walk's :class:`GILPacer` (None: one of its own)."""
    channel_doc = channel_json if as_json else channel_stats
    all_channels = sorted(topic.channels(), key=lambda c: c.name.encode())
    channels = all_channels
    if channel_name:
        channels = [c for c in channels if c.name == channel_name]
        if not channels:
            return None
    chans = []
    # Thousands of channels keep this thread on the GIL for tens of milliseconds: threads
    # waiting for it (teardowns, publishers) get it now and then, not only at forced switches.
    if pacer is None:
        pacer = GILPacer()
    for c in channels:
        chans.append(channel_doc(c, include_clients, quantiles, pub_topic))
        pacer.tick()
    # nsqd merges every channel's estimator, whatever the channel filter.
    if as_json:
        chans = RawMessage("[%s]" % ",".join(chans))
    estimators = [c.e2e for c in all_channels]
    depth, backend_depth, message_count, message_bytes, paused = topic.snapshot()
    if quantiles and estimators:
        merged = estimators[0].merged_query(estimators)
        e2e = _e2e(merged, quantiles)
    else:
        e2e = {"count": 0, "percentiles": None}
    doc = {
        "topic_name": topic.name,
        "channels": chans,
        "depth": depth,
        "backend_depth": backend_depth,
        "message_count": message_count,
        "message_bytes": message_bytes,
        "paused": paused,
        "e2e_processing_latency": e2e,
    }
    if dead_letter:
        # Not in Go nsqd, only on a dead-letter topic (after Go's keys): nsqadmin offers a redrive there.
        doc["is_dead_letter_topic"] = True
    return doc


def collect(nsqd, topic_name=None, channel_name=None, include_clients=True, include_mem=True, as_json=False,
            yield_to=None):
    """The whole /stats document as an ordered dict; ``as_json``: each topic's channels already
    written as JSON (:func:`channel_json`), for ``go_json``; ``yield_to``: the walk's
    :class:`GILPacer` waits while this is true (the network poller serves)."""
    pacer = GILPacer(yield_to)
    # An empty ``topic`` or ``channel`` means no filter, as in nsqd.
    quantiles = nsqd.options.e2e_processing_latency_percentiles
    topics = sorted(nsqd.topics(), key=lambda t: t.name.encode())
    if topic_name:
        topics = [t for t in topics if t.name == topic_name]
    topic_docs = []
    for t in topics:
        doc = topic_stats(t, channel_name, include_clients, quantiles, topic_name, nsqd.is_dead_letter_topic(t.name),
                          as_json, pacer)
        if doc is not None:
            topic_docs.append(doc)
    # An unknown topic: nsqd returns before collecting anything, producers included.
    unknown_topic = bool(topic_name) and not topics
    if unknown_topic:
        topic_docs = None
    out = {
        "version": nsqd.options.version,
        "health": nsqd.health(),
        "start_time": int(nsqd.start_time),
        "topics": topic_docs,
    }
    if include_mem:
        out["memory"] = memory_stats(nsqd)
    producers = None
    if include_clients and not unknown_topic:
        producers = [client_stats(c, topic_name) for c in nsqd.clients() if c.pub_counts] or None
    out["producers"] = producers
    return out


def memory_stats(nsqd):
    """Go's runtime memory keys, mapped to what Python can honestly report.

    heap_objects: blocks allocated by CPython's allocator (0 on PyPy);
    heap_in_use_bytes: resident set size; heap_idle/released: 0 (no Python
    equivalent); gc_pause_usec_*: percentiles of this broker's observed
    collection pauses; next_gc_bytes: 0; gc_total_runs: collections so far.
    """
    pauses = sorted(nsqd.gc_pauses())
    doc = {
        "heap_objects": sys.getallocatedblocks() if hasattr(sys, "getallocatedblocks") else 0,
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": rss_bytes(),
        "heap_released_bytes": 0,
        "gc_pause_usec_100": _pct(pauses, 100),
        "gc_pause_usec_99": _pct(pauses, 99),
        "gc_pause_usec_95": _pct(pauses, 95),
        "next_gc_bytes": 0,
        "gc_total_runs": gc_runs(),
    }
    return doc


def gc_runs():
    """Collections so far (CPython's per-generation counters; 0 where unavailable, as on PyPy)."""
    try:
        return sum(s.get("collections", 0) for s in gc.get_stats())
    except (AttributeError, TypeError):
        return 0


def _pct(sorted_values, p):
    n = len(sorted_values)
    if not n:
        return 0
    i = min(int(p / 100.0 * n + 0.5), n - 1)
    return int(sorted_values[i])


def rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# -- renderings --------------------------------------------------------------


def _human_ns(v):
    if v > 1e9:
        return "%0.1fs" % (v / 1e9)
    if v > 1e6:
        return "%0.1fms" % (v / 1e6)
    if v > 1e3:
        return "%0.1fus" % (v / 1e3)
    return "%0.1fns" % v


def _e2e_text(e2e):
    return ", ".join(_human_ns(p["value"]) for p in (e2e["percentiles"] or []))


def _connected(connect_ts, now):
    return format_duration(float(max(0, int(now - connect_ts))))


def render_text(stats, nsqd, now=None):
    """The default /stats text layout, byte for byte as nsqd prints it."""
    now = time.time() if now is None else now  # real time: uptime and connection ages
    start = stats["start_time"]
    lines = [
        "nsqd v%s (built w/%s)\n" % (stats["version"], runtime_name()),
        "start_time %s\n" % rfc3339(start),
        "uptime %s\n" % format_duration(now - nsqd.start_time),
    ]
    return "".join(lines) + render_text_body(stats, now)


def render_text_body(stats, now):
    """The text after the three header lines: health, memory, topics, producers.

    It depends on the /stats document alone (and ``now``, for the clients'
    connected times), so a test can render a JSON document it fetched.
    """
    lines = ["\nHealth: %s\n" % stats["health"]]
    if "memory" in stats:
        lines.append("\nMemory:\n")
        for key, value in stats["memory"].items():
            lines.append("   %-25s\t%d\n" % (key, value))
    for t in _section(lines, "Topics", stats["topics"], ""):
        lines.append(
            "\n%s[%-15s] depth: %-5d be-depth: %-5d msgs: %-8d e2e%%: %s\n"
            % (
                "*P " if t["paused"] else "   ",
                t["topic_name"],
                t["depth"],
                t["backend_depth"],
                t["message_count"],
                _e2e_text(t["e2e_processing_latency"]),
            )
        )
        for c in t["channels"]:
            lines.append(
                "%s[%-25s] depth: %-5d be-depth: %-5d inflt: %-4d def: %-4d re-q: %-5d "
                "timeout: %-5d msgs: %-8d e2e%%: %s\n"
                % (
                    "   *P " if c["paused"] else "      ",
                    c["channel_name"],
                    c["depth"],
                    c["backend_depth"],
                    c["in_flight_count"],
                    c["deferred_count"],
                    c["requeue_count"],
                    c["timeout_count"],
                    c["message_count"],
                    _e2e_text(c["e2e_processing_latency"]),
                )
            )
            if "max_attempts" in c:
                # Not in Go nsqd, only where a delivery policy applies (as in the JSON): the effective
                # policy and what it took out, on its own line so that Go's lines keep their shape.
                lines.append("%s  policy: max-attempts: %d dead-letter: %s ttl: %s dead-lettered: %d expired: %d\n" % (
                    "      ", c["max_attempts"], c["dead_letter_topic"] or "(drop)",
                    format_duration_ns(c["msg_ttl"] * 1000000) if c["msg_ttl"] else "none",
                    c.get("dead_letter_count", 0), c.get("expired_count", 0)))
            for cl in c["clients"] or []:
                lines.append("        %s\n" % client_text(cl, now))
    for p in _section(lines, "Producers", stats["producers"], "\n"):
        lines.append("   %s\n" % client_text(p, now))
    return "".join(lines)


def _section(lines, title, items, after_title):
    """Append nsqd's heading of a section (``Title: None`` when it has no ``items``); the items to print."""
    # after_title: nsqd ends the Producers heading with a newline, not the Topics one (each topic line starts with one).
    if not items:
        lines.append("\n%s: None\n" % title)
        return ()
    lines.append("\n%s:%s" % (title, after_title))
    return items


def client_text(cl, now):
    """nsqd's ClientV2Stats.String(): the producer form whenever pub_counts is shown."""
    port = cl["remote_address"].rpartition(":")[2]
    name = "%s:%s %s" % (cl["hostname"], port, cl["user_agent"])
    counts = cl.get("pub_counts")
    if counts:
        return "[V2 %-21s] msgs: %-8d topics: %s connected: %s" % (
            name,
            sum(pc["count"] for pc in counts),
            ",".join("%s=%d" % (pc["topic"], pc["count"]) for pc in counts),
            _connected(cl["connect_ts"], now),
        )
    return "[V2 %-21s] state: %d inflt: %-4d rdy: %-4d fin: %-8d re-q: %-8d msgs: %-8d connected: %s" % (
        name,
        cl["state"],
        cl["in_flight_count"],
        cl["ready_count"],
        cl["finish_count"],
        cl["requeue_count"],
        cl["message_count"],
        _connected(cl["connect_ts"], now),
    )


def runtime_name():
    impl = sys.implementation
    return "%s%d.%d.%d" % (impl.name, *impl.version[:3])


def rfc3339(ts):
    t = time.localtime(ts)
    offset = t.tm_gmtoff or 0
    if offset == 0:
        zone = "Z"
    else:
        sign = "+" if offset > 0 else "-"
        offset = abs(offset)
        zone = "%s%02d:%02d" % (sign, offset // 3600, (offset % 3600) // 60)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + zone
