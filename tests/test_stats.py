"""GET /stats: JSON against golden files written from http-api.md §8.1, and the §8.2 text layout.

Golden files (tests/golden/):

* ``stats_schema.json``: for every JSON object kind (top level, topic, channel,
  client, pub count, e2e, percentile, memory), its keys in order with their
  types and omission rules.  ``check_schema`` applies it to every document
  fetched here.
* ``stats_*.json``: whole documents for given scenarios, compared key by key
  (same keys, same order, same JSON types, same values).  Placeholders stand
  for volatile values: ``"<int>"``, ``"<number>"``, ``"<string>"`` and
  ``"<address>"`` (a local ``ip:port``).
* ``stats_text_input.json`` / ``stats_text_expected.txt``: a hand-made snapshot
  and its text rendering, written with the §8.2 format strings.
"""

import datetime
import json
import pathlib
import re
import time
import types

import pytest

from nsqd_threaded.broker.stats import render_text
from test_http_api import HTTP, assert_text
from test_metrics import assert_metrics_match_stats, parse_prometheus, sample
from wire import Conn, wait_for

GOLDEN = pathlib.Path(__file__).parent / "golden"
SCHEMA = json.loads((GOLDEN / "stats_schema.json").read_text())

# Go Duration strings: the uptime (full precision) and "connected" (whole seconds).
UPTIME_RE = r"(?:(?:\d+h)?(?:\d+m)?\d+(?:\.\d+)?s|\d+(?:\.\d+)?(?:ms|µs|ns))"
CONNECTED_RE = r"(?:\d+h\d+m\d+s|\d+m\d+s|\d+s)"
HEADER_RE = (
    r"nsqd v1\.3\.0 \(built w/\S+\)\n"
    r"start_time (?P<start>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:\d\d))\n"
    r"uptime (?P<uptime>" + UPTIME_RE + r")\n"
)


def golden(name):
    return json.loads((GOLDEN / name).read_text())


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), "duplicate keys %r" % keys
    return dict(pairs)


def get_json(h, **params):
    """Raw /stats JSON: checked compact and duplicate-free, then decoded in key order."""
    params.setdefault("format", "json")
    query = "&".join("%s=%s" % kv for kv in params.items())
    r = h.get("/stats?" + query)
    assert r.status == 200
    assert r.headers["Content-Type"] == "application/json; charset=utf-8"
    assert r.headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    assert b"\n" not in r.body and b'": ' not in r.body and b", " not in r.body
    doc = json.loads(r.body, object_pairs_hook=_no_duplicate_keys)
    check_schema(doc)
    return doc, r.body


def get_text(h, **params):
    query = "&".join("%s=%s" % kv for kv in params.items())
    r = h.get("/stats" + ("?" + query if query else ""))
    assert_text(r, r.body)
    return r.body.decode()


