"""Channel policies in nsqadmin: shown from the nodes' /stats (counters summed over nodes), set through
``POST /api/topics/<topic>/<channel> {"action": "set_policy", ...}``, which POSTs the broker's
``/channel/policy`` to every node that has the channel.

Real brokers and a real lookupd throughout.  The end-to-end tests need a broker with ``/channel/policy``:
they skip when it answers ``404 NOT_FOUND`` (the route is not there).  The hostile-node tests give a node's
``/stats`` policy fields carrying markup, and check every page shows them as text, in Chromium too.
"""

import json
import urllib.parse

import pytest

from nsqd_threaded.testing import Cluster

from support.admin import call, start_admin
from support.hostile import Catcher, HostileNode, payload
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(180)

JSON = {"Content-Type": "application/json"}
POLICY_FIELDS = ("max_attempts", "dead_letter_topic", "msg_ttl")
INHERITED = {"max_attempts": None, "dead_letter_topic": None, "msg_ttl": None}  # a channel without its own


def seg(name):
    return urllib.parse.quote(name, safe="")


@pytest.fixture
def setup():
    """Two brokers with orders/billing (and orders/audit on the first only), an nsqadmin over the lookupd."""
    with Cluster(2) as cluster:
        for broker in cluster:
            assert broker.http("POST", "/topic/create?topic=orders")[0] == 200
            assert broker.http("POST", "/channel/create?topic=orders&channel=billing")[0] == 200
        assert cluster[0].http("POST", "/channel/create?topic=orders&channel=audit")[0] == 200
        wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 2, what="registrations")
        admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
        try:
            yield cluster, admin
        finally:
            admin.stop()


def has_policy_route(broker):
    """False when the broker answers ``GET /channel/policy`` with ``404 NOT_FOUND`` (no such route)."""
    status, body = broker.http("GET", "/channel/policy?topic=orders&channel=billing")
    return not (status == 404 and json.loads(body or b"{}").get("message") == "NOT_FOUND")


def broker_policy(broker, topic="orders", channel="billing"):
    """The channel's own policy as the broker answers ``GET /channel/policy``; skip when it has no such route."""
    if not has_policy_route(broker):
        pytest.skip("the broker has no /channel/policy route (the policies feature is not merged)")
    status, body = broker.http("GET", "/channel/policy?topic=%s&channel=%s" % (seg(topic), seg(channel)))
    assert status == 200, body
    return json.loads(body)


def channel_stats(broker, topic, channel):
    for t in broker.stats(topic=topic)["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    return None


def set_policy(admin, channel="billing", headers=None, **fields):
    return call(admin.http_url + "/api/topics/orders/" + channel, "POST", dict(fields, action="set_policy"),
                headers)


# -- what nsqadmin refuses before asking any node ------------------------------------------------------


@pytest.mark.parametrize("fields, message", [
    ({"max_attempts": -1}, "INVALID_MAX_ATTEMPTS"),
    ({"max_attempts": "3"}, "INVALID_MAX_ATTEMPTS"),
    ({"max_attempts": True}, "INVALID_MAX_ATTEMPTS"),
    ({"max_attempts": 65536}, "INVALID_MAX_ATTEMPTS"),
    ({"dead_letter_topic": "orders"}, "INVALID_TOPIC"),  # the channel's own topic
    ({"dead_letter_topic": "bad name!"}, "INVALID_TOPIC"),
    ({"dead_letter_topic": 7}, "INVALID_TOPIC"),
    ({"msg_ttl": -5}, "INVALID_MSG_TTL"),
    ({"msg_ttl": "-5s"}, "INVALID_MSG_TTL"),
    ({"msg_ttl": "soon"}, "INVALID_MSG_TTL"),
    ({"msg_ttl": "500us"}, "INVALID_MSG_TTL"),
    ({"msg_ttl": 1.5}, "INVALID_MSG_TTL"),
])
def test_bad_fields_are_refused_and_change_nothing(setup, fields, message):
    cluster, admin = setup
    assert set_policy(admin, **fields) == (400, {"message": message})


def test_a_channel_no_node_has_is_not_found(setup):
    cluster, admin = setup
    assert set_policy(admin, "nope", max_attempts=3) == (404, {"message": "CHANNEL_NOT_FOUND"})


def test_a_topic_no_node_has_is_not_found(setup):
    """Never a 200 with a partial-failure warning: the lookupd's 404 for the topic is the answer."""
    cluster, admin = setup
    status, doc = call(admin.http_url + "/api/topics/nope/billing", "POST", {"action": "set_policy", "max_attempts": 3})
    assert (status, doc) == (404, {"message": "TOPIC_NOT_FOUND"})
    direct = start_admin(nsqd_http_addresses=[b.http_addr for b in cluster])  # (no lookupd: the nodes say it)
    try:
        status, doc = call(direct.http_url + "/api/topics/nope/billing", "POST",
                           {"action": "set_policy", "max_attempts": 3})
        assert (status, doc) == (404, {"message": "TOPIC_NOT_FOUND"})
    finally:
        direct.stop()


@pytest.mark.parametrize("inherit", [["max_attempt"], "max_attempts", [3], ["msg_ttl"]])
def test_a_bad_inherit_is_refused(setup, inherit):
    cluster, admin = setup
    assert set_policy(admin, inherit=inherit, msg_ttl="1s") == (400, {"message": "INVALID_INHERIT"})


def test_only_admins_may_set_a_policy(setup):
    cluster, admin = setup
    guarded = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["alice"])
    try:
        assert set_policy(guarded, max_attempts=3) == (403, {"message": "FORBIDDEN"})
        assert set_policy(guarded, headers={"X-Forwarded-User": "mallory"}, max_attempts=3)[0] == 403
        status, doc = set_policy(guarded, headers={"X-Forwarded-User": "alice"}, max_attempts=3)
        if status == 502 and "NOT_FOUND" in doc["message"]:
            pytest.skip("the broker has no /channel/policy route (the policies feature is not merged)")
        assert (status, doc) == (200, {"message": ""})
        assert all(broker_policy(b)["max_attempts"] == 3 for b in cluster)
    finally:
        guarded.stop()


