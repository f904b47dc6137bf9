"""GET /channel/peek (not in Go nsqd, behind --channel-peek): a channel's next messages, consuming nothing."""

import base64
import json

import pytest

from nsqd_threaded.broker.debug_state import BODY_PREVIEW
from nsqd_threaded.broker.peek import PEEK_MAX
from nsqd_threaded.client import Consumer, Producer

from support.auth import AuthServer, grant
from support.http_api import HTTP, assert_error

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client():
    clients = []

    def connect(nsqd):
        c = HTTP(nsqd)
        clients.append(c)
        return c

    yield connect
    for c in clients:
        c.close()


def peek(h, query, headers=None):
    r = h.get("/channel/peek?" + query, headers=headers)
    assert r.status == 200, r
    assert r.headers["Content-Type"] == "application/json; charset=utf-8"
    return json.loads(r.body)["messages"]


def fill(nsqd, topic="orders", channel="billing", bodies=(b"a", b"b", b"c")):
    """The channel, then "first" and the bodies published to its topic (through the broker
    itself: under auth a client would need a secret to publish)."""
    t = nsqd.get_topic(topic)
    t.get_channel(channel)
    t.publish([b"first"])
    t.publish(list(bodies))


def test_without_the_flag_the_route_is_go_s_404(make_nsqd, client):
    h = client(make_nsqd())
    fill_broker = h.post("/topic/create?topic=orders")
    assert fill_broker.status == 200
    assert_error(h.get("/channel/peek?topic=orders&channel=billing"), 404, "NOT_FOUND")


def test_peek_shows_the_next_messages_in_order_and_consumes_nothing(make_nsqd, client):
    nsqd = make_nsqd(channel_peek=True, mem_queue_size=2)  # two in memory, two on disk
    h = client(nsqd)
    fill(nsqd)
    one = peek(h, "topic=orders&channel=billing")  # n absent: one
    assert [m["body"] for m in one] == ["first"]
    docs = peek(h, "topic=orders&channel=billing&n=10")
    assert [m["body"] for m in docs] == ["first", "a", "b", "c"]
    assert {m["state"] for m in docs} == {"queued"} and {m["due_ns"] for m in docs} == {None}
    assert all(len(m["id"]) == 16 and m["attempts"] == 0 and m["timestamp"] > 0 for m in docs)
    assert peek(h, "topic=orders&channel=billing&n=2") == docs[:2]
    assert peek(h, "topic=orders&channel=billing&n=10") == docs  # nothing moved, disk included
    # a consumer afterwards still gets every message, in that order, with the ids peek showed
    with Consumer(nsqd.tcp_address, "orders", "billing", max_in_flight=10) as consumer:
        got = [consumer.get(timeout=10) for _ in range(4)]
        for m in got:
            m.fin()
    assert [(m.id.decode(), m.body) for m in got] == [(d["id"], d["body"].encode()) for d in docs]


def test_bodies_are_previews_unless_base64_is_asked(make_nsqd, client):
    nsqd = make_nsqd(channel_peek=True)
    h = client(nsqd)
    long_body = bytes(range(256)) * 2
    fill(nsqd, bodies=[long_body])
    docs = peek(h, "topic=orders&channel=billing&n=2")
    assert docs[1]["body"].endswith("...") and len(docs[1]["body"]) < len(long_body)
    assert docs[1]["body"] == long_body[:BODY_PREVIEW].decode("utf-8", "replace") + "..."
    whole = peek(h, "topic=orders&channel=billing&n=2&body=base64")
    assert base64.b64decode(whole[1]["body"]) == long_body


