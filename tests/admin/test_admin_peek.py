"""The channel page's Peek section and ``GET /api/peek/<topic>/<channel>``: a channel's next messages, for
admins only, asked of each node's ``/channel/peek`` (brokers run with ``--channel-peek``).

Real brokers, a real lookupd, a real nsqadmin and, for the page, headless Chromium.
"""

import pytest

from nsqd_threaded.admin.peek import PEEK_COUNT
from nsqd_threaded.testing import Broker, Cluster

from support.admin import call, start_admin
from support.auth import AuthServer
from support.hostile import HostileNode
from support.wire import wait_for

pytestmark = pytest.mark.timeout(180)

ADMIN = {"X-Forwarded-User": "alice"}
# bodies whose markup fits a preview (debug_state.BODY_PREVIEW bytes), each of which would run if parsed
HOSTILE = ['<img src=x onerror="__pwned=1">', "<script>__pwned=2</script>", '<svg onload="__pwned=3">']


def publish(broker, bodies):
    for body in bodies:
        status, answer = broker.http("POST", "/pub?topic=orders", body.encode())
        assert status == 200, answer


def make_channel(cluster):
    for broker in cluster:
        assert broker.http("POST", "/topic/create?topic=orders")[0] == 200
        assert broker.http("POST", "/channel/create?topic=orders&channel=billing")[0] == 200
    wait_for(lambda: len(cluster.lookupd.lookup("orders")) == len(list(cluster)), what="registrations")


@pytest.fixture
def peek_cluster():
    """Two brokers with --channel-peek and orders/billing; an nsqadmin whose admin is alice."""
    with Cluster(2, channel_peek=True) as cluster:
        make_channel(cluster)
        admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["alice"])
        try:
            yield cluster, admin
        finally:
            admin.stop()


def peek(admin, headers=ADMIN):
    return call(admin.http_url + "/api/peek/orders/billing", headers=headers)


def node_name(broker):
    return broker.http_addr


def test_an_admin_sees_each_nodes_next_messages_in_order(peek_cluster):
    cluster, admin = peek_cluster
    publish(cluster[0], ["a1", "a2", "a3"])
    publish(cluster[1], ["b1", "b2"])
    status, doc = peek(admin)
    assert status == 200, doc
    assert doc["message"] == ""
    by_node = {nd["node"]: nd for nd in doc["nodes"]}
    assert set(by_node) == {node_name(b) for b in cluster}
    assert [m["body"] for m in by_node[node_name(cluster[0])]["messages"]] == ["a1", "a2", "a3"]
    assert [m["body"] for m in by_node[node_name(cluster[1])]["messages"]] == ["b1", "b2"]
    for nd in doc["nodes"]:
        assert nd["peek"] == "on"
        for m in nd["messages"]:
            assert set(m) <= {"id", "attempts", "timestamp", "body", "state", "due_ns"}
            assert m["state"] == "queued" and m["attempts"] == 0
    # nothing was consumed
    assert cluster[0].messages("orders", "billing") and peek(admin)[1] == doc


def test_a_non_admin_gets_no_bodies(peek_cluster):
    cluster, admin = peek_cluster
    publish(cluster[0], ["secret-body"])
    for headers in ({}, {"X-Forwarded-User": "bob"}):
        assert peek(admin, headers) == (403, {"message": "FORBIDDEN"})
        status, page = call(admin.http_url + "/topics/orders/billing", headers=headers)
        assert status == 200
        assert 'id="peek"' not in page and "data-peek" not in page and "secret-body" not in page
    status, page = call(admin.http_url + "/topics/orders/billing", headers=ADMIN)
    assert 'id="peek"' in page and 'data-peek="/api/peek/orders/billing"' in page
    assert "secret-body" not in page  # the page itself never carries bodies: the script asks


def test_without_admin_users_nobody_peeks(peek_cluster):
    cluster, _ = peek_cluster
    admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
    try:
        assert peek(admin) == (403, {"message": "FORBIDDEN"})
        assert 'id="peek"' not in call(admin.http_url + "/topics/orders/billing", headers=ADMIN)[1]
    finally:
        admin.stop()


def test_a_cross_origin_request_is_refused(peek_cluster):
    _, admin = peek_cluster
    for header in ({"Origin": "http://evil.example"}, {"Referer": "http://evil.example/page"}):
        assert peek(admin, dict(ADMIN, **header)) == (403, {"message": "CROSS_ORIGIN_FORBIDDEN"})
    same = {"Referer": admin.http_url + "/topics/orders/billing"}
    assert peek(admin, dict(ADMIN, **same))[0] == 200


def test_a_node_without_channel_peek_says_so():
    with Cluster(1, channel_peek=False) as cluster:
        make_channel(cluster)
        publish(cluster[0], ["hidden"])
        admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["alice"])
        try:
            status, doc = peek(admin)
        finally:
            admin.stop()
    assert status == 200
    assert doc["nodes"] == [{"node": node_name(cluster[0]), "peek": "off", "messages": [], "error": ""}]