def test_a_cross_origin_request_is_refused(setup):
    cluster, admin = setup
    url = admin.http_url + "/api/topics/orders/billing"
    body = json.dumps({"action": "set_policy", "max_attempts": 1}).encode()
    evil = {"Origin": "http://127.0.0.1:1"}
    assert call(url, "POST", body, dict(JSON, **evil)) == (403, {"message": "CROSS_ORIGIN_FORBIDDEN"})
    assert call(url, "POST", body, {"Referer": "http://evil.example/", **JSON})[0] == 403
    # what a form on another site can send: a text/plain body holding JSON
    assert call(url, "POST", body, {"Content-Type": "text/plain"}) == (415, {"message": "CONTENT_TYPE_NOT_JSON"})
    for broker in cluster:
        assert "max_attempts" not in channel_stats(broker, "orders", "billing")
        if has_policy_route(broker):
            assert broker_policy(broker) == INHERITED


# -- end to end, with the brokers' /channel/policy ------------------------------------------------------


def test_a_policy_is_set_on_every_node_that_has_the_channel(setup):
    cluster, admin = setup
    broker_policy(cluster[0])
    assert set_policy(admin, max_attempts=2, dead_letter_topic="orders.dead", msg_ttl="90s") == (
        200, {"message": ""})
    want = {"max_attempts": 2, "dead_letter_topic": "orders.dead", "msg_ttl": 90000}
    assert [broker_policy(b) for b in cluster] == [want, want]
    # the fields not given stay as they are; milliseconds are taken as they are
    assert set_policy(admin, msg_ttl=1500)[0] == 200
    assert [broker_policy(b)["msg_ttl"] for b in cluster] == [1500, 1500]
    assert [broker_policy(b)["max_attempts"] for b in cluster] == [2, 2]
    # only the node with the channel is asked; the other never gets it
    assert set_policy(admin, "audit", max_attempts=5)[0] == 200
    assert broker_policy(cluster[0], channel="audit")["max_attempts"] == 5
    assert channel_stats(cluster[1], "orders", "audit") is None

    # the API and the pages show the effective policy from /stats
    status, doc = call(admin.http_url + "/api/topics/orders/billing")
    assert status == 200
    assert {k: doc[k] for k in POLICY_FIELDS} == {"max_attempts": 2, "dead_letter_topic": "orders.dead",
                                                  "msg_ttl": 1500}
    assert (doc["dead_letter_count"], doc["expired_count"]) == (0, 0)
    page = call(admin.http_url + "/topics/orders/billing")[1]
    assert '<a href="/topics/orders.dead" class="dead-letter">orders.dead</a>' in page
    assert "<th>Dead-lettered</th>" in page and "1.5s" in page
    assert "<th>Policy</th>" in call(admin.http_url + "/topics/orders")[1]
    assert "<th>Expired</th>" in call(admin.http_url + "/nodes/" + seg(cluster[1].http_addr))[1]

    # 0 and empty values are the channel's own "nothing": unlimited, drop, no TTL
    assert set_policy(admin, max_attempts=0, dead_letter_topic="", msg_ttl="")[0] == 200
    assert [broker_policy(b) for b in cluster] == [{"max_attempts": 0, "dead_letter_topic": "", "msg_ttl": 0}] * 2
    # inherit gives fields back to each broker's default
    assert set_policy(admin, inherit=["max_attempts", "msg_ttl"])[0] == 200
    assert [broker_policy(b) for b in cluster] == [dict(INHERITED, dead_letter_topic="")] * 2
    assert set_policy(admin, inherit=list(POLICY_FIELDS))[0] == 200
    assert [broker_policy(b) for b in cluster] == [INHERITED] * 2


