"""GET /stats as JSON: golden documents written from http-api.md §8.1, and e2e processing latency."""

import json
import re
import time

from nsqd_threaded.broker import stats
from nsqd_threaded.internal import gocompat
from support.http_api import HTTP, assert_text
from support.stats import (  # noqa: F401 (fixtures among them)
    CONNECTED_RE,
    HEADER_RE,
    assert_text_matches,
    get_json,
    get_text,
    golden,
    match_golden,
)
from support.wire import Conn, wait_for

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
        # The document with its e2e floats takes go_json's fast path, and it writes what the slow one does.
        snapshot = stats.collect(nsqd, include_mem=False)
        assert gocompat._fast_encode(snapshot) == gocompat.go_json_slow(snapshot)


def test_channel_objects_written_ahead_are_the_encoders_bytes(make_nsqd):
    # /stats?format=json writes each channel object through a template (stats.channel_json); every
    # kind of channel comes out as the general encoder writes the dict of stats.collect.
    nsqd = make_nsqd(e2e_processing_latency_percentiles=[0.99, 0.5])
    h = HTTP(nsqd)
    with Conn(nsqd.tcp_address) as sub, Conn(nsqd.tcp_address) as pub:
        sub.identify(client_id="c", hostname='h"<&>\u2028', user_agent="ua/1")
        sub.sub("t", "busy", rdy=5)
        for i in range(3):
            pub.pub("t", b"m%d" % i)
        first = sub.read_message()
        sub.cmd(b"FIN " + first[2])
        sub.cmd(b"REQ %s 60000" % sub.read_message()[2].decode().encode())
        sub.read_message()  # left in flight
        for path in ("/channel/create?topic=t&channel=idle", "/channel/create?topic=t&channel=held",
                     "/channel/pause?topic=t&channel=held", "/channel/create?topic=t&channel=tmp%23ephemeral",
                     "/channel/create?topic=t&channel=policed",
                     "/channel/policy?topic=t&channel=policed&max_attempts=3"):
            assert h.post(path).status == 200, path
        wait_for(lambda: h.stats(topic="t")["topics"][0]["channels"][0]["deferred_count"] == 1, what="a deferral")
        for params in ({}, {"include_clients": "false"}, {"topic": "t", "channel": "busy"}):
            r = h.get("/stats?format=json&include_mem=false&" + "&".join("%s=%s" % kv for kv in params.items()))
            assert r.status == 200
            raw = r.body  # (not get_json: its schema is Go's, without the policy's keys)
            doc = stats.collect(nsqd, topic_name=params.get("topic"), channel_name=params.get("channel"),
                                include_clients=params.get("include_clients") != "false", include_mem=False)
            assert raw.decode() == gocompat.go_json(doc)
            written = stats.collect(nsqd, topic_name=params.get("topic"), channel_name=params.get("channel"),
                                    include_clients=params.get("include_clients") != "false", include_mem=False,
                                    as_json=True)
            assert gocompat.go_json(written) == gocompat.go_json(doc)
        channels = {c["channel_name"]: c for c in json.loads(raw)["topics"][0]["channels"]}
        assert channels["busy"]["clients"][0]["hostname"] == 'h"<&>\u2028'


def test_client_objects_written_through_the_template_are_the_encoders_bytes():
    # stats.client_json writes a subscriber's object through a template: each field's every kind of
    # value comes out as the general encoder writes stats.client_stats's dict.
    from nsqd_threaded.broker.client import Client
    from nsqd_threaded.settings.options import Options

    options = Options()
    for i, attrs in enumerate([
        {},
        {"deflate": True, "sample_rate": 99, "state": 3, "ready_count": 2500, "in_flight_count": 7},
        {"snappy": True, "message_count": 2**40, "finish_count": 5, "requeue_count": 1, "connect_time": 1.9e9 + 0.7},
        {"client_id": 'id"\\\b\f\n<&>\u2028\u2029\udcff\x01é', "hostname": "", "user_agent": "ua/1 (x; y)",
         "topology_zone": "z\t1", "topology_region": "r</script>"},
        {"pub_counts": {"t": 3}},  # a publisher's: the encoder writes it
    ]):
        client = Client(i, ("127.0.0.1", 4000 + i), options)
        for name, value in attrs.items():
            setattr(client, name, value)
        for pub_topic in (None, "t", "u"):
            assert stats.client_json(client, pub_topic) == gocompat.go_json(stats.client_stats(client, pub_topic))