def match_golden(actual, expected, path="$"):
    """``actual`` equals the golden ``expected``: same keys in the same order, same types and values."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), (path, actual)
        assert list(actual) == list(expected), (path, list(actual), list(expected))
        for key in expected:
            match_golden(actual[key], expected[key], "%s.%s" % (path, key))
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), (path, actual)
        for i, (a, e) in enumerate(zip(actual, expected)):
            match_golden(a, e, "%s[%d]" % (path, i))
    elif expected == "<int>":
        assert type(actual) is int, (path, actual)
    elif expected == "<number>":
        assert type(actual) in (int, float), (path, actual)
    elif expected == "<string>":
        assert type(actual) is str, (path, actual)
    elif expected == "<address>":
        assert type(actual) is str and re.fullmatch(r"127\.0\.0\.1:\d{1,5}", actual), (path, actual)
    else:
        assert type(actual) is type(expected) and actual == expected, (path, actual, expected)


def _check_type(value, typ, path):
    alternatives = typ.split("|")
    if value is None:
        assert "null" in alternatives, (path, "null not allowed")
        return
    kind = alternatives[0]
    if kind == "string":
        assert type(value) is str, (path, value)
    elif kind == "int":
        assert type(value) is int, (path, value)
    elif kind == "bool":
        assert type(value) is bool, (path, value)
    elif kind == "number":
        assert type(value) in (int, float), (path, value)
    elif kind.startswith("array:"):
        assert type(value) is list, (path, value)
        for i, item in enumerate(value):
            check_schema(item, kind[6:], "%s[%d]" % (path, i))
    elif kind.startswith("object:"):
        check_schema(value, kind[7:], path)
    else:
        raise AssertionError("bad schema type %r" % typ)


def check_schema(obj, kind="top", path="$"):
    """``obj`` follows stats_schema.json: known keys, schema order, required keys, omitempty, types."""
    assert type(obj) is dict, (path, obj)
    entries = SCHEMA[kind]
    order = [e[0] for e in entries]
    unknown = [k for k in obj if k not in order]
    assert not unknown, (path, unknown)
    positions = [order.index(k) for k in obj]
    assert positions == sorted(positions), (path, "key order", list(obj))
    for key, typ, *rule in entries:
        if key not in obj:
            assert rule, (path, "missing", key)
            continue
        value = obj[key]
        if rule == ["omitempty"]:
            assert value not in (0, "", False, None, []), (path, key, "omitempty key present with", value)
        _check_type(value, typ, "%s.%s" % (path, key))


# -- the text layout (§8.2), written independently from the format strings --------------


def spec_human(v):
    if v > 1e9:
        return "%0.1fs" % (v / 1e9)
    if v > 1e6:
        return "%0.1fms" % (v / 1e6)
    if v > 1e3:
        return "%0.1fus" % (v / 1e3)
    return "%0.1fns" % v


def spec_e2e(e2e):
    return ", ".join(spec_human(p["value"]) for p in e2e["percentiles"] or [])


CONNECTED = "\x00connected\x00"  # replaced by CONNECTED_RE


def spec_client(c):
    ident = "%s:%s %s" % (c["hostname"], c["remote_address"].rsplit(":", 1)[1], c["user_agent"])
    if c.get("pub_counts"):
        return "[V2 %-21s] msgs: %-8d topics: %s connected: %s" % (
            ident,
            sum(p["count"] for p in c["pub_counts"]),
            ",".join("%s=%d" % (p["topic"], p["count"]) for p in c["pub_counts"]),
            CONNECTED,
        )
    return "[V2 %-21s] state: %d inflt: %-4d rdy: %-4d fin: %-8d re-q: %-8d msgs: %-8d connected: %s" % (
        ident,
        c["state"],
        c["in_flight_count"],
        c["ready_count"],
        c["finish_count"],
        c["requeue_count"],
        c["message_count"],
        CONNECTED,
    )


def spec_body(doc):
    """The text after the three header lines, from a JSON document (memory excluded)."""
    out = "\nHealth: %s\n" % doc["health"]
    assert "memory" not in doc
    if not doc["topics"]:
        out += "\nTopics: None\n"
    else:
        out += "\nTopics:"
        for t in doc["topics"]:
            out += "\n%s[%-15s] depth: %-5d be-depth: %-5d msgs: %-8d e2e%%: %s\n" % (
                "*P " if t["paused"] else "   ",
                t["topic_name"],
                t["depth"],
                t["backend_depth"],
                t["message_count"],
                spec_e2e(t["e2e_processing_latency"]),
            )
            for c in t["channels"]:
                out += (
                    "%s[%-25s] depth: %-5d be-depth: %-5d inflt: %-4d def: %-4d re-q: %-5d timeout: %-5d "
                    "msgs: %-8d e2e%%: %s\n"
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
                        spec_e2e(c["e2e_processing_latency"]),
                    )
                )
                for cl in c["clients"] or []:
                    out += "        %s\n" % spec_client(cl)
    if not doc["producers"]:
        out += "\nProducers: None\n"
    else:
        out += "\nProducers:\n"
        for p in doc["producers"]:
            out += "   %s\n" % spec_client(p)
    return out


def assert_text_matches(text, doc):
    """``text`` is the §8.2 rendering of the JSON document ``doc`` (taken in the same steady state)."""
    m = re.match(HEADER_RE, text)
    assert m, text[:300]
    start = datetime.datetime.fromisoformat(m.group("start").replace("Z", "+00:00"))
    assert int(start.timestamp()) == doc["start_time"]
    body = re.escape(spec_body(doc)).replace(re.escape(CONNECTED), CONNECTED_RE)
    assert re.fullmatch(body, text[m.end() :]), "\n" + text[m.end() :] + "\n--- expected ---\n" + spec_body(doc)


# -- JSON: golden documents ------------------------------------------------------------


def test_no_topics(nsqd):
    h = HTTP(nsqd)
    doc, _ = get_json(h)
    match_golden(doc, golden("stats_no_topics.json"))
    _, raw = get_json(h, include_mem="false")
    expected = '{"version":"1.3.0","health":"OK","start_time":%d,"topics":[],"producers":null}'
    assert raw == (expected % doc["start_time"]).encode()
    assert abs(doc["start_time"] - nsqd.start_time) < 1


def test_unknown_topic_filter_is_null(nsqd):
    h = HTTP(nsqd)
    assert h.post("/topic/create?topic=known").status == 200
    doc, _ = get_json(h, topic="unknown")
    match_golden(doc, golden("stats_unknown_topic.json"))
    text = get_text(h, topic="unknown", include_mem="false")
    assert text.endswith("\nHealth: OK\n\nTopics: None\n\nProducers: None\n")


def test_unknown_topic_filter_reports_no_producers(nsqd):
    # nsqd's GetStats returns before collecting producers when the topic is unknown.
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as pub:
        pub.pub("known", b"x")
        assert len(h.stats()["producers"]) == 1
        doc, _ = get_json(h, topic="unknown", include_mem="false")
        assert (doc["topics"], doc["producers"]) == (None, None)


def test_empty_topic_or_channel_parameter_means_no_filter(nsqd):
    h = HTTP(nsqd)
    for t in ("a", "b"):
        assert h.post("/topic/create?topic=" + t).status == 200
        assert h.post("/channel/create?topic=%s&channel=c" % t).status == 200
    everything, _ = get_json(h, include_mem="false")
    assert [t["topic_name"] for t in everything["topics"]] == ["a", "b"]
    assert get_json(h, include_mem="false", topic="")[0] == everything
    assert get_json(h, include_mem="false", channel="")[0] == everything


def channel_filter_setup(h):
    for topic, channels in (("a", ["y", "x"]), ("b", ["x"]), ("c", [])):
        assert h.post("/topic/create?topic=" + topic).status == 200
        for ch in channels:
            assert h.post("/channel/create?topic=%s&channel=%s" % (topic, ch)).status == 200
    assert_text(h.post("/mpub?topic=a", b"m1\nm22"), b"OK")
    assert_text(h.post("/pub?topic=b", b"z"), b"OK")


def test_channel_filter(nsqd):
    h = HTTP(nsqd)
    channel_filter_setup(h)
    doc, _ = get_json(h, channel="y", include_mem="false")
    match_golden(doc, golden("stats_channel_filter.json"))
    assert get_json(h, channel="y", topic="a", include_mem="false")[0] == doc
    # Topics lacking the channel are left out; possibly all of them.
    doc, _ = get_json(h, channel="x", include_mem="false")
    assert [(t["topic_name"], [c["channel_name"] for c in t["channels"]]) for t in doc["topics"]] == [
        ("a", ["x"]),
        ("b", ["x"]),
    ]
    doc, _ = get_json(h, channel="nosuch", include_mem="false")
    assert doc["topics"] == []
    doc, _ = get_json(h, channel="x", topic="c", include_mem="false")
    assert doc["topics"] == []
    # Sorted by name (byte order) without a filter.
    doc, _ = get_json(h, include_mem="false")
    assert [t["topic_name"] for t in doc["topics"]] == ["a", "b", "c"]
    assert [c["channel_name"] for c in doc["topics"][0]["channels"]] == ["x", "y"]


def test_sort_order_is_byte_order(nsqd):
    h = HTTP(nsqd)
    names = ["b", "B", "a.b", "a-b", "a_b", "a", "Z9", "0", "a#ephemeral"]
    for n in names:
        assert h.post("/topic/create?topic=" + n.replace("#", "%23")).status == 200
    doc, _ = get_json(h, include_mem="false")
    assert [t["topic_name"] for t in doc["topics"]] == sorted(names, key=str.encode)


def test_include_clients_false(nsqd):
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as pub:
        sub.sub("t", "c", rdy=0)
        pub.pub("t", b"hello")
        for value in ("false", "0"):
            doc, _ = get_json(h, include_clients=value, include_mem="false")
            match_golden(doc, golden("stats_no_clients.json"))
        text = get_text(h, include_clients="false", include_mem="false")
        assert "[V2 " not in text and text.endswith("\nProducers: None\n")
        # Anything but true/1/false/0 is the default (true).
        for value in ("true", "1", "yes", ""):
            doc, _ = get_json(h, include_clients=value, include_mem="false")
            assert doc["topics"][0]["channels"][0]["clients"] != None  # noqa: E711
            assert len(doc["producers"]) == 1


def test_include_mem(nsqd):
    h = HTTP(nsqd)
    for value in ("false", "0"):
        doc, _ = get_json(h, include_mem=value)
        assert list(doc) == ["version", "health", "start_time", "topics", "producers"]
        text = get_text(h, include_mem=value)
        assert "Memory:" not in text
    for value in ("true", "1", "no", "FALSE"):
        doc, _ = get_json(h, include_mem=value)
        assert list(doc) == ["version", "health", "start_time", "topics", "memory", "producers"]
        match_golden(doc["memory"], golden("stats_no_topics.json")["memory"])
        assert doc["memory"]["heap_in_use_bytes"] > 0


def test_format_other_than_json_is_text(nsqd):
    h = HTTP(nsqd)
    for value in ("text", "JSON", "", "json2"):
        assert get_text(h, format=value).startswith("nsqd v1.3.0 (built w/")


def test_client_and_producer_objects(nsqd):
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as pub:
        sub.identify(client_id="golden-client", hostname="golden-host", user_agent="golden/1.0")
        sub.sub("t", "c", rdy=3)
        pub.pub("t", b"hello")
        sub.read_message()
        wait_for(lambda: h.stats()["topics"][0]["channels"][0]["in_flight_count"] == 1, what="delivery")
        doc, _ = get_json(h, include_mem="false")
        match_golden(doc, golden("stats_clients.json"))
        consumer = doc["topics"][0]["channels"][0]["clients"][0]
        producer = doc["producers"][0]
        assert consumer["remote_address"] == "%s:%d" % sub.sock.getsockname()[:2]
        assert producer["remote_address"] == "%s:%d" % pub.sock.getsockname()[:2]
        assert abs(consumer["connect_ts"] - time.time()) < 60


def test_json_strings_are_escaped_as_go_1_19_does(nsqd):
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as sub:
        sub.identify(hostname='b\bf\f n\n t\t q" s\\ <&> \u2028 \x01 \u00e9', client_id="c")
        sub.sub("esc", "c")
        _, raw = get_json(h, include_mem="false")
        expected = '"hostname":"b\\u0008f\\u000c n\\n t\\t q\\" s\\\\ \\u003c\\u0026\\u003e \\u2028 \\u0001 \u00e9"'
        assert expected.encode() in raw, raw


def test_pub_counts_hold_at_most_one_topic(nsqd):
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as pub:
        pub.pub("t2", b"x")
        pub.mpub("t2", [b"y", b"z"])
        pub.pub("t3", b"w")
        assert h.post("/topic/create?topic=t4").status == 200
        doc, _ = get_json(h, include_mem="false")
        (producer,) = doc["producers"]
        assert producer["pub_counts"] in ([{"topic": "t2", "count": 3}], [{"topic": "t3", "count": 1}])
        # With a topic filter, that topic's count only ...
        doc, _ = get_json(h, topic="t2", include_mem="false")
        assert doc["producers"][0]["pub_counts"] == [{"topic": "t2", "count": 3}]
        doc, _ = get_json(h, topic="t3", include_mem="false")
        assert doc["producers"][0]["pub_counts"] == [{"topic": "t3", "count": 1}]
        # ... and none (the key is omitted) when it did not publish there.
        doc, _ = get_json(h, topic="t4", include_mem="false")
        assert "pub_counts" not in doc["producers"][0]
        text = get_text(h, topic="t2", include_mem="false")
        port = pub.sock.getsockname()[1]
        line = "   [V2 %-21s] msgs: 3        topics: t2=3 connected: " % ("127.0.0.1:%d " % port)
        assert re.search("\n" + re.escape(line) + CONNECTED_RE + "\n", text), text


def test_a_subscriber_that_publishes_shows_pub_counts_in_its_channel(nsqd):
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as both:
        both.sub("tb", "c", rdy=1)
        both.pub("tb", b"self")
        both.read_message()
        doc, _ = get_json(h, include_mem="false")
        client = doc["topics"][0]["channels"][0]["clients"][0]
        assert client["pub_counts"] == [{"topic": "tb", "count": 1}]
        assert doc["producers"][0]["remote_address"] == client["remote_address"]
        assert_text_matches(get_text(h, include_mem="false"), doc)


# -- e2e processing latency --------------------------------------------------------------


def test_e2e_without_percentiles_configured(nsqd):
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as sub:
        sub.sub("e", "c", rdy=1)
        assert_text(h.post("/pub?topic=e", b"x"), b"OK")
        sub.cmd(b"FIN " + sub.read_message()[2])
        wait_for(lambda: h.stats()["topics"][0]["channels"][0]["in_flight_count"] == 0, what="FIN")
        t = h.stats()["topics"][0]
        assert t["e2e_processing_latency"] == {"count": 0, "percentiles": None}
        assert t["channels"][0]["e2e_processing_latency"] == {"count": 0, "percentiles": None}


def test_e2e_configured_without_samples(make_nsqd):
    nsqd = make_nsqd(e2e_processing_latency_percentiles=[0.5, 0.99])
    h = HTTP(nsqd)
    assert h.post("/topic/create?topic=with").status == 200
    assert h.post("/channel/create?topic=with&channel=c").status == 200
    assert h.post("/topic/create?topic=without").status == 200
    doc, raw = get_json(h, include_mem="false")
    match_golden(doc, golden("stats_e2e_no_samples.json"))
    assert b'"e2e_processing_latency":{"count":0,"percentiles":[{"quantile":0.99,"value":0},' in raw
    text = get_text(h, include_mem="false")
    assert "\n   [with           ] depth: 0     be-depth: 0     msgs: 0        e2e%: 0.0ns, 0.0ns\n" in text
    assert "\n   [without        ] depth: 0     be-depth: 0     msgs: 0        e2e%: \n" in text


def test_e2e_after_fins(make_nsqd):
    nsqd = make_nsqd(e2e_processing_latency_percentiles=[0.99, 0.5])
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as s1, Conn(nsqd.tcp_address) as s2:
        s1.sub("lat", "c1", rdy=10)
        s2.sub("lat", "c2", rdy=10)
        # Deferred by 200 ms: every sample (publish to FIN) is at least 2e8 ns.
        for i in range(6):
            assert_text(h.post("/pub?topic=lat&defer=200", b"m%d" % i), b"OK")
        for conn, n in ((s1, 6), (s2, 4)):
            for _ in range(n):
                conn.cmd(b"FIN " + conn.read_message()[2])

        def counts():
            t = h.stats(topic="lat")["topics"][0]
            return [t["e2e_processing_latency"]["count"]] + [
                c["e2e_processing_latency"]["count"] for c in t["channels"]
            ]

        wait_for(lambda: counts() == [10, 6, 4], what="10 e2e samples")
        doc, _ = get_json(h, topic="lat", include_mem="false")
        t = doc["topics"][0]
        for e2e in [t["e2e_processing_latency"]] + [c["e2e_processing_latency"] for c in t["channels"]]:
            quantiles = [p["quantile"] for p in e2e["percentiles"]]
            values = [p["value"] for p in e2e["percentiles"]]
            assert quantiles == [0.99, 0.5]
            assert all(2e8 <= v < 60e9 for v in values), values  # nanoseconds
            assert values[0] >= values[1]
        # The topic merges every channel, whatever the channel filter.
        filtered, _ = get_json(h, topic="lat", channel="c2", include_mem="false")
        assert filtered["topics"][0]["e2e_processing_latency"]["count"] == 10
        assert filtered["topics"][0]["channels"][0]["e2e_processing_latency"]["count"] == 4
        assert_text_matches(get_text(h, topic="lat", include_mem="false"), doc)


# -- text layout ----------------------------------------------------------------------------


def test_text_layout_golden():
    """render_text of a hand-made snapshot against the layout written from §8.2's format strings."""
    doc = golden("stats_text_input.json")
    text = render_text(doc, types.SimpleNamespace(start_time=0.0), now=89.89221617)
    m = re.match(HEADER_RE, text)
    assert m, text[:200]
    assert m.group("uptime") == "1m29.89221617s"
    assert text[m.end() :] == (GOLDEN / "stats_text_expected.txt").read_text()