def test_nodes_that_differ_are_shown_so(setup):
    cluster, admin = setup
    broker_policy(cluster[0])
    assert cluster[0].http("POST", "/channel/policy?topic=orders&channel=billing&max_attempts=4")[0] == 200
    status, doc = call(admin.http_url + "/api/topics/orders/billing")
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert nodes[cluster[0].http_addr]["max_attempts"] == 4
    assert doc["max_attempts"] is None  # the total has no single value
    assert "differs by node" in call(admin.http_url + "/topics/orders/billing")[1]
    # where a dead-letter topic differs, the Total row says so (never "drop")
    assert cluster[1].http("POST", "/channel/policy?topic=orders&channel=billing&dead_letter_topic=orders.dead")[0] == 200
    page = call(admin.http_url + "/topics/orders/billing")[1]
    total = page[page.index("<strong>Total</strong>"):]
    total = total[:total.index("</tr>")]
    assert "\u2192 differs by node" in total and "drop" not in total
    status, doc = call(admin.http_url + "/api/topics/orders/billing")
    assert doc["dead_letter_topic"] is None and doc["own_policy"] == {"msg_ttl": None}  # the rest differ


def test_own_values_are_shown_beside_the_inherited_ones():
    with Cluster(1, max_attempts=4, dead_letter_topic="{topic}.dead") as cluster:
        broker = cluster[0]
        broker.http("POST", "/topic/create?topic=orders")
        broker.http("POST", "/channel/create?topic=orders&channel=billing")
        broker_policy(broker)
        assert broker.http("POST", "/channel/policy?topic=orders&channel=billing&max_attempts=0")[0] == 200
        wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 1, what="registration")
        admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
        try:
            status, doc = call(admin.http_url + "/api/topics/orders/billing")
            assert doc["own_policy"] == dict(INHERITED, max_attempts=0)
            assert doc["default_policy"] == {"max_attempts": 4, "dead_letter_topic": "orders.dead", "msg_ttl": 0}
            page = call(admin.http_url + "/topics/orders/billing")[1]
            row = page[page.index('<tr data-field="max_attempts">'):]
            row = row[:row.index("</tr>")]
            assert ('<td class="effective">unlimited</td><td class="own">unlimited</td>'
                    '<td class="default">4</td>') in row
            row = page[page.index('<tr data-field="dead_letter_topic">'):]
            row = row[:row.index("</tr>")]
            assert '<td class="own"><span class="inherited">inherits the default</span></td>' in row
            # the form: max attempts is the channel's own, the others inherit (the default named)
            assert '<option value="own" selected>own</option>' in page
            assert '<option value="inherit" selected>inherit (orders.dead)</option>' in page
            assert '<option value="inherit">inherit (4)</option>' in page
        finally:
            admin.stop()


