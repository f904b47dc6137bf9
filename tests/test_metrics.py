"""GET /metrics: Prometheus text exposition format 0.0.4, checked by a strict parser.

The parser below is written from the format's rules (no dependency): every
family has exactly one ``# HELP`` and one ``# TYPE`` line before its samples,
a family's samples are contiguous, metric and label names are valid, label
values use only the ``\\\\``, ``\\"`` and ``\\n`` escapes, values are Go floats.
"""

import re
import types

import pytest

from nsqd_threaded.server.metrics import escape_label, render_prometheus
from test_http_api import HTTP, assert_error, assert_text
from wire import Conn, wait_for

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|Inf)\Z|NaN\Z")
TIMESTAMP = re.compile(r"-?[0-9]+\Z")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
SUFFIXES = {"summary": ("", "_sum", "_count"), "histogram": ("_bucket", "_sum", "_count")}


class ExpositionError(AssertionError):
    pass


def _unescape_help(text, lineno):
    out = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt == "\\":
                out.append("\\")
            elif nxt == "n":
                out.append("\n")
            else:
                raise ExpositionError("line %d: invalid escape \\%s in HELP" % (lineno, nxt))
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _parse_labels(line, pos, lineno):
    """Parse ``{name="value",...}`` starting at ``line[pos] == "{"``; returns (labels, next pos)."""
    labels = {}
    pos += 1
    while True:
        if line[pos : pos + 1] == "}":
            return labels, pos + 1
        m = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*").match(line, pos)
        if not m:
            raise ExpositionError("line %d: bad label name at %d" % (lineno, pos))
        name = m.group(0)
        if name.startswith("__"):
            raise ExpositionError("line %d: reserved label name %s" % (lineno, name))
        if name in labels:
            raise ExpositionError("line %d: duplicate label %s" % (lineno, name))
        pos = m.end()
        if line[pos : pos + 2] != '="':
            raise ExpositionError("line %d: expected =\" after label %s" % (lineno, name))
        pos += 2
        value = []
        while True:
            if pos >= len(line):
                raise ExpositionError("line %d: unterminated label value" % lineno)
            ch = line[pos]
            if ch == '"':
                pos += 1
                break
            if ch == "\\":
                nxt = line[pos + 1 : pos + 2]
                if nxt not in ("\\", '"', "n"):
                    raise ExpositionError("line %d: invalid escape \\%s in label value" % (lineno, nxt))
                value.append("\n" if nxt == "n" else nxt)
                pos += 2
            else:
                value.append(ch)
                pos += 1
        labels[name] = "".join(value)
        if line[pos : pos + 1] == ",":
            pos += 1
        elif line[pos : pos + 1] != "}":
            raise ExpositionError("line %d: expected , or } after label %s" % (lineno, name))