@pytest.mark.parametrize(
    "value,human",
    [
        (0, "0.0ns"),
        (999.0, "999.0ns"),
        (1000, "1000.0ns"),
        (1001, "1.0us"),
        (1000000, "1000.0us"),
        (1500000, "1.5ms"),
        (1000000000, "1000.0ms"),
        (1000000001, "1.0s"),
        (10800000000, "10.8s"),
        (3661000000000, "3661.0s"),
    ],
)
def test_text_e2e_human_units(value, human):
    doc = golden("stats_text_input.json")
    del doc["memory"]
    doc["producers"] = None
    doc["topics"] = [doc["topics"][0]]
    doc["topics"][0]["e2e_processing_latency"] = {"count": 1, "percentiles": [{"quantile": 0.5, "value": value}]}
    text = render_text(doc, types.SimpleNamespace(start_time=0.0), now=1.0)
    assert "msgs: 5        e2e%%: %s\n" % human in text


def test_text_with_no_topics_and_memory(nsqd):
    h = HTTP(nsqd)
    text = get_text(h)
    memory = "".join(r"   %-25s\t\d+\n" % k for k in golden("stats_no_topics.json")["memory"])
    assert re.fullmatch(HEADER_RE + r"\nHealth: OK\n\nMemory:\n" + memory + r"\nTopics: None\n\nProducers: None\n", text), text
    m = re.match(HEADER_RE, text)
    start = datetime.datetime.fromisoformat(m.group("start").replace("Z", "+00:00"))
    assert abs(start.timestamp() - nsqd.start_time) < 1


