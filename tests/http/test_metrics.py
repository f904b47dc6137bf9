"""GET /metrics: Prometheus text exposition format 0.0.4, checked by a strict parser.

The parser below is written from the format's rules (no dependency): every
family has exactly one ``# HELP`` and one ``# TYPE`` line before its samples,
a family's samples are contiguous, metric and label names are valid, label
values use only the ``\\\\``, ``\\"`` and ``\\n`` escapes, values are Go floats.
"""

import types

import pytest

from nsqd_threaded.server.metrics import escape_label, render_prometheus

from support.http_api import HTTP, assert_error, assert_text
from support.metrics import ExpositionError, assert_metrics_match_stats, parse_prometheus, sample  # noqa: F401 (fixtures among them)
from support.wire import Conn, wait_for


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