def parse_prometheus(text):
    """Parse a 0.0.4 exposition strictly; returns {family: {"help", "type", "samples"}} in order.

    ``samples`` is a list of (sample_name, labels dict, float value).
    """
    if text and not text.endswith("\n"):
        raise ExpositionError("exposition does not end with a newline")
    families = {}
    current = None  # the family whose samples are being read
    finished = set()  # families whose sample block is over
    seen = set()
    for lineno, line in enumerate(text.split("\n")[:-1], 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) < 3 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE"):
                raise ExpositionError("line %d: unexpected comment %r" % (lineno, line))
            kind, name = parts[1], parts[2]
            if not METRIC_NAME.match(name):
                raise ExpositionError("line %d: invalid metric name %r" % (lineno, name))
            fam = families.setdefault(name, {"help": None, "type": None, "samples": []})
            if fam["samples"] or name in finished:
                raise ExpositionError("line %d: %s for %s after its samples" % (lineno, kind, name))
            if kind == "HELP":
                if fam["help"] is not None:
                    raise ExpositionError("line %d: second HELP for %s" % (lineno, name))
                fam["help"] = _unescape_help(parts[3] if len(parts) > 3 else "", lineno)
            else:
                if fam["type"] is not None:
                    raise ExpositionError("line %d: second TYPE for %s" % (lineno, name))
                if len(parts) != 4 or parts[3] not in TYPES:
                    raise ExpositionError("line %d: bad TYPE line %r" % (lineno, line))
                fam["type"] = parts[3]
            if current is not None and current != name:
                finished.add(current)
                current = None
            continue
        m = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*").match(line)
        if not m:
            raise ExpositionError("line %d: invalid sample %r" % (lineno, line))
        sample_name = m.group(0)
        pos = m.end()
        labels = {}
        if line[pos : pos + 1] == "{":
            labels, pos = _parse_labels(line, pos, lineno)
        rest = line[pos:]
        if not rest.startswith((" ", "\t")):
            raise ExpositionError("line %d: no blank before the value" % lineno)
        fields = rest.split()
        if len(fields) not in (1, 2) or not FLOAT.match(fields[0]):
            raise ExpositionError("line %d: bad value in %r" % (lineno, line))
        if len(fields) == 2 and not TIMESTAMP.match(fields[1]):
            raise ExpositionError("line %d: bad timestamp in %r" % (lineno, line))
        family = None
        for name, fam in families.items():
            for suffix in SUFFIXES.get(fam["type"], ("",)):
                if sample_name == name + suffix:
                    family = name
        if family is None:
            raise ExpositionError("line %d: sample %s has no HELP/TYPE before it" % (lineno, sample_name))
        fam = families[family]
        if fam["help"] is None or fam["type"] is None:
            raise ExpositionError("line %d: family %s lacks HELP or TYPE" % (lineno, family))
        if family in finished or (current is not None and current != family):
            raise ExpositionError("line %d: samples of %s are not contiguous" % (lineno, family))
        current = family
        key = (sample_name, tuple(sorted(labels.items())))
        if key in seen:
            raise ExpositionError("line %d: duplicate sample %r" % (lineno, key))
        seen.add(key)
        value = float(fields[0].replace("Inf", "inf").replace("NaN", "nan"))
        fam["samples"].append((sample_name, labels, value))
    for name, fam in families.items():
        if fam["help"] is None or fam["type"] is None:
            raise ExpositionError("family %s lacks HELP or TYPE" % name)
    return families


def sample(families, name, **labels):
    """The value of the one sample ``name{labels}`` (labels matched exactly)."""
    values = [v for fam in families.values() for n, lab, v in fam["samples"] if n == name and lab == labels]
    assert len(values) == 1, (name, labels, values)
    return values[0]


def metrics(h):
    r = h.get("/metrics")
    assert r.status == 200
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse_prometheus(r.body.decode("utf-8"))


# -- the parser itself -----------------------------------------------------------------


GOOD = (
    "# HELP a_total Help with \\\\ and \\n escapes.\n"
    "# TYPE a_total counter\n"
    'a_total{x="q\\"uote",y="back\\\\slash",z="new\\nline"} 1.5e+03\n'
    "a_total 0\n"
    "# HELP s A summary.\n"
    "# TYPE s summary\n"
    's{quantile="0.99"} NaN\n'
    "s_sum +Inf\n"
    "s_count 3 1700000000000\n"
)


def test_parser_accepts_a_valid_exposition():
    fams = parse_prometheus(GOOD)
    assert list(fams) == ["a_total", "s"]
    assert fams["a_total"]["help"] == "Help with \\ and \n escapes."
    assert fams["a_total"]["samples"][0] == (
        "a_total",
        {"x": 'q"uote', "y": "back\\slash", "z": "new\nline"},
        1500.0,
    )
    assert sample(fams, "s_sum") == float("inf")


@pytest.mark.parametrize(
    "text",
    [
        "# TYPE a gauge\na 1\n",  # no HELP
        "# HELP a h\na 1\n",  # no TYPE
        "# HELP a h\n# HELP a h\n# TYPE a gauge\na 1\n",
        "# HELP a h\n# TYPE a gauge\n# TYPE a gauge\na 1\n",
        "# HELP a h\n# TYPE a gauge\na 1\n# HELP a h2\n",  # HELP after samples
        "# HELP a h\n# TYPE a gauge\n# HELP b h\n# TYPE b gauge\na 1\nb 1\na{x=\"y\"} 2\n",  # interleaved
        "# HELP a h\n# TYPE a wrong\na 1\n",
        "# HELP a h\n# TYPE a gauge\na one\n",
        "# HELP a h\n# TYPE a gauge\na 1",  # no final newline
        "# HELP 1a h\n# TYPE 1a gauge\n1a 1\n",
        '# HELP a h\n# TYPE a gauge\na{1x="v"} 1\n',
        '# HELP a h\n# TYPE a gauge\na{x="v\\t"} 1\n',  # invalid escape
        '# HELP a h\n# TYPE a gauge\na{x="v} 1\n',
        '# HELP a h\n# TYPE a gauge\na{x="v",x="w"} 1\n',
        '# HELP a h\n# TYPE a gauge\na{__x="v"} 1\n',
        "# HELP a h\n# TYPE a gauge\na 1\na 2\n",  # duplicate sample
        "# HELP a h\\t\n# TYPE a gauge\na 1\n",
        "# a comment\n# HELP a h\n# TYPE a gauge\na 1\n",
        "# HELP a h\n# TYPE a gauge\nb 1\n",
    ],
)
def test_parser_rejects_invalid_expositions(text):
    with pytest.raises(ExpositionError):
        parse_prometheus(text)