def test_text_matches_json(nsqd):
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as c1, Conn(nsqd.tcp_address) as c2, Conn(nsqd.tcp_address) as p:
        c1.identify(client_id="one", hostname="host-one", user_agent="ua/1")
        c1.sub("tt", "ch", rdy=3)
        c2.identify(client_id="two", hostname="a-host-name-longer-than-21-chars", user_agent="go-nsq/1.1.0")
        c2.sub("tt", "paused-ch", rdy=0)
        p.mpub("tt", [b"a", b"b"])
        c1.read_message(), c1.read_message()
        assert h.post("/channel/pause?topic=tt&channel=paused-ch").status == 200
        assert h.post("/topic/create?topic=a-topic-name-longer-than-15").status == 200
        assert h.post("/topic/pause?topic=a-topic-name-longer-than-15").status == 200
        assert_text(h.post("/pub?topic=a-topic-name-longer-than-15", b"q"), b"OK")
        wait_for(lambda: h.stats(topic="tt")["topics"][0]["channels"][0]["in_flight_count"] == 2, what="delivery")
        doc, _ = get_json(h, include_mem="false")
        text = get_text(h, include_mem="false")
        assert_text_matches(text, doc)
        assert "\n*P [a-topic-name-longer-than-15] depth: 1     be-depth: 0     msgs: 1        e2e%: \n" in text
        assert "\n   *P [paused-ch                ] depth: 2     be-depth: 0     inflt: 0    def: 0    " in text
        # Filters apply to the text too.
        doc, _ = get_json(h, topic="tt", channel="ch", include_mem="false")
        assert_text_matches(get_text(h, topic="tt", channel="ch", include_mem="false"), doc)


