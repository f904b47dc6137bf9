"""``/channel/policy`` (not in Go nsqd): setting and reading a channel's delivery policy over HTTP,
every refusal Go-style and changing nothing, and the fields /stats, /metrics and statsd add for it."""

import json
import os
import socket

import pytest

from nsqd_threaded.server.statsd import render_lines

from support.http_api import HTTP, assert_error, assert_json
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(60)

UNSET = {"max_attempts": None, "dead_letter_topic": None, "msg_ttl": None}  # every field inherited
NOTHING = {"max_attempts": 0, "dead_letter_topic": "", "msg_ttl": 0}  # the channel's own: unlimited, drop, no TTL
INHERIT_ALL = "&inherit=max_attempts,dead_letter_topic,msg_ttl"
POLICY = "/channel/policy?topic=t&channel=c"


@pytest.fixture
def h(nsqd):
    client = HTTP(nsqd)
    assert client.post("/topic/create?topic=t").status == 200
    assert client.post("/channel/create?topic=t&channel=c").status == 200
    yield client
    client.close()


def assert_policy(r, policy):
    """A policy answer: compact JSON (Go's content types), the contract's keys in its order."""
    assert_json(r, json.dumps(policy, separators=(",", ":")).encode())


def channel_doc(h, topic="t", channel="c"):
    [t] = [t for t in h.stats()["topics"] if t["topic_name"] == topic]
    [c] = [c for c in t["channels"] if c["channel_name"] == channel]
    return c


def test_set_read_and_reset(nsqd, h):
    assert_policy(h.get(POLICY), UNSET)
    assert_policy(h.post(POLICY + "&max_attempts=5"), dict(UNSET, max_attempts=5))
    # Fields not given stay as they were.
    assert_policy(h.post(POLICY + "&dead_letter_topic=t.dead&msg_ttl=1m30s"),
                {"max_attempts": 5, "dead_letter_topic": "t.dead", "msg_ttl": 90000})
    assert_policy(h.get(POLICY), {"max_attempts": 5, "dead_letter_topic": "t.dead", "msg_ttl": 90000})
    assert_policy(h.post(POLICY), {"max_attempts": 5, "dead_letter_topic": "t.dead", "msg_ttl": 90000})
    # 0 and an empty value are the channel's own "nothing" (unlimited, drop, no TTL), not inherited.
    assert_policy(h.post(POLICY + "&max_attempts=&msg_ttl=0"), dict(NOTHING, dead_letter_topic="t.dead"))
    assert_policy(h.post(POLICY + "&dead_letter_topic=&msg_ttl=250.9ms"), dict(NOTHING, msg_ttl=250))
    assert nsqd.get_existing_topic("t").get_existing_channel("c").own_policy().msg_ttl_ns == 250 * 10**6
    assert_policy(h.post(POLICY + "&msg_ttl="), NOTHING)
    # inherit= gives fields back to the broker's defaults.
    assert_policy(h.post(POLICY + "&inherit=msg_ttl,max_attempts"), dict(UNSET, dead_letter_topic=""))
    assert_policy(h.post(POLICY + "&inherit=dead_letter_topic&max_attempts=2"), dict(UNSET, max_attempts=2))
    assert_policy(h.post(POLICY + INHERIT_ALL), UNSET)
    # The key order is the contract's, the body compact as Go's.
    assert h.get(POLICY).body == b'{"max_attempts":null,"dead_letter_topic":null,"msg_ttl":null}'