# -- escape_label (pure) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,escaped",
    [
        ("plain", "plain"),
        ("", ""),
        ("back\\slash", "back\\\\slash"),
        ('dq"uote', 'dq\\"uote'),
        ("new\nline", "new\\nline"),
        ('\\"\n', '\\\\\\"\\n'),
        ("\\n", "\\\\n"),  # a literal backslash-n is not a newline
        ("tab\tand unicode \u00e9\u2028", "tab\tand unicode \u00e9\u2028"),
        ("ua/1.0 (x; y)", "ua/1.0 (x; y)"),
    ],
)
def test_escape_label(raw, escaped):
    assert escape_label(raw) == escaped
    fams = parse_prometheus('# HELP m h\n# TYPE m gauge\nm{v="%s"} 1\n' % escape_label(raw))
    assert fams["m"]["samples"][0][1] == {"v": raw}


def test_rendering_escapes_awkward_label_values():
    """render_prometheus on a hand-made snapshot whose names need every escape."""
    awkward = 'we\\ird"top\nic'
    doc = {
        "version": "1.3.0",
        "health": "OK",
        "start_time": 1,
        "topics": [
            {
                "topic_name": awkward,
                "channels": [
                    {
                        "channel_name": 'c"h',
                        "depth": 1,
                        "backend_depth": 0,
                        "in_flight_count": 2,
                        "deferred_count": 3,
                        "message_count": 4,
                        "requeue_count": 5,
                        "timeout_count": 6,
                        "client_count": 0,
                        "clients": [],
                        "paused": True,
                        "e2e_processing_latency": {
                            "count": 2,
                            "percentiles": [{"quantile": 0.99, "value": 2500000.0}, {"quantile": 0.5, "value": 0.0}],
                        },
                    }
                ],
                "depth": 7,
                "backend_depth": 8,
                "message_count": 9,
                "message_bytes": 10,
                "paused": False,
                "e2e_processing_latency": {"count": 0, "percentiles": None},
            }
        ],
        "producers": None,
    }
    fams = parse_prometheus(render_prometheus(doc, types.SimpleNamespace(clients=lambda: [])))
    assert sample(fams, "nsq_topic_depth", topic=awkward) == 7
    assert sample(fams, "nsq_channel_paused", topic=awkward, channel='c"h') == 1
    assert sample(fams, "nsq_channel_e2e_processing_latency_seconds", topic=awkward, channel='c"h', quantile="0.99") == 0.0025
    assert sample(fams, "nsq_clients") == 0


# -- GET /metrics ----------------------------------------------------------------------


