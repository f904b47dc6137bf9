"""nsqd against a hostile page and a reader without rights: cross-origin requests refused, and the
message bodies of ``GET /debug/state`` only for the operator's flag and, under AUTH, a granted secret."""

import http.client
import json

import pytest

from support.auth import AuthServer, grant
from support.http_api import HTTP, assert_empty, assert_error
from support.transport import certs  # noqa: F401 (fixture)
from support.wire import wait_for

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


def topic_names(h):
    return [t["topic_name"] for t in h.stats()["topics"]]


def channel_depth(h, topic, channel):
    [t] = h.stats(topic=topic)["topics"]
    return [c for c in t["channels"] if c["channel_name"] == channel][0]["depth"]


# -- cross-origin requests ------------------------------------------------------------------------


@pytest.mark.parametrize("origin", [
    "http://evil.example",
    "http://127.0.0.1:1",            # same host, another port: another origin
    "https://127.0.0.1:{port}",      # same host and port, another scheme
    "null",                          # a sandboxed page or a local file
    "garbage",
])
def test_a_state_change_from_another_origin_is_refused(make_nsqd, client, origin):
    nsqd = make_nsqd()
    h = client(nsqd)
    assert_empty(h.post("/topic/create?topic=kept"))
    assert_empty(h.post("/channel/create?topic=kept&channel=c"))
    assert h.post("/pub?topic=kept", b"precious").status == 200
    origin = origin.format(port=nsqd.http_address[1])
    for path, body in (("/topic/delete?topic=kept", None), ("/channel/empty?topic=kept&channel=c", None),
                       ("/pub?topic=kept", b"forged"), ("/topic/create?topic=planted", None),
                       ("/channel/redrive?topic=kept&channel=c&to=planted", None)):
        assert_error(h.post(path, body, headers={"Origin": origin}), 403, "CROSS_ORIGIN_FORBIDDEN")
    assert_error(h.put("/config/log_level", b"debug", headers={"Origin": origin}), 403, "CROSS_ORIGIN_FORBIDDEN")
    assert topic_names(h) == ["kept"] and channel_depth(h, "kept", "c") == 1
    assert h.get("/config/log_level").body == b"2"
    # reads stay open to any page, like /stats
    assert h.get("/stats?format=json", headers={"Origin": origin}).status == 200


def test_without_origin_or_from_the_same_origin_everything_works_as_before(make_nsqd, client):
    nsqd = make_nsqd()
    h = client(nsqd)
    own = "http://127.0.0.1:%d" % nsqd.http_address[1]
    assert_empty(h.post("/topic/create?topic=t"))  # curl, client libraries, nsqadmin: no Origin
    assert_empty(h.post("/channel/create?topic=t&channel=c", headers={"Origin": own}))
    assert h.post("/pub?topic=t", b"m", headers={"Origin": own.replace("http:", "HTTP:")}).status == 200
    # behind a reverse proxy that says where the browser was
    proxied = {"Origin": "https://nsq.example", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "nsq.example"}
    assert_empty(h.post("/channel/empty?topic=t&channel=c", headers=proxied))
    assert channel_depth(h, "t", "c") == 0
    assert_empty(h.post("/topic/delete?topic=t"))
    assert topic_names(h) == []
    # a refused route keeps its router answers: 404 and 405 come first
    assert_error(h.post("/nope", headers={"Origin": "http://evil.example"}), 404, "NOT_FOUND")
    assert_error(h.get("/pub?topic=t", headers={"Origin": "http://evil.example"}), 405, "METHOD_NOT_ALLOWED")


# -- message bodies in /debug/state --------------------------------------------------------------


def state(h, path="/debug/state?bodies=true", headers=None):
    r = h.get(path, headers=headers)
    assert r.status == 200, r
    return json.loads(r.body)


def queues(doc):
    """Every message list of the document, by (topic, channel or "", list name)."""
    out = {}
    for t in doc["topics"]:
        out[(t["name"], "", "memory")] = t["memory"]
        for c in t["channels"]:
            for key in ("memory", "in_flight", "deferred"):
                out[(t["name"], c["name"], key)] = c[key]
    return out


def bodies_of(doc):
    return {key: [m["body"] for m in msgs if "body" in m] for key, msgs in queues(doc).items()}


def fill(h):
    """One message waiting in a topic without channels, and one in a channel's queue and its deferred set."""
    assert h.post("/pub?topic=lonely", b"secret in the topic").status == 200
    assert_empty(h.post("/topic/create?topic=orders"))
    assert_empty(h.post("/channel/create?topic=orders&channel=billing"))
    assert h.post("/pub?topic=orders", b"card 4111").status == 200
    assert h.post("/pub?topic=orders&defer=60000", b"card later").status == 200


def wait_for_channel(h):
    wait_for(lambda: [c["deferred_count"] + c["memory_depth"] for t in state(h)["topics"] if t["name"] == "orders"
                      for c in t["channels"]] == [2], what="the channel's messages")