def test_dead_lettered_and_expired_counts_are_summed_over_nodes(setup):
    cluster, admin = setup
    broker_policy(cluster[0])
    assert set_policy(admin, max_attempts=1, dead_letter_topic="orders.dead")[0] == 200
    for broker in cluster:
        broker.http("POST", "/pub?topic=orders", b"poison")
        with Conn(broker.tcp_address) as consumer:
            consumer.identify()
            consumer.sub("orders", "billing", rdy=1)
            _, attempts, msg_id, body = consumer.read_message()
            assert body == b"poison"
            consumer.cmd(b"REQ " + msg_id + b" 0")  # its second delivery would be over max attempts
            wait_for(lambda: channel_stats(broker, "orders", "billing")["dead_letter_count"] == 1,
                     what="the message dead-lettered")
    assert call(admin.http_url + "/api/topics/orders/billing")[1]["dead_letter_count"] == 2
    topic = call(admin.http_url + "/api/topics/orders")[1]
    [billing] = [c for c in topic["channels"] if c["channel_name"] == "billing"]
    assert billing["dead_letter_count"] == 2

    # a TTL of one millisecond: a message published before anyone subscribes expires on the way
    assert set_policy(admin, max_attempts=0, msg_ttl="1ms")[0] == 200
    for broker in cluster:
        broker.http("POST", "/pub?topic=orders", b"stale")
    wait_for(lambda: all(channel_stats(b, "orders", "billing")["depth"] == 1 for b in cluster), what="queued")
    for broker in cluster:
        with Conn(broker.tcp_address) as consumer:
            consumer.identify()
            consumer.sub("orders", "billing", rdy=1)
            wait_for(lambda: channel_stats(broker, "orders", "billing")["expired_count"] == 1,
                     what="the message expired")
    doc = call(admin.http_url + "/api/topics/orders/billing")[1]
    assert (doc["dead_letter_count"], doc["expired_count"]) == (2, 2)


# -- hostile nodes: policy fields carrying markup -------------------------------------------------------


RAW_MARKUP = ("<img", "<svg", "<script>", "onerror=\"", "onload=\"", "\"'>")


@pytest.fixture(scope="module")
def catcher():
    c = Catcher()
    yield c
    c.close()


@pytest.fixture(scope="module")
def hostile(catcher):
    """A real broker and lookupd, and a node whose /stats gives orders/billing a policy full of payloads, and a
    topic and a channel whose names are payloads."""
    with Cluster(1) as cluster:
        cluster[0].http("POST", "/topic/create?topic=other")
        p = payload(catcher.url, "policy")
        policy = {"max_attempts": 5, "dead_letter_topic": p, "msg_ttl": 30000, "dead_letter_count": 3,
                  "expired_count": 4, "own_policy": {"max_attempts": None, "dead_letter_topic": p, "msg_ttl": 0},
                  "default_policy": {"max_attempts": 5, "dead_letter_topic": p, "msg_ttl": 30000}}
        stats = {"version": "1.3.0", "health": "OK", "start_time": 1, "topics": [
            {"topic_name": "orders", "depth": 1, "channels": [dict(policy, channel_name="billing", depth=1)]},
            {"topic_name": p, "channels": [dict(policy, channel_name=p)]},
        ]}
        node = HostileNode({"/stats": stats, "/info": {"version": "1.3.0", "hostname": "dlq"}})
        try:
            node.register(cluster.lookupd.tcp_address, "orders", "billing")
            wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 1, what="the node's registration")
            admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], chart_sample_interval=0.2)
            try:
                yield {"admin": admin, "node": node.node, "payload": p}
            finally:
                admin.stop()
        finally:
            node.close()


def hostile_pages(h):
    """The pages that show the node's policy fields (the node page: its payload-named topic and channel too)."""
    return ("/topics/orders", "/topics/orders/billing", "/nodes/" + seg(h["node"]))


def test_policy_fields_with_markup_are_text(hostile, catcher):
    admin, p = hostile["admin"], hostile["payload"]
    for path in hostile_pages(hostile):
        status, text = call(admin.http_url + path)
        assert status == 200, (path, text[:300])
        text = text.replace('<svg class="plot" ', "<chart ")  # (nsqadmin's own charts: the server's SVG)
        for raw in RAW_MARKUP:
            assert raw not in text, (path, raw)
        assert "window.__pwned=&#x27;policy&#x27;" in text, path
    # the dead-letter topic links to its page, its name one quoted segment of the path
    assert 'href="/topics/%s"' % seg(p) in call(admin.http_url + "/topics/orders/billing")[1]
    doc = call(admin.http_url + "/api/topics/orders/billing")[1]
    assert (doc["dead_letter_topic"], doc["dead_letter_count"], doc["expired_count"]) == (p, 3, 4)
    assert not catcher.seen()


