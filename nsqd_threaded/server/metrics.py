"""Prometheus text exposition (format 0.0.4) of a /stats snapshot: GET /metrics.

Pure functions of the dict built by :func:`nsqd_threaded.broker.stats.collect`.
Metric names are documented in docs/metrics.md.
"""


def escape_label(value):
    """Label values escape backslash, double quote and newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return str(int(value))


class _Family:
    __slots__ = ("name", "kind", "help", "samples")

    def __init__(self, name, kind, help_text):
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples = []

    def add(self, labels, value, suffix=""):
        self.samples.append((suffix, labels, value))

    def render(self, out):
        out.append("# HELP %s %s\n" % (self.name, self.help.replace("\\", "\\\\").replace("\n", "\\n")))
        out.append("# TYPE %s %s\n" % (self.name, self.kind))
        for suffix, labels, value in self.samples:
            if labels:
                lab = ",".join('%s="%s"' % (k, escape_label(v)) for k, v in labels)
                out.append("%s%s{%s} %s\n" % (self.name, suffix, lab, _fmt(value)))
            else:
                out.append("%s%s %s\n" % (self.name, suffix, _fmt(value)))


TOPIC_METRICS = [
    ("depth", "nsq_topic_depth", "gauge", "Messages queued in the topic (memory + backend)."),
    ("backend_depth", "nsq_topic_backend_depth", "gauge", "Messages queued in the topic's backend (disk)."),
    ("message_count", "nsq_topic_messages_total", "counter", "Messages published to the topic since start."),
    ("message_bytes", "nsq_topic_message_bytes_total", "counter", "Body bytes published to the topic since start."),
    ("paused", "nsq_topic_paused", "gauge", "1 when the topic is paused."),
]

CHANNEL_METRICS = [
    ("depth", "nsq_channel_depth", "gauge", "Messages queued in the channel (memory + backend)."),
    ("backend_depth", "nsq_channel_backend_depth", "gauge", "Messages queued in the channel's backend (disk)."),
    ("in_flight_count", "nsq_channel_in_flight", "gauge", "Messages delivered and not yet finished."),
    ("deferred_count", "nsq_channel_deferred", "gauge", "Messages waiting for their deferral to end."),
    ("message_count", "nsq_channel_messages_total", "counter", "Messages put into the channel since start."),
    ("requeue_count", "nsq_channel_requeued_total", "counter", "REQ commands accepted since start."),
    ("timeout_count", "nsq_channel_timed_out_total", "counter", "In-flight messages that timed out since start."),
    ("client_count", "nsq_channel_clients", "gauge", "Subscribed client connections."),
    ("paused", "nsq_channel_paused", "gauge", "1 when the channel is paused."),
]

# Only for a channel a delivery policy applies to (not in Go nsqd; see docs/policies.md).
CHANNEL_POLICY_METRICS = [
    ("dead_letter_count", "nsq_channel_dead_lettered_total", "counter",
     "Messages taken out for exceeding max attempts (moved to the dead-letter topic or dropped)."),
    ("expired_count", "nsq_channel_expired_total", "counter",
     "Messages taken out for exceeding the message TTL (moved to the dead-letter topic or dropped)."),
]

# Only for a channel that was redriven from (not in Go nsqd; see docs/policies.md).
CHANNEL_REDRIVE_METRIC = ("nsq_channel_redriven_total", "counter",
                          "Messages sent back from the channel to their source topic by POST /channel/redrive.")


def render_prometheus(doc, nsqd):
    fams = {}

    def fam(name, kind, help_text):
        f = fams.get(name)
        if f is None:
            f = fams[name] = _Family(name, kind, help_text)
        return f

    up = fam("nsq_up", "gauge", "1 when the broker is healthy (last backend write succeeded).")
    up.add((), 1 if doc["health"] == "OK" else 0)
    fam("nsq_start_time_seconds", "gauge", "Broker start time, Unix seconds.").add((), doc["start_time"])
    e2e_t = fam("nsq_topic_e2e_processing_latency_seconds", "gauge",
                "Publish-to-FIN latency quantiles over the sliding window, merged over the topic's channels.")
    e2e_c = fam("nsq_channel_e2e_processing_latency_seconds", "gauge",
                "Publish-to-FIN latency quantiles over the sliding window.")
    for t in doc["topics"] or []:
        tl = (("topic", t["topic_name"]),)
        for key, name, kind, help_text in TOPIC_METRICS:
            fam(name, kind, help_text).add(tl, t[key])
        _summary(e2e_t, tl, t["e2e_processing_latency"])
        for c in t["channels"]:
            cl = tl + (("channel", c["channel_name"]),)
            for key, name, kind, help_text in CHANNEL_METRICS:
                fam(name, kind, help_text).add(cl, c[key])
            if "dead_letter_count" in c:
                for key, name, kind, help_text in CHANNEL_POLICY_METRICS:
                    fam(name, kind, help_text).add(cl, c[key])
            if "redrive_count" in c:
                fam(*CHANNEL_REDRIVE_METRIC).add(cl, c["redrive_count"])
            _summary(e2e_c, cl, c["e2e_processing_latency"])
    connected = nsqd.clients()
    clients = fam("nsq_clients", "gauge", "Connected TCP clients.")
    clients.add((), len(connected))
    if connected:
        fam("nsq_clients_tls", "gauge", "Connected TCP clients upgraded to TLS.").add(
            (), sum(1 for c in connected if c.tls))
        compressed = fam("nsq_clients_compressed", "gauge", "Connected TCP clients using compression.")
        for codec in ("deflate", "snappy"):
            compressed.add((("codec", codec),), sum(1 for c in connected if getattr(c, codec)))
    mem = doc.get("memory") or {}
    if mem:
        fam("process_resident_memory_bytes", "gauge", "Resident set size in bytes.").add((), mem["heap_in_use_bytes"])
        fam("python_gc_collections_total", "counter", "Garbage collections since the process started.").add(
            (), mem["gc_total_runs"]
        )
    out = []
    for f in fams.values():
        if f.samples:
            f.render(out)
    return "".join(out)


def _summary(family, labels, e2e):
    """One sample per configured quantile (the estimator keeps no sum, so no summary type)."""
    for p in e2e["percentiles"] or []:
        family.add(labels + (("quantile", repr(float(p["quantile"]))),), p["value"] / 1e9)