# -- the acceptance scenario ------------------------------------------------------------------


def test_every_message_state_in_json_text_and_metrics_at_once(make_nsqd):
    """One topic, 3 channels, 5 clients; messages queued in memory, overflowed to the backend,
    in flight, deferred, requeued, timed out and finished."""
    nsqd = make_nsqd(mem_queue_size=3, e2e_processing_latency_percentiles=[0.99, 0.5])
    h = HTTP(nsqd)
    T = "acc"
    with Conn(nsqd.tcp_address) as a, Conn(nsqd.tcp_address) as b, Conn(nsqd.tcp_address) as c, Conn(
        nsqd.tcp_address
    ) as d, Conn(nsqd.tcp_address) as p:
        a.identify(client_id="A", hostname="host-a", user_agent="acc/1")
        a.sub(T, "c2", rdy=5)
        b.sub(T, "c2")
        c.identify(client_id="C", hostname="host-c", msg_timeout=1000)
        c.sub(T, "c3", rdy=1)
        d.sub(T, "c3")
        assert h.post("/channel/create?topic=acc&channel=c1").status == 200
        assert p.mpub(T, [b"m1", b"m2", b"m3", b"m4", b"m5"]) == b"OK"

        # c2: A gets all five (3 from memory, 2 from the backend), then:
        got = [a.read_message() for _ in range(5)]
        assert [m[3] for m in got] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
        a.cmd(b"RDY 0")
        a.cmd(b"FIN " + got[0][2])  # finished
        a.cmd(b"REQ " + got[1][2] + b" 60000")  # deferred
        a.cmd(b"REQ " + got[2][2] + b" 0")  # requeued (stays queued: RDY 0)
        # m4, m5 stay in flight.
        # c3: C takes m1 and lets it time out (msg_timeout 1000 ms).
        assert c.read_message()[3] == b"m1"
        c.cmd(b"RDY 0")

        def settled():
            chans = {x["channel_name"]: x for x in h.stats(topic=T)["topics"][0]["channels"]}
            return (
                chans["c3"]["timeout_count"] == 1
                and chans["c2"]["requeue_count"] == 2
                and chans["c2"]["e2e_processing_latency"]["count"] == 1
            )

        wait_for(settled, what="FIN, REQs and the timeout")
        doc, _ = get_json(h)
        fams = parse_prometheus(h.get("/metrics").body.decode())
        text = get_text(h, include_mem="false")
        doc_nomem, _ = get_json(h, include_mem="false")

    # /stats JSON
    assert [t["topic_name"] for t in doc["topics"]] == [T]
    t = doc["topics"][0]
    assert (t["depth"], t["backend_depth"], t["message_count"], t["message_bytes"], t["paused"]) == (0, 0, 5, 10, False)
    assert t["e2e_processing_latency"]["count"] == 1
    chans = {x["channel_name"]: x for x in t["channels"]}
    assert list(chans) == ["c1", "c2", "c3"]

    def figures(ch):
        keys = ["depth", "backend_depth", "in_flight_count", "deferred_count", "message_count"]
        keys += ["requeue_count", "timeout_count", "client_count", "paused"]
        return {k: ch[k] for k in keys}

    base = dict(in_flight_count=0, deferred_count=0, message_count=5, requeue_count=0, timeout_count=0, paused=False)
    assert figures(chans["c1"]) == dict(base, depth=5, backend_depth=2, client_count=0)
    assert "global_msg_count" not in chans["c1"]
    assert figures(chans["c2"]) == dict(
        base, depth=1, backend_depth=0, in_flight_count=2, deferred_count=1, requeue_count=2, client_count=2
    )
    assert chans["c2"]["global_msg_count"] == 3  # deliveries from the backend are not counted
    assert figures(chans["c3"]) == dict(base, depth=5, backend_depth=2, timeout_count=1, client_count=2)
    assert chans["c3"]["global_msg_count"] == 1
    assert chans["c2"]["e2e_processing_latency"]["count"] == 1
    assert all(p["value"] > 0 for p in chans["c2"]["e2e_processing_latency"]["percentiles"])
    assert chans["c3"]["e2e_processing_latency"]["count"] == 0

    def client_figures(cl):
        keys = ["client_id", "hostname", "state", "ready_count", "in_flight_count", "message_count"]
        keys += ["finish_count", "requeue_count", "user_agent"]
        return tuple(cl[k] for k in keys)

    c2_clients = sorted(client_figures(x) for x in chans["c2"]["clients"])
    assert c2_clients == [
        ("127.0.0.1", "127.0.0.1", 3, 0, 0, 0, 0, 0, ""),  # B
        ("A", "host-a", 3, 0, 2, 5, 1, 2, "acc/1"),
    ]
    c3_clients = sorted(client_figures(x) for x in chans["c3"]["clients"])
    assert c3_clients == [
        ("127.0.0.1", "127.0.0.1", 3, 0, 0, 0, 0, 0, ""),  # D
        ("C", "host-c", 3, 0, 0, 1, 0, 0, ""),
    ]
    (producer,) = doc["producers"]
    assert producer["pub_counts"] == [{"topic": T, "count": 5}]
    assert (producer["state"], producer["message_count"]) == (0, 0)

    # /stats text: the same figures in the §8.2 layout.
    assert doc_nomem["topics"] == doc["topics"]
    assert_text_matches(text, doc_nomem)
    assert "\n      [c2                       ] depth: 1     be-depth: 0     inflt: 2    def: 1    re-q: 2     " in text
    assert "\n      [c3                       ] depth: 5     be-depth: 2     inflt: 0    def: 0    re-q: 0     timeout: 1     msgs: 5        e2e%: 0.0ns, 0.0ns\n" in text  # noqa: E501

    # /metrics: the same figures again.
    assert_metrics_match_stats(fams, doc, tcp_clients=5)
    labels = {"topic": T, "channel": "c2"}
    assert sample(fams, "nsq_channel_in_flight", **labels) == 2
    assert sample(fams, "nsq_channel_deferred", **labels) == 1
    assert sample(fams, "nsq_channel_requeued_total", **labels) == 2
    assert sample(fams, "nsq_channel_timed_out_total", topic=T, channel="c3") == 1
    assert sample(fams, "nsq_channel_backend_depth", topic=T, channel="c1") == 2
    assert sample(fams, "nsq_topic_messages_total", topic=T) == 5