@pytest.mark.parametrize("field, value", [("max_attempts", "5"), ("msg_ttl", 1.5), ("dead_letter_topic", 7),
                                          ("dead_letter_count", "3"), ("expired_count", True),
                                          ("own_policy", "inherit"), ("own_policy", {"max_attempts": "5"}),
                                          ("default_policy", [1]), ("default_policy", {"dead_letter_topic": 7})])
def test_a_policy_field_of_the_wrong_type_fails_that_node(field, value):
    with Cluster(1) as cluster:
        real = cluster[0]
        real.http("POST", "/topic/create?topic=orders")
        real.http("POST", "/channel/create?topic=orders&channel=billing")
        bad = HostileNode({"/stats": {"topics": [{"topic_name": "orders", "channels": [
            {"channel_name": "billing", "max_attempts": 1, field: value}]}]}, "/info": {"version": "1.3.0"}})
        admin = None
        try:
            bad.register(cluster.lookupd.tcp_address, "orders", "billing")
            wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 2, what="two producers")
            admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
            status, doc = call(admin.http_url + "/api/topics/orders/billing")
            assert status == 200 and bad.node in doc["message"] and "channels[0]." + field in doc["message"]
            assert [n["node"] for n in doc["nodes"]] == [real.http_addr]
            assert call(admin.http_url + "/topics/orders/billing")[0] == 200
        finally:
            if admin is not None:
                admin.stop()
            bad.close()


INJECTED = """
var found = [];
document.querySelectorAll("img, iframe, object, embed, [onerror], [onload], [onclick]").forEach(function (e) {
  found.push(e.outerHTML.slice(0, 120));
});
document.querySelectorAll("script").forEach(function (s) {
  if (!/\\/static\\/admin\\.js$/.test(s.getAttribute("src") || "")) found.push(s.outerHTML.slice(0, 120));
});
document.querySelectorAll("svg").forEach(function (s) {
  if (!s.closest(".chart")) found.push(s.outerHTML.slice(0, 120));
});
return {pwned: window.__pwned === undefined ? null : String(window.__pwned), injected: found};
"""


@pytest.mark.browser
def test_no_policy_field_runs_in_the_browser(browser, hostile, catcher, tmp_path):
    admin, p = hostile["admin"], hostile["payload"]
    for i, path in enumerate(hostile_pages(hostile)):
        browser.get(admin.http_url + path)
        if "/topics/" in path:
            browser.wait(lambda: browser.find_all("#charts .chart svg"), "the charts on " + path)
        browser.run("document.getElementById('tables').firstChild.__old = true;")
        browser.wait(lambda: browser.run("return !document.getElementById('tables').firstChild.__old;"),
                     "the tables refreshed on " + path)
        assert browser.run(INJECTED) == {"pwned": None, "injected": []}, path
        browser.screenshot(str(tmp_path / ("hostile-%d.png" % i)))
    browser.get(admin.http_url + "/topics/orders/billing")
    assert browser.text(browser.find("#tables a.dead-letter")) == p
    assert browser.run("return document.querySelector('#policy-form [name=dead_letter_topic]').value;") == p
    assert not catcher.seen()


# -- the form, in the browser -------------------------------------------------------------------------------