def test_under_auth_nsqadmin_sends_no_secret_so_the_node_gives_no_bodies():
    auth = AuthServer()
    try:
        with Cluster(1, channel_peek=True, auth_http_addresses=[auth.address]) as cluster:
            assert cluster[0].http("POST", "/topic/create?topic=orders")[0] == 200
            assert cluster[0].http("POST", "/channel/create?topic=orders&channel=billing")[0] == 200
            wait_for(lambda: cluster.lookupd.lookup("orders"), what="registration")
            admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["alice"])
            try:
                status, doc = peek(admin)
            finally:
                admin.stop()
    finally:
        auth.close()
    assert status == 200
    [nd] = doc["nodes"]
    assert nd["peek"] == "refused" and nd["messages"] == [] and nd["error"] == "AUTH_REQUIRED"


def test_bodies_come_only_from_the_nodes_peek_answer_field_by_field():
    """A node's /stats and /debug/state full of body-like fields give no peeked message; its peek answer
    keeps only the known fields of the right type."""
    stats = {"version": "1.3.0", "health": "OK", "start_time": 1, "topics": [{
        "topic_name": "orders", "depth": 1, "messages": [{"id": "x", "body": "from-stats"}], "body": "from-stats",
        "channels": [{"channel_name": "billing", "depth": 1, "body": "from-stats",
                      "messages": [{"id": "x", "body": "from-stats"}], "clients": []}]}]}
    state = {"topics": [{"name": "orders", "memory": {"messages": [{"id": "x", "body": "from-state"}]}}]}
    quiet = HostileNode({"/stats": stats, "/debug/state": state})
    chatty = HostileNode({"/stats": stats, "/debug/state": state, "/channel/peek": {
        "messages": [{"id": "a", "attempts": 1, "timestamp": 5, "body": "peeked", "state": "queued", "due_ns": None,
                      "extra": "<b>x</b>"},
                     {"id": 7, "attempts": "1", "body": {"html": "<i>"}, "state": True},
                     "not an object"],
        "body": "from-the-document"}})
    try:
        with Cluster(1) as cluster:
            quiet.register(cluster.lookupd.tcp_address, "orders", "billing")
            chatty.register(cluster.lookupd.tcp_address, "orders", "billing")
            wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 2, what="registrations")
            admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["alice"])
            try:
                status, doc = peek(admin)
            finally:
                admin.stop()
    finally:
        quiet.close()
        chatty.close()
    assert status == 200
    by_node = {nd["node"]: nd for nd in doc["nodes"]}
    assert by_node[quiet.node] == {"node": quiet.node, "peek": "off", "messages": [], "error": ""}
    assert by_node[chatty.node]["messages"] == [
        {"id": "a", "attempts": 1, "timestamp": 5, "body": "peeked", "state": "queued"}, {}]
    assert "from-" not in str(doc)
    assert [r for r in quiet.requests if r.startswith("/channel/peek?")] \
        == ["/channel/peek?topic=orders&channel=billing&n=%d" % PEEK_COUNT]


@pytest.mark.browser
def test_the_page_shows_bodies_as_text_and_the_off_note(browser, tmp_path):
    with Cluster(1, channel_peek=True) as cluster:
        with Broker(nsqlookupd_tcp_addresses=[cluster.lookupd.tcp_addr], broadcast_address="127.0.0.1",
                    channel_peek=False) as off:
            for broker in (cluster[0], off):
                assert broker.http("POST", "/topic/create?topic=orders")[0] == 200
                assert broker.http("POST", "/channel/create?topic=orders&channel=billing")[0] == 200
            wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 2, what="registrations")
            publish(cluster[0], ["first"] + HOSTILE)
            admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["alice"])
            try:
                browser._s("/goog/cdp/execute", "POST", {"cmd": "Network.enable", "params": {}})
                browser._s("/goog/cdp/execute", "POST", {"cmd": "Network.setExtraHTTPHeaders",
                                                         "params": {"headers": ADMIN}})
                browser.get(admin.http_url + "/topics/orders/billing")
                browser.wait(lambda: len(browser.find_all("#peek table.peek td.body")) == 4, "the peeked rows")
                bodies = browser.run("return Array.prototype.map.call(document.querySelectorAll("
                                     "'#peek td.body'), function (e) { return e.textContent; });")
                assert bodies == ["first"] + HOSTILE
                notes = [browser.text(e) for e in browser.find_all("#peek tr.peek-note")]
                assert notes == [node_name(off) + " peek is off on this node"]
                browser.run("document.getElementById('peek').scrollIntoView();")
                browser.screenshot(str(tmp_path / "peek.png"))
                found = browser.run(
                    "var f = []; document.querySelectorAll('#peek *').forEach(function (e) {"
                    "  if (['TABLE','THEAD','TBODY','TR','TH','TD','H2','P'].indexOf(e.tagName) < 0)"
                    "    f.push(e.tagName); });"
                    "return {pwned: window.__pwned === undefined ? null : String(window.__pwned), found: f};")
                assert found == {"pwned": None, "found": []}
                assert not [u for u in browser.run("return performance.getEntriesByType('resource')"
                                                   ".map(function (e) { return e.name; });") if u.endswith("/x")]
            finally:
                admin.stop()
