"""nsqadmin and dead letters (not in Go nsqadmin): the Peek section shows where each came from, and the
channel page's Redrive button (admins only, asked first, same-site JSON only) sends them back through
each node's ``/channel/redrive``.

Real brokers, a real lookupd, a real nsqadmin and, for the page, headless Chromium.
"""

import pytest

from nsqd_threaded.admin.peek import peek_message
from nsqd_threaded.testing import Cluster

from support.admin import call, start_admin
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(180)

ADMIN = {"X-Forwarded-User": "alice"}
DEAD = "orders.dead"
REDRIVE_URL = "/api/topics/orders.dead/inspect"


def channel_doc(broker, topic, channel):
    for t in broker.stats(topic=topic)["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    return None


def depth(broker, topic, channel):
    return channel_doc(broker, topic, channel)["depth"]


def dead_letters(broker, bodies):
    """On ``broker``: orders/billing dead-letters to orders.dead after one attempt; ``bodies`` fail once."""
    with Conn(broker.tcp_address) as pub, Conn(broker.tcp_address) as sub:
        for body in bodies:
            assert pub.pub("orders", body) == b"OK"
        sub.sub("orders", "billing", rdy=len(bodies))
        for _ in bodies:
            sub.cmd(b"REQ %s 0" % sub.read_message()[2])
        wait_for(lambda: depth(broker, DEAD, "inspect") == len(bodies), what="the dead letters")
    # Gone before anything is redriven: a consumer still registered could be handed a redriven message.
    wait_for(lambda: channel_doc(broker, "orders", "billing")["client_count"] == 0, what="the consumer gone")


@pytest.fixture
def redrive_cluster():
    """Two brokers with --channel-peek, orders/billing's policy and orders.dead/inspect on both; dead
    letters a1, a2 on the first and b1 on the second; an nsqadmin whose admin is alice."""
    with Cluster(2, channel_peek=True) as cluster:
        for broker in cluster:
            for path in ("/topic/create?topic=orders", "/channel/create?topic=orders&channel=billing",
                         "/topic/create?topic=" + DEAD, "/channel/create?topic=%s&channel=inspect" % DEAD,
                         "/channel/policy?topic=orders&channel=billing&max_attempts=1&dead_letter_topic=" + DEAD):
                assert broker.http("POST", path)[0] == 200, path
        wait_for(lambda: len(cluster.lookupd.lookup(DEAD)) == 2, what="registrations")
        dead_letters(cluster[0], [b"a1", b"a2"])
        dead_letters(cluster[1], [b"b1"])
        admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["alice"])
        try:
            yield cluster, admin
        finally:
            admin.stop()


def test_peek_shows_where_each_dead_letter_came_from(redrive_cluster):
    cluster, admin = redrive_cluster
    status, doc = call(admin.http_url + "/api/peek/orders.dead/inspect", headers=ADMIN)
    assert status == 200, doc
    by_node = {nd["node"]: nd["messages"] for nd in doc["nodes"]}
    first = by_node[cluster[0].http_addr]
    assert [m["body"] for m in first] == ["a1", "a2"]
    for m in first:
        d = m["dead_letter"]
        assert (d["topic"], d["channel"], d["reason"], d["attempts"]) == ("orders", "billing", "max_attempts", 1)
        assert set(d) == {"topic", "channel", "reason", "attempts", "id", "timestamp", "at"}
        assert d["timestamp"] == m["timestamp"] and d["id"] != m["id"]