@pytest.mark.browser
def test_the_form_sets_the_policy(browser, setup, tmp_path):
    cluster, admin = setup
    broker_policy(cluster[0])
    browser.get(admin.http_url + "/topics/orders/billing")
    # (the page draws the tables after its first fetch: under load that comes after get() returns)
    browser.wait(lambda: browser.find_all("#tables p.policy.none"), "the page to show no policy")
    def submit_and_reload():
        # A saved policy reloads the page, whose #flash then confirms it: the page before the
        # reload (marked here) may still show the last confirmation, and a value set in it is lost.
        browser.run("window.beforeSubmit = true;")
        browser.click(browser.find("#policy-form button"))
        browser.wait(lambda: browser.run("return window.beforeSubmit === undefined && "
                                         "document.readyState === 'complete';"), "the page reloaded")

    browser.run("var f = document.getElementById('policy-form');"
                "f.querySelector('[name=max_attempts]').value = '3';"
                "f.querySelector('[name=dead_letter_topic]').value = 'orders.dead';")
    submit_and_reload()
    want = {"max_attempts": 3, "dead_letter_topic": "orders.dead", "msg_ttl": None}
    browser.wait(lambda: all(broker_policy(b) == want for b in cluster), "the policy on both brokers")
    browser.wait(lambda: browser.find_all("#tables a.dead-letter"), "the page to show the policy")
    # a confirmation once saved
    browser.wait(lambda: browser.text(browser.find("#flash.ok")).startswith("Policy saved"), "the confirmation")
    browser.screenshot(str(tmp_path / "policy.png"))
    # the channel's own "no TTL" (select "own", the value 0), and max attempts back to the default
    browser.run("var f = document.getElementById('policy-form');"
                "f.querySelector('[name=msg_ttl_mode]').value = 'own';"
                "f.querySelector('[name=msg_ttl]').value = '0';"
                "f.querySelector('[name=max_attempts_mode]').value = 'inherit';")
    submit_and_reload()
    want = {"max_attempts": None, "dead_letter_topic": "orders.dead", "msg_ttl": 0}
    browser.wait(lambda: all(broker_policy(b) == want for b in cluster), "own no-TTL, inherited max attempts")
    browser.wait(lambda: browser.find_all("#flash.ok"), "the confirmation again")
    browser.wait(lambda: browser.run(
        "return document.querySelector('#policy-form [name=max_attempts_mode]').value;") == "inherit", "the form")
    # typing a value makes the field the channel's own: its select follows the keys
    browser.type(browser.find("#policy-form [name=max_attempts]"), "7")
    assert browser.run("return document.querySelector('#policy-form [name=max_attempts_mode]').value;") == "own"
    submit_and_reload()
    want = dict(want, max_attempts=7)
    browser.wait(lambda: all(broker_policy(b) == want for b in cluster), "the typed value on both brokers")
    browser.wait(lambda: browser.find_all("#flash.ok"), "the confirmation once more")
    # a bad value: the API's answer in the flash, saying what is wrong and how to fix it; nothing changed
    browser.run("document.querySelector('#policy-form [name=msg_ttl]').value = 'soon';")
    browser.click(browser.find("#policy-form button"))
    browser.wait(lambda: "INVALID_MSG_TTL" in browser.text(browser.find("#flash")), "the error shown")
    shown = browser.text(browser.find("#flash"))
    assert shown.startswith("The message TTL must be a duration such as 30s") and "400 INVALID_MSG_TTL" in shown
    assert not browser.find_all("#flash.ok")
    assert all(broker_policy(b) == want for b in cluster)
    assert not [e for e in browser.browser_log() if e.get("level") == "SEVERE" and "400" not in e["message"]]


@pytest.mark.browser
def test_the_form_says_when_only_some_nodes_took_the_policy(browser, tmp_path):
    """One node takes it, one refuses the POST: the banner says it was saved only where nodes answered, and
    what to do; never the bare warning, never "Policy saved"."""
    with Cluster(1) as cluster:
        real = cluster[0]
        real.http("POST", "/topic/create?topic=orders")
        real.http("POST", "/channel/create?topic=orders&channel=billing")
        broker_policy(real)
        refusing = HostileNode({"/stats": {"topics": [{"topic_name": "orders", "channels": [
            {"channel_name": "billing"}]}]}, "/info": {"version": "1.3.0"}})  # (no POST: 501)
        admin = None
        try:
            refusing.register(cluster.lookupd.tcp_address, "orders", "billing")
            wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 2, what="two producers")
            admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
            browser.get(admin.http_url + "/topics/orders/billing")
            browser.run("document.querySelector('#policy-form [name=max_attempts]').value = '3';")
            browser.click(browser.find("#policy-form button"))
            browser.wait(lambda: "answered only" in browser.text(browser.find("#flash")), "the partial banner")
            shown = browser.text(browser.find("#flash"))
            assert shown.startswith("Saved on the nodes that answered only") and refusing.node in shown
            assert not browser.find_all("#flash.ok")
            assert broker_policy(real)["max_attempts"] == 3
            browser.screenshot(str(tmp_path / "partial.png"))
        finally:
            if admin is not None:
                admin.stop()
            refusing.close()