def test_metrics_route_and_methods(nsqd):
    h = HTTP(nsqd)
    r = h.post("/metrics")
    assert_error(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["Allow"] == "GET, OPTIONS"
    fams = metrics(h)
    assert sample(fams, "nsq_up") == 1
    assert sample(fams, "nsq_clients") == 0
    assert sample(fams, "nsq_start_time_seconds") == h.stats()["start_time"]
    for fam in fams.values():
        assert fam["help"] and fam["type"] in ("gauge", "counter")
        assert fam["samples"], "a family without samples is rendered"
    assert not any(name.startswith(("nsq_topic", "nsq_channel")) for name in fams)


def test_metrics_health(nsqd):
    h = HTTP(nsqd)
    nsqd.health_error = "no space left on device"
    try:
        assert sample(metrics(h), "nsq_up") == 0
    finally:
        nsqd.health_error = None
    assert sample(metrics(h), "nsq_up") == 1


TOPIC_KEYS = {
    "nsq_topic_depth": "depth",
    "nsq_topic_backend_depth": "backend_depth",
    "nsq_topic_messages_total": "message_count",
    "nsq_topic_message_bytes_total": "message_bytes",
    "nsq_topic_paused": "paused",
}
CHANNEL_KEYS = {
    "nsq_channel_depth": "depth",
    "nsq_channel_backend_depth": "backend_depth",
    "nsq_channel_in_flight": "in_flight_count",
    "nsq_channel_deferred": "deferred_count",
    "nsq_channel_messages_total": "message_count",
    "nsq_channel_requeued_total": "requeue_count",
    "nsq_channel_timed_out_total": "timeout_count",
    "nsq_channel_clients": "client_count",
    "nsq_channel_paused": "paused",
}


def assert_metrics_match_stats(fams, doc, tcp_clients):
    """Every topic/channel figure of a /stats JSON document, as /metrics shows it."""
    assert sample(fams, "nsq_up") == (1 if doc["health"] == "OK" else 0)
    assert sample(fams, "nsq_start_time_seconds") == doc["start_time"]
    assert sample(fams, "nsq_clients") == tcp_clients
    expected_series = 0
    for t in doc["topics"]:
        tl = {"topic": t["topic_name"]}
        for name, key in TOPIC_KEYS.items():
            assert sample(fams, name, **tl) == float(t[key]), (name, t["topic_name"])
            expected_series += 1
        for p in t["e2e_processing_latency"]["percentiles"] or []:
            q = repr(float(p["quantile"]))
            assert sample(fams, "nsq_topic_e2e_processing_latency_seconds", quantile=q, **tl) == pytest.approx(
                p["value"] / 1e9
            )
        for c in t["channels"]:
            cl = dict(tl, channel=c["channel_name"])
            for name, key in CHANNEL_KEYS.items():
                assert sample(fams, name, **cl) == float(c[key]), (name, cl)
                expected_series += 1
            for p in c["e2e_processing_latency"]["percentiles"] or []:
                q = repr(float(p["quantile"]))
                assert sample(
                    fams, "nsq_channel_e2e_processing_latency_seconds", quantile=q, **cl
                ) == pytest.approx(p["value"] / 1e9)
    # Nothing else is labelled by topic: no stale or extra series.
    labelled = [
        s
        for name, fam in fams.items()
        if name in TOPIC_KEYS or name in CHANNEL_KEYS
        for s in fam["samples"]
    ]
    assert len(labelled) == expected_series


def test_metrics_match_stats(make_nsqd):
    nsqd = make_nsqd(e2e_processing_latency_percentiles=[0.99, 0.5], mem_queue_size=2)
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as pub:
        sub.sub("m.t-1_x", "c", rdy=2)
        assert h.post("/channel/create?topic=m.t-1_x&channel=idle").status == 200
        assert h.post("/channel/create?topic=m.t-1_x&channel=e%23ephemeral").status == 200
        pub.mpub("m.t-1_x", [b"a", b"bb", b"ccc", b"dddd", b"eeeee"])
        got = [sub.read_message() for _ in range(2)]
        sub.cmd(b"RDY 0")
        sub.cmd(b"FIN " + got[0][2])
        sub.cmd(b"REQ " + got[1][2] + b" 0")
        assert h.post("/topic/create?topic=other").status == 200
        assert h.post("/topic/pause?topic=other").status == 200
        assert_text(h.post("/pub?topic=other", b"queued"), b"OK")

        def settled():
            c = h.stats(topic="m.t-1_x")["topics"][0]["channels"][0]
            return c["requeue_count"] == 1 and c["e2e_processing_latency"]["count"] == 1

        wait_for(settled, what="FIN and REQ")
        # Steady state: nothing moves until RDY changes.
        doc = h.stats()
        fams = metrics(h)
        assert h.stats(include_mem="false")["topics"] == doc["topics"]
        assert_metrics_match_stats(fams, doc, tcp_clients=2)
        assert sample(fams, "nsq_topic_paused", topic="other") == 1
        assert sample(fams, "nsq_topic_depth", topic="other") == 1
        assert sample(fams, "nsq_channel_depth", topic="m.t-1_x", channel="c") == 4
        assert sample(fams, "nsq_channel_depth", topic="m.t-1_x", channel="idle") == 5
        assert sample(fams, "nsq_channel_backend_depth", topic="m.t-1_x", channel="idle") == 3
        assert sample(fams, "nsq_channel_clients", topic="m.t-1_x", channel="c") == 1
        assert sample(fams, "nsq_channel_clients", topic="m.t-1_x", channel="e#ephemeral") == 0
        lat = sample(fams, "nsq_topic_e2e_processing_latency_seconds", topic="m.t-1_x", quantile="0.99")
        assert 0 < lat < 60