def test_in_flight_and_deferred_messages_come_after_the_queued_ones(make_nsqd, client):
    nsqd = make_nsqd(channel_peek=True)
    h = client(nsqd)
    fill(nsqd, bodies=[b"a"])
    with Producer(nsqd.tcp_address) as producer:
        producer.dpub("orders", 600000, b"later")
    with Consumer(nsqd.tcp_address, "orders", "billing") as consumer:
        held = consumer.get(timeout=10)  # "first", in flight
        docs = peek(h, "topic=orders&channel=billing&n=10")
        assert [(m["body"], m["state"]) for m in docs] == [("a", "queued"), ("first", "in_flight"),
                                                            ("later", "deferred")]
        assert docs[1]["attempts"] == 1 and docs[1]["id"] == held.id.decode()
        assert docs[1]["due_ns"] < docs[2]["due_ns"]  # its deadline (60 s) is before the delay's end (10 min)
        held.fin()


@pytest.mark.parametrize("query, status, message", [
    ("channel=billing", 400, "MISSING_ARG_TOPIC"),
    ("topic=orders", 400, "MISSING_ARG_CHANNEL"),
    ("topic=bad!&channel=billing", 400, "INVALID_ARG_TOPIC"),
    ("topic=orders&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
    ("topic=orders&channel=billing&n=0", 400, "INVALID_N"),
    ("topic=orders&channel=billing&n=-1", 400, "INVALID_N"),
    ("topic=orders&channel=billing&n=x", 400, "INVALID_N"),
    ("topic=orders&channel=billing&n=%d" % (PEEK_MAX + 1), 400, "INVALID_N"),
    ("topic=orders&channel=billing&body=hex", 400, "INVALID_BODY"),
    ("topic=nope&channel=billing", 404, "TOPIC_NOT_FOUND"),
    ("topic=orders&channel=nope", 404, "CHANNEL_NOT_FOUND"),
])
def test_bad_requests_get_go_style_errors(make_nsqd, client, query, status, message):
    nsqd = make_nsqd(channel_peek=True)
    h = client(nsqd)
    fill(nsqd)
    assert_error(h.get("/channel/peek?" + query), status, message)


@pytest.fixture
def auth_server():
    server = AuthServer()
    server.answers.update({
        "billing-reader": grant("^orders$", ["^billing$"], ["subscribe"], identity="billing"),
        "other-channel": grant("^orders$", ["^audit$"], ["subscribe"], identity="audit"),
        "publisher": grant(".*", [".*"], ["publish"], identity="producer"),
    })
    yield server
    server.close()


def test_under_auth_peek_needs_a_secret_granted_subscribe_on_the_channel(make_nsqd, client, auth_server):
    nsqd = make_nsqd(channel_peek=True, auth_http_addresses=[auth_server.address])
    h = client(nsqd)
    fill(nsqd)
    query = "/channel/peek?topic=orders&channel=billing&n=10"
    assert_error(h.get(query), 401, "AUTH_REQUIRED")
    assert_error(h.get(query, headers={"X-NSQ-Auth-Secret": "wrong"}), 403, "AUTH_FAILED")
    assert_error(h.get(query, headers={"X-NSQ-Auth-Secret": "publisher"}), 403, "UNAUTHORIZED")
    assert_error(h.get(query, headers={"X-NSQ-Auth-Secret": "other-channel"}), 403, "UNAUTHORIZED")
    docs = peek(h, "topic=orders&channel=billing&n=10", headers={"X-NSQ-Auth-Secret": "billing-reader"})
    assert [m["body"] for m in docs] == ["first", "a", "b", "c"]
    method, _, query_args, _, _ = auth_server.requests[-1]
    assert (method, query_args["secret"]) == ("GET", ["billing-reader"])


def test_under_auth_a_failing_auth_server_refuses(make_nsqd, client):
    server = AuthServer(mode="500")
    try:
        nsqd = make_nsqd(channel_peek=True, auth_http_addresses=[server.address])
        h = client(nsqd)
        fill(nsqd)
        r = h.get("/channel/peek?topic=orders&channel=billing", headers={"X-NSQ-Auth-Secret": "x"})
        assert_error(r, 403, "AUTH_FAILED")
    finally:
        server.close()