def test_only_an_admin_redrives_same_site_json_only_and_bad_input_changes_nothing(redrive_cluster):
    cluster, admin = redrive_cluster
    url = admin.http_url + REDRIVE_URL
    json_type = {"Content-Type": "application/json"}
    for headers in ({}, {"X-Forwarded-User": "bob"}):
        assert call(url, "POST", {"action": "redrive"}, headers) == (403, {"message": "FORBIDDEN"})
    assert call(url, "POST", {"action": "redrive"}, dict(ADMIN, Origin="http://evil.example")) == (
        403, {"message": "CROSS_ORIGIN_FORBIDDEN"})
    assert call(url, "POST", b'{"action":"redrive"}', dict(ADMIN, **{"Content-Type": "text/plain"})) == (
        415, {"message": "CONTENT_TYPE_NOT_JSON"})
    for body, message in (({"action": "redrive", "to": "bad!name"}, "INVALID_TO"),
                          ({"action": "redrive", "to": DEAD}, "INVALID_TO"),
                          ({"action": "redrive", "to": 5}, "INVALID_TO"),
                          ({"action": "redrive", "n": 0}, "INVALID_N"),
                          ({"action": "redrive", "n": "2"}, "INVALID_N"),
                          ({"action": "redrive", "n": True}, "INVALID_N")):
        assert call(url, "POST", body, dict(ADMIN, **json_type)) == (400, {"message": message}), body
    assert call(admin.http_url + "/api/topics/orders.dead/nope", "POST", {"action": "redrive"}, ADMIN) == (
        404, {"message": "CHANNEL_NOT_FOUND"})
    # (a topic no lookupd or node knows: 404, never a 200 with a partial-failure warning)
    assert call(admin.http_url + "/api/topics/nope/inspect", "POST", {"action": "redrive"}, ADMIN) == (
        404, {"message": "TOPIC_NOT_FOUND"})
    assert [depth(b, DEAD, "inspect") for b in cluster] == [2, 1]
    assert [depth(b, "orders", "billing") for b in cluster] == [0, 0]

    status, doc = call(url, "POST", {"action": "redrive", "n": 1}, ADMIN)
    assert (status, doc) == (200, {"message": "", "moved": 2})  # (up to n on each node)
    assert [depth(b, DEAD, "inspect") for b in cluster] == [1, 0]
    assert [depth(b, "orders", "billing") for b in cluster] == [1, 1]
    assert call(url, "POST", {"action": "redrive"}, ADMIN) == (200, {"message": "", "moved": 1})
    assert [depth(b, "orders", "billing") for b in cluster] == [2, 1]


@pytest.mark.browser
def test_the_redrive_button_asks_first(browser, redrive_cluster, tmp_path):
    cluster, admin = redrive_cluster
    browser._s("/goog/cdp/execute", "POST", {"cmd": "Network.enable", "params": {}})
    browser._s("/goog/cdp/execute", "POST", {"cmd": "Network.setExtraHTTPHeaders", "params": {"headers": ADMIN}})
    browser.get(admin.http_url + "/topics/orders.dead/inspect")
    browser.wait(lambda: len(browser.find_all("#peek table.peek td.dead-letter")) == 3, "the peeked dead letters")
    texts = browser.run("return Array.prototype.map.call(document.querySelectorAll('#peek td.dead-letter'),"
                        " function (e) { return e.textContent; });")
    assert all(t.startswith("orders/billing: max_attempts after 1 attempts (original id ") for t in texts), texts
    browser.screenshot(str(tmp_path / "dead-letters.png"))
    browser.click(browser.find("button.redrive"))
    browser.wait(browser.alert_open, "the confirmation")
    browser._s("/alert/dismiss", "POST", {})  # (no: nothing moves)
    browser.click(browser.find("button.redrive"))
    browser.wait(browser.alert_open, "the confirmation again")
    browser.accept_alert()
    browser.wait(lambda: [depth(b, "orders", "billing") for b in cluster] == [2, 1], "the dead letters back")
    assert [depth(b, DEAD, "inspect") for b in cluster] == [0, 0]
    # The page reloads and says how many moved (summed over the nodes), once.
    browser.wait(lambda: browser.find_all("#flash.ok"), "the confirmation")
    assert browser.text(browser.find("#flash.ok")) == "Redrive: moved 3 messages back."
    browser.get(admin.http_url + "/topics/orders.dead/inspect")
    browser.wait(lambda: browser.find_all("button.redrive"), "the page again")
    assert not browser.find_all("#flash.ok")


