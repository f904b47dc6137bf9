"""GET /stats as text (§8.2), and the acceptance scenario."""

import datetime
import re
import types

import pytest

from nsqd_threaded.broker.stats import render_text

from support.http_api import HTTP, assert_text
from support.metrics import assert_metrics_match_stats, parse_prometheus, sample
from support.stats import GOLDEN, HEADER_RE, assert_text_matches, get_json, get_text, golden  # noqa: F401 (fixtures among them)
from support.wire import Conn, wait_for

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