def test_no_bodies_by_default(make_nsqd, client):
    h = client(make_nsqd())
    fill(h)
    wait_for_channel(h)
    for path in ("/debug/state", "/debug/state?bodies=true"):
        doc = state(h, path)
        assert all(not msgs for msgs in bodies_of(doc).values())
        lists = queues(doc)
        assert len(lists[("orders", "billing", "memory")]) == 1 and len(lists[("orders", "billing", "deferred")]) == 1
        assert lists[("lonely", "", "memory")][0]["attempts"] == 0
        assert not any(t["bodies"] for t in doc["topics"])
        assert "secret" not in json.dumps(doc) and "card 4111" not in json.dumps(doc)


def test_the_flag_shows_bodies_when_asked(make_nsqd, client):
    h = client(make_nsqd(debug_state_bodies=True))
    fill(h)
    wait_for_channel(h)
    assert all(not msgs for msgs in bodies_of(state(h, "/debug/state")).values())  # not asked
    doc = state(h)
    bodies = bodies_of(doc)
    assert bodies[("lonely", "", "memory")] == ["secret in the topic"]
    assert bodies[("orders", "billing", "memory")] == ["card 4111"]
    assert bodies[("orders", "billing", "deferred")] == ["card later"]
    assert all(t["bodies"] for t in doc["topics"])


@pytest.fixture
def auth_server():
    server = AuthServer()
    server.answers.update({
        "billing-reader": grant("^orders$", ["^billing$"], ["subscribe"], identity="billing"),
        "other-channel": grant("^orders$", ["^audit$"], ["subscribe"], identity="audit"),
        "publisher": grant(".*", [".*"], ["publish"], identity="producer"),
        "everything": grant(".*", [".*"], ["subscribe"], identity="ops"),
    })
    yield server
    server.close()


def test_under_auth_bodies_need_a_secret_granted_subscribe(make_nsqd, client, auth_server):
    nsqd = make_nsqd(debug_state_bodies=True, auth_http_addresses=[auth_server.address])
    h = client(nsqd)
    fill(h)
    wait_for_channel(h)

    def bodies(secret=None):
        headers = {"X-NSQ-Auth-Secret": secret} if secret is not None else None
        return {k: v for k, v in bodies_of(state(h, headers=headers)).items() if v}

    # no secret, an unknown one, a secret that may only publish: the figures, no body
    assert bodies() == {}
    asked = len(auth_server.requests)
    assert bodies("wrong") == {} and bodies("publisher") == {}
    assert len(auth_server.requests) == asked + 2
    doc = state(h, headers={"X-NSQ-Auth-Secret": "publisher"})
    assert [t["memory_depth"] for t in doc["topics"]] == [1, 0]  # the rest stays open
    # the secret travels in the header only: a query parameter is not read
    assert {k: v for k, v in bodies_of(state(h, "/debug/state?bodies=true&auth_secret=everything")).items()
            if v} == {}
    # subscribe on orders/billing: that channel's messages, and the topic's own queue of orders (empty here)
    assert bodies("billing-reader") == {("orders", "billing", "memory"): ["card 4111"],
                                        ("orders", "billing", "deferred"): ["card later"]}
    assert bodies("other-channel") == {}  # subscribe on orders, another channel
    assert bodies("everything") == {("lonely", "", "memory"): ["secret in the topic"],
                                    ("orders", "billing", "memory"): ["card 4111"],
                                    ("orders", "billing", "deferred"): ["card later"]}
    # what the auth server was told: the caller's address, no TLS, the secret
    method, _, query, _, _ = auth_server.requests[-1]
    assert (method, query["secret"], query["remote_ip"], query["tls"]) == ("GET", ["everything"], ["127.0.0.1"],
                                                                            ["false"])


def test_under_auth_a_failing_auth_server_gives_no_bodies(make_nsqd, client):
    server = AuthServer(mode="500")
    try:
        nsqd = make_nsqd(debug_state_bodies=True, auth_http_addresses=[server.address])
        h = client(nsqd)
        fill(h)
        doc = state(h, headers={"X-NSQ-Auth-Secret": "everything"})
        assert not any(bodies_of(doc).values()) and [t["name"] for t in doc["topics"]] == ["lonely", "orders"]
    finally:
        server.close()


def test_the_flag_is_an_nsqd_flag_with_a_config_key(tmp_path):
    from nsqd_threaded.testing import resolve_options
    assert resolve_options(["--debug-state-bodies"]) == {"debug_state_bodies": True}
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text("debug_state_bodies = true\n")
    assert resolve_options(["--config=%s" % cfg])["debug_state_bodies"] is True


def test_over_https_the_origin_is_https(make_nsqd, certs):  # noqa: F811 (the fixture)
    nsqd = make_nsqd(tls_cert=certs.server_cert, tls_key=certs.server_key, https_address="127.0.0.1:0")
    port = nsqd.https_address[1]

    def post(path, origin):
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=certs.client_context())
        try:
            conn.request("POST", path, headers={"Origin": origin})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    assert post("/topic/create?topic=t", "http://127.0.0.1:%d" % port) == (
        403, b'{"message":"CROSS_ORIGIN_FORBIDDEN"}')
    assert post("/topic/create?topic=t", "https://127.0.0.1:%d" % port) == (200, b"")