@pytest.mark.parametrize("query, status, message", [
    ("", 400, "MISSING_ARG_TOPIC"),
    ("?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
    ("?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND"),
    ("?topic=t&channel=c&max_attempts=-1", 400, "INVALID_MAX_ATTEMPTS"),
    ("?topic=t&channel=c&max_attempts=65536", 400, "INVALID_MAX_ATTEMPTS"),
    ("?topic=t&channel=c&max_attempts=five", 400, "INVALID_MAX_ATTEMPTS"),
    ("?topic=t&channel=c&max_attempts=1.5", 400, "INVALID_MAX_ATTEMPTS"),
    ("?topic=t&channel=c&msg_ttl=-10", 400, "INVALID_MSG_TTL"),
    ("?topic=t&channel=c&msg_ttl=0.5", 400, "INVALID_MSG_TTL"),  # (a bare number is whole milliseconds)
    ("?topic=t&channel=c&max_attempt=5", 400, "INVALID_ARG"),  # misspelt: never 200 with nothing changed
    ("?topic=t&channel=c&max_attempts=5&ttl=1s", 400, "INVALID_ARG"),
    ("?topic=t&channel=c&dead_letter_topic=t.dead%23ephemeral", 400, "INVALID_TOPIC"),  # it would vanish
    ("?topic=t&channel=c&msg_ttl=-1s", 400, "INVALID_MSG_TTL"),
    ("?topic=t&channel=c&msg_ttl=500us", 400, "INVALID_MSG_TTL"),  # below the millisecond /stats shows
    ("?topic=t&channel=c&msg_ttl=soon", 400, "INVALID_MSG_TTL"),
    ("?topic=t&channel=c&dead_letter_topic=t", 400, "INVALID_TOPIC"),  # its own topic: a loop
    ("?topic=t&channel=c&dead_letter_topic=bad!name", 400, "INVALID_TOPIC"),
    ("?topic=t&channel=c&dead_letter_topic=" + "x" * 65, 400, "INVALID_TOPIC"),
    ("?topic=t&channel=c&dead_letter_topic={topic}.dead", 400, "INVALID_TOPIC"),  # patterns are the flag's
    # Valid fields with a bad one: nothing is set.
    ("?topic=t&channel=c&max_attempts=3&dead_letter_topic=d&msg_ttl=x", 400, "INVALID_MSG_TTL"),
    ("?topic=t&channel=c&max_attempts=3&msg_ttl=1s&dead_letter_topic=t", 400, "INVALID_TOPIC"),
    ("?topic=t&channel=c&inherit=max_attempt", 400, "INVALID_ARG"),  # misspelt
    ("?topic=t&channel=c&inherit=max_attempts&max_attempts=3", 400, "INVALID_ARG"),  # which one?
    ("?topic=t&channel=c&inherit=topic", 400, "INVALID_ARG"),
    ("?topic=t&channel=c&inherit=msg_ttl&msg_ttl=x", 400, "INVALID_ARG"),
])
def test_bad_input_is_refused_and_changes_nothing(nsqd, h, query, status, message):
    assert_policy(h.post(POLICY + "&max_attempts=7"), dict(UNSET, max_attempts=7))
    path = os.path.join(nsqd.data_path, "nsqd.dat")
    before = open(path, "rb").read()
    assert_error(h.post("/channel/policy" + query), status, message)
    assert_policy(h.get(POLICY), dict(UNSET, max_attempts=7))
    assert open(path, "rb").read() == before


def test_what_get_answers_posts_back_unchanged(nsqd, h):
    h.post(POLICY + "&max_attempts=4&dead_letter_topic=t.dead&msg_ttl=1m30s")
    answer = json.loads(h.get(POLICY).body)
    assert answer["msg_ttl"] == 90000  # milliseconds
    h.post(POLICY + "&msg_ttl=0&max_attempts=0&dead_letter_topic=")
    query = "&".join("%s=%s" % kv for kv in answer.items())
    assert_policy(h.post(POLICY + "&" + query), answer)  # a bare number: milliseconds
    assert nsqd.get_existing_topic("t").get_existing_channel("c").own_policy().msg_ttl_ns == 90 * 10**9
    # Inherited fields (null) are left out of the POST, as HTTP clients leave out a None: they stay inherited.
    h.post(POLICY + "&inherit=msg_ttl&dead_letter_topic=")
    answer = json.loads(h.get(POLICY).body)
    assert answer == {"max_attempts": 4, "dead_letter_topic": "", "msg_ttl": None}
    h.post(POLICY + "&max_attempts=9&dead_letter_topic=elsewhere")
    query = "&".join("%s=%s" % kv for kv in answer.items() if kv[1] is not None)
    assert_policy(h.post(POLICY + "&" + query), answer)


def test_text_stats_show_the_policy_and_its_counts(nsqd, h):
    assert "policy:" not in h.get("/stats").body.decode()  # as Go's without one
    h.post(POLICY + "&max_attempts=3&msg_ttl=2s")
    text = h.get("/stats").body.decode()
    lines = text.splitlines()
    [i] = [i for i, line in enumerate(lines) if "[c " in line]
    assert lines[i + 1].split() == ["policy:", "max-attempts:", "3", "dead-letter:", "(drop)", "ttl:", "2s",
                                    "dead-lettered:", "0", "expired:", "0"]
    # What it took out shows there too.
    h.post(POLICY + "&max_attempts=1&dead_letter_topic=t.dead")
    with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub:
        sub.sub("t", "c", rdy=1)
        assert pub.pub("t", b"m") == b"OK"
        sub.cmd(b"REQ %s 0" % sub.read_message()[2])
        wait_for(lambda: channel_doc(h)["dead_letter_count"] == 1, timeout=20, what="the dead letter")
    lines = h.get("/stats").body.decode().splitlines()
    [i] = [i for i, line in enumerate(lines) if "[c " in line]
    assert lines[i + 1].split() == ["policy:", "max-attempts:", "1", "dead-letter:", "t.dead", "ttl:", "2s",
                                    "dead-lettered:", "1", "expired:", "0"]


@pytest.mark.parametrize("query, status, message", [
    ("", 400, "MISSING_ARG_TOPIC"),
    ("?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
    ("?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND"),
])
def test_get_errors(h, query, status, message):
    assert_error(h.get("/channel/policy" + query), status, message)


def test_other_methods_and_cross_origin_posts_are_refused(nsqd, h):
    assert_error(h.request("PUT", POLICY + "&max_attempts=3"), 405, "METHOD_NOT_ALLOWED")
    assert_error(h.post(POLICY + "&max_attempts=3", headers={"Origin": "http://evil.example"}),
                 403, "CROSS_ORIGIN_FORBIDDEN")
    assert_policy(h.get(POLICY, headers={"Origin": "http://evil.example"}), UNSET)  # reads stay open


def test_stats_shows_policy_fields_only_where_a_policy_applies(nsqd, h):
    plain = channel_doc(h)
    assert "max_attempts" not in plain and "dead_letter_count" not in plain
    assert h.post("/channel/create?topic=t&channel=other").status == 200
    h.post(POLICY + "&max_attempts=3&dead_letter_topic=t.dead&msg_ttl=2s")
    doc = channel_doc(h)
    keys = list(doc)
    i = keys.index("timeout_count")
    assert keys[i + 1:i + 6] == ["max_attempts", "dead_letter_topic", "msg_ttl", "dead_letter_count",
                                 "expired_count"]
    assert (doc["max_attempts"], doc["dead_letter_topic"], doc["msg_ttl"]) == (3, "t.dead", 2000)
    assert doc["dead_letter_count"] == 0 and doc["expired_count"] == 0
    assert "max_attempts" not in channel_doc(h, channel="other")
    # The own and inherited policies follow the counters (null: inherited).
    assert keys[i + 6:i + 9] == ["own_policy", "default_policy", "client_count"]
    assert doc["own_policy"] == {"max_attempts": 3, "dead_letter_topic": "t.dead", "msg_ttl": 2000}
    assert doc["default_policy"] == NOTHING
    # The channel's own "nothing": still its own policy (shown, kept), nothing applies.
    h.post(POLICY + "&max_attempts=0&dead_letter_topic=&msg_ttl=0")
    doc = channel_doc(h)
    assert (doc["max_attempts"], doc["dead_letter_topic"], doc["msg_ttl"]) == (0, "", 0)
    assert doc["own_policy"] == NOTHING
    # Inherited again: the fields go away again.
    h.post(POLICY + INHERIT_ALL)
    assert "max_attempts" not in channel_doc(h)
    metrics = h.get("/metrics").body.decode()
    assert "dead_letter" not in metrics and "expired" not in metrics


def test_stats_shows_the_effective_policy_of_the_broker_defaults(make_nsqd):
    nsqd = make_nsqd(max_attempts=4, dead_letter_topic="{topic}.dead", msg_ttl=60.0)
    h = HTTP(nsqd)
    try:
        h.post("/topic/create?topic=orders")
        h.post("/channel/create?topic=orders&channel=c")
        h.post("/topic/create?topic=orders.dead")
        h.post("/channel/create?topic=orders.dead&channel=inspect")
        doc = channel_doc(h, "orders")
        assert (doc["max_attempts"], doc["dead_letter_topic"], doc["msg_ttl"]) == (4, "orders.dead", 60000)
        # The channel's own policy shows only what was set on it; its own fields win.
        assert_policy(h.get("/channel/policy?topic=orders&channel=c"), UNSET)
        h.post("/channel/policy?topic=orders&channel=c&max_attempts=9")
        doc = channel_doc(h, "orders")
        assert (doc["max_attempts"], doc["dead_letter_topic"], doc["msg_ttl"]) == (9, "orders.dead", 60000)
        assert doc["own_policy"] == dict(UNSET, max_attempts=9)
        assert doc["default_policy"] == {"max_attempts": 4, "dead_letter_topic": "orders.dead", "msg_ttl": 60000}
        # Its own "unlimited", "drop" and "no TTL" win over the defaults too.
        h.post("/channel/policy?topic=orders&channel=c&max_attempts=0&dead_letter_topic=&msg_ttl=0")
        doc = channel_doc(h, "orders")
        assert (doc["max_attempts"], doc["dead_letter_topic"], doc["msg_ttl"]) == (0, "", 0)
        assert doc["default_policy"] == {"max_attempts": 4, "dead_letter_topic": "orders.dead", "msg_ttl": 60000}
        h.post("/channel/policy?topic=orders&channel=c&inherit=dead_letter_topic,msg_ttl")
        doc = channel_doc(h, "orders")
        assert (doc["max_attempts"], doc["dead_letter_topic"], doc["msg_ttl"]) == (0, "orders.dead", 60000)
        # A dead-letter topic itself is left alone by the defaults.
        assert "max_attempts" not in channel_doc(h, "orders.dead", "inspect")
        assert h.get("/config/max_attempts").body == b"4"
        assert h.get("/config/dead_letter_topic").body == b"{topic}.dead"
        assert h.get("/config/msg_ttl").body == b"60000000000"
    finally:
        h.close()


def test_a_topic_a_channel_names_as_its_dead_letter_topic_never_gets_the_defaults(make_nsqd):
    """Dead letters never chain (orders.failed.dead): whether the pattern or a channel's own policy names it."""
    nsqd = make_nsqd(max_attempts=4, dead_letter_topic="{topic}.dead")
    h = HTTP(nsqd)
    try:
        for topic, channel in (("orders", "c"), ("orders.failed", "inspect"), ("orders.failed", "later")):
            h.post("/topic/create?topic=" + topic)
            h.post("/channel/create?topic=%s&channel=%s" % (topic, channel))
        assert channel_doc(h, "orders.failed", "inspect")["dead_letter_topic"] == "orders.failed.dead"  # not named yet
        h.post("/channel/policy?topic=orders&channel=c&dead_letter_topic=orders.failed")
        for channel in ("inspect", "later"):  # named now: the defaults leave its channels alone
            assert "max_attempts" not in channel_doc(h, "orders.failed", channel)
        h.post("/channel/create?topic=orders.failed&channel=new")
        assert "max_attempts" not in channel_doc(h, "orders.failed", "new")
        # its own policy still applies to it
        h.post("/channel/policy?topic=orders.failed&channel=inspect&max_attempts=2")
        assert channel_doc(h, "orders.failed", "inspect")["max_attempts"] == 2
        # across a restart (the naming channel may be loaded after the named topic's)
        nsqd.stop()
        again = make_nsqd(max_attempts=4, dead_letter_topic="{topic}.dead", data_path=nsqd.options.data_path)
        h2 = HTTP(again)
        try:
            assert "max_attempts" not in channel_doc(h2, "orders.failed", "later")
            assert channel_doc(h2, "orders", "c")["dead_letter_topic"] == "orders.failed"
            # no longer named once the naming channel is deleted: the defaults apply again
            h2.post("/channel/delete?topic=orders&channel=c")
            assert channel_doc(h2, "orders.failed", "later")["dead_letter_topic"] == "orders.failed.dead"
        finally:
            h2.close()
    finally:
        h.close()


def test_metrics_counters(nsqd, h):
    h.post(POLICY + "&msg_ttl=1ms")
    metrics = h.get("/metrics").body.decode()
    assert 'nsq_channel_dead_lettered_total{topic="t",channel="c"} 0\n' in metrics
    assert 'nsq_channel_expired_total{topic="t",channel="c"} 0\n' in metrics
    assert "# TYPE nsq_channel_expired_total counter\n" in metrics


def test_statsd_lines_for_a_channel_with_a_policy():
    def snap(dead, expired):
        c = {"channel_name": "c", "depth": 0, "backend_depth": 0, "in_flight_count": 0, "deferred_count": 0,
             "message_count": 0, "requeue_count": 0, "timeout_count": 0, "max_attempts": 3,
             "dead_letter_topic": "", "msg_ttl": 0, "dead_letter_count": dead, "expired_count": expired,
             "client_count": 0, "e2e_processing_latency": {"count": 0, "percentiles": None}}
        return {"topics": [{"topic_name": "t", "channels": [c], "depth": 0, "backend_depth": 0, "message_count": 0,
                            "message_bytes": 0, "e2e_processing_latency": {"count": 0, "percentiles": None}}]}

    first = render_lines("p.", snap(2, 1))
    assert "p.topic.t.channel.c.dead_letter_count:2|c\n" in first
    assert "p.topic.t.channel.c.expired_count:1|c\n" in first
    later = render_lines("p.", snap(5, 1), snap(2, 1))
    assert "p.topic.t.channel.c.dead_letter_count:3|c\n" in later
    assert "p.topic.t.channel.c.expired_count:0|c\n" in later
    plain = snap(0, 0)
    for key in ("max_attempts", "dead_letter_topic", "msg_ttl", "dead_letter_count", "expired_count"):
        del plain["topics"][0]["channels"][0][key]
    assert "dead_letter" not in "".join(render_lines("p.", plain))


def test_statsd_pushes_the_counters(make_nsqd):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(20)
    try:
        nsqd = make_nsqd(statsd_address="127.0.0.1:%d" % udp.getsockname()[1], statsd_interval=0.05,
                         statsd_prefix="", statsd_mem_stats=False, max_attempts=1)
        totals = {}

        def pushed(key, total):
            for line in udp.recv(65536).decode().splitlines():
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                if name.startswith("topic.t.channel.c.") and kind == "c":
                    totals[name] = totals.get(name, 0) + int(value)
            return totals.get(key) == total

        with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub:
            sub.sub("t", "c", rdy=1)
            assert pub.pub("t", b"m") == b"OK"
            sub.cmd(b"REQ %s 0" % sub.read_message()[2])
            # The deltas of the pushes add up to the count, once.
            wait_for(lambda: pushed("topic.t.channel.c.dead_letter_count", 1), timeout=20, what="one dead letter")
            assert totals["topic.t.channel.c.expired_count"] == 0
    finally:
        udp.close()


def test_nsqd_dat_keeps_the_own_policy(nsqd, h):
    path = os.path.join(nsqd.data_path, "nsqd.dat")
    plain = open(path, "rb").read()
    assert b"policy" not in plain
    h.post(POLICY + "&max_attempts=3&dead_letter_topic=t.dead")
    doc = json.loads(open(path, "rb").read())
    assert doc["topics"][0]["channels"] == [
        {"name": "c", "paused": False,
         "policy": {"max_attempts": 3, "dead_letter_topic": "t.dead", "msg_ttl": None, "format": 2}}]
    h.post(POLICY + "&max_attempts=0&dead_letter_topic=")
    doc = json.loads(open(path, "rb").read())
    assert doc["topics"][0]["channels"][0]["policy"] == {"max_attempts": 0, "dead_letter_topic": "", "msg_ttl": None,
                                                         "format": 2}
    h.post(POLICY + INHERIT_ALL)
    assert open(path, "rb").read() == plain  # byte for byte Go's again


def test_a_channels_own_unlimited_and_no_ttl_win_over_the_defaults(make_nsqd):
    """Under --max-attempts=1 and a 1ms TTL, a channel's own max_attempts=0 and msg_ttl=0 deliver for ever;
    a sibling that inherits gives up at once; inherit= hands the channel back to the defaults."""
    nsqd = make_nsqd(max_attempts=1, dead_letter_topic="{topic}.dead", msg_ttl=0.001)
    h = HTTP(nsqd)
    try:
        h.post("/topic/create?topic=t")
        for channel in ("own", "inherits"):
            h.post("/channel/create?topic=t&channel=" + channel)
        assert_policy(h.post("/channel/policy?topic=t&channel=own&max_attempts=0&msg_ttl=0"),
                      dict(UNSET, max_attempts=0, msg_ttl=0))
        with Conn(nsqd.tcp_address) as pub, Conn(nsqd.tcp_address) as sub:
            sub.sub("t", "own", rdy=1)
            assert pub.pub("t", b"m") == b"OK"
            for attempt in range(1, 5):
                msg = sub.read_message()
                assert msg[1] == attempt and msg[3] == b"m"
                sub.cmd(b"REQ %s 0" % msg[2])
            sub.cmd(b"FIN %s" % sub.read_message()[2])
        # The same message, older than 1ms by the broker's clock before the sibling asks for it (a
        # fast host can make the five deliveries above and a SUB within a millisecond): never delivered.
        published_ns = msg[0]
        wait_for(lambda: nsqd.clock.time_ns() - published_ns > 2_000_000, timeout=5, what="2 ms to pass")
        with Conn(nsqd.tcp_address) as sibling:
            sibling.sub("t", "inherits", rdy=1)
            wait_for(lambda: channel_doc(h, channel="inherits")["expired_count"] == 1, timeout=20,
                     what=lambda: "the inheriting sibling giving up (its /stats: %r)" % channel_doc(h, channel="inherits"))
            sibling.assert_silent(0.2)
        doc = channel_doc(h, channel="own")
        assert (doc["dead_letter_count"], doc["expired_count"]) == (0, 0)
        h.post("/channel/policy?topic=t&channel=own&inherit=max_attempts,msg_ttl")
        doc = channel_doc(h, channel="own")
        assert (doc["max_attempts"], doc["dead_letter_topic"], doc["msg_ttl"]) == (1, "t.dead", 1)
    finally:
        h.close()