def test_a_non_admin_page_has_no_redrive_button(redrive_cluster):
    _, admin = redrive_cluster
    status, page = call(admin.http_url + "/topics/orders.dead/inspect", headers={"X-Forwarded-User": "bob"})
    assert status == 200 and "redrive" not in page
    status, page = call(admin.http_url + "/topics/orders.dead/inspect", headers=ADMIN)
    assert status == 200 and 'class="action redrive"' in page and "data-confirm=" in page


def test_only_a_dead_letter_topics_channels_have_the_redrive_button(redrive_cluster):
    """The brokers say which topics are dead-letter topics (``is_dead_letter_topic`` in /stats); the
    channel page offers a redrive only there, even to an admin."""
    cluster, admin = redrive_cluster
    status, page = call(admin.http_url + "/topics/orders/billing", headers=ADMIN)
    assert status == 200 and "redrive" not in page and 'class="action delete"' in page
    status, doc = call(admin.http_url + "/api/topics/orders.dead/inspect", headers=ADMIN)
    assert status == 200 and doc["is_dead_letter_topic"] is True
    status, doc = call(admin.http_url + "/api/topics/orders/billing", headers=ADMIN)
    assert status == 200 and "is_dead_letter_topic" not in doc
    status, doc = call(admin.http_url + "/api/topics/orders.dead")
    assert status == 200 and doc["is_dead_letter_topic"] is True
    assert all(n["is_dead_letter_topic"] is True for n in doc["nodes"])


def test_a_nodes_dead_letter_fields_are_kept_only_with_their_types():
    item = {"id": "a", "attempts": 1, "timestamp": 5, "body": "x", "state": "queued",
            "dead_letter": {"topic": "orders", "channel": ["<b>"], "reason": "max_attempts", "attempts": "5",
                            "id": "b", "timestamp": True, "at": 7, "html": "<script>"}}
    assert peek_message(item)["dead_letter"] == {"topic": "orders", "reason": "max_attempts", "id": "b", "at": 7}
    assert "dead_letter" not in peek_message(dict(item, dead_letter="<i>from a liar</i>"))


@pytest.mark.browser
def test_a_redrive_stopped_by_a_message_without_provenance_says_why(browser, redrive_cluster):
    """A message published straight to the dead-letter topic has no recorded source: each node moves the
    dead letters before it and stops there (400 MISSING_ARG_TO), and the banner says what that means."""
    cluster, admin = redrive_cluster
    for broker in cluster:
        assert broker.http("POST", "/pub?topic=" + DEAD, b"stray")[0] == 200
    wait_for(lambda: [depth(b, DEAD, "inspect") for b in cluster] == [3, 2], what="the strays queued")
    browser._s("/goog/cdp/execute", "POST", {"cmd": "Network.enable", "params": {}})
    browser._s("/goog/cdp/execute", "POST", {"cmd": "Network.setExtraHTTPHeaders", "params": {"headers": ADMIN}})
    browser.get(admin.http_url + "/topics/orders.dead/inspect")
    browser.click(browser.find("button.redrive"))
    browser.wait(browser.alert_open, "the confirmation")
    browser.accept_alert()
    browser.wait(lambda: "MISSING_ARG_TO" in browser.text(browser.find("#flash")), "the refusal explained")
    shown = browser.text(browser.find("#flash"))
    assert shown.startswith("A message in this channel has no recorded source"), shown
    assert not browser.find_all("#flash.ok")
    # What came before each stray moved; the strays wait at the head, in order.
    assert [depth(b, "orders", "billing") for b in cluster] == [2, 1]
    assert [depth(b, DEAD, "inspect") for b in cluster] == [1, 1]
