"""nsqadmin against a hostile node, tried as an attacker would.

nsqlookupd has no authentication: anything that reaches its TCP port can IDENTIFY and REGISTER as a
broker, then serve its own ``/stats``, ``/info`` and ``/debug/state``.  Here a real nsqlookupd and a
real broker (whose documents are the templates) share the cluster with three hostile nodes:

* ``liar``: every field of every document (numbers included) and of its registration is a payload
  that breaks out of text, of both kinds of attribute quotes, and of URLs;
* ``typed``: documents of the right types, every string in them a payload (topic, channel and client
  names included);
* ``unroutable``: a registration whose broadcast address itself is a payload.

The payloads would set ``window.__pwned`` or call a local catcher if any ran.  Plain HTTP checks every
page and API route (200, the liar named as failed, no raw markup, CSP); headless Chromium loads every
page and proves that nothing ran and nothing was interpreted as markup.
"""

import copy
import json
import urllib.parse

import pytest

from nsqd_threaded.testing import Cluster

from support.admin import call, start_admin
from support.hostile import Catcher, HostileNode, payload
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(180)

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
RAW_MARKUP = ("<img", "<svg", "<script>", "onerror=\"", "onload=\"", "\"'>")


def seg(name):
    return urllib.parse.quote(name, safe="")


def poison(doc, value, strings_only=False):
    """``doc`` with every leaf (every string only, with ``strings_only``) replaced by ``value``."""
    if isinstance(doc, dict):
        return {k: poison(v, value, strings_only) for k, v in doc.items()}
    if isinstance(doc, list):
        return [poison(v, value, strings_only) for v in doc]
    if strings_only and not isinstance(doc, str):
        return doc
    return value


def templates(broker):
    """The real broker's documents with every list non-empty (a client, in-flight and deferred messages)."""
    stats = json.loads(broker.http("GET", "/stats?format=json")[1])
    state = json.loads(broker.http("GET", "/debug/state")[1])
    info = json.loads(broker.http("GET", "/info")[1])
    for t in stats["topics"]:
        for owner in [t] + t["channels"]:
            owner["e2e_processing_latency"] = {"count": 3, "percentiles": [{"quantile": 0.99, "value": 1500}]}
    disk = {"kind": "DiskQueue", "depth": 1, "read_file_num": 0, "read_pos": 0, "write_file_num": 0,
            "write_pos": 30, "ops_since_sync": 1, "need_sync": False}
    state["topics"].append(dict(copy.deepcopy(state["topics"][0]), backend={"kind": "Other", "depth": 2}))
    state["topics"][0]["backend"] = disk
    return stats, state, info


@pytest.fixture(scope="module")
def catcher():
    c = Catcher()
    yield c
    c.close()


@pytest.fixture(scope="module")
def hostile(catcher):
    """The cluster, the three hostile nodes and an nsqadmin over the lookupd."""
    with Cluster(1) as cluster:
        real = cluster[0]
        real.http("POST", "/topic/create?topic=orders")
        real.http("POST", "/channel/create?topic=orders&channel=billing")
        for n in range(3):
            real.http("POST", "/pub?topic=orders", b"order %d" % n)
        nodes = []
        with Conn(real.tcp_address) as consumer:
            consumer.identify(user_agent="templater/1.0", hostname="templater")
            consumer.sub("orders", "billing", rdy=2)
            _, _, first, _ = consumer.read_message()
            consumer.read_message()
            consumer.cmd(b"REQ " + first + b" 60000")
            wait_for(lambda: json.loads(real.http("GET", "/debug/state")[1])["topics"][0]["channels"][0]
                     ["deferred_count"] == 1, what="a deferred message")
            stats, state, info = templates(real)
        try:
            liar = HostileNode()
            nodes.append(liar)
            p = payload(catcher.url, "liar")
            liar.set("/stats", poison(stats, p))
            liar.set("/debug/state", poison(state, p))
            liar.set("/info", poison(info, p))
            liar.register(cluster.lookupd.tcp_address, "orders", "billing", hostname=p, version=p)

            typed = HostileNode()
            nodes.append(typed)
            p = payload(catcher.url, "typed")
            [orders] = stats["topics"]
            named = poison(orders, p, strings_only=True)
            named["topic_name"] = "orders"
            named["channels"][0]["channel_name"] = "billing"
            typed.set("/stats", dict(poison(stats, p, strings_only=True),
                                     topics=[named, poison(orders, p, strings_only=True)]))
            typed_state = poison(state, p, strings_only=True)
            typed_state["topics"][0]["name"] = "orders"
            typed.set("/debug/state", typed_state)
            typed.set("/info", poison(info, p, strings_only=True))
            typed.register(cluster.lookupd.tcp_address, "orders", "billing", hostname=p, version=p)

            unroutable = HostileNode()
            nodes.append(unroutable)
            # no "/" in it: it is one segment of the node's URL path
            address = "x\"'><img src=x onerror=window.__pwned=7><svg onload=window.__pwned=8>"
            unroutable.register(cluster.lookupd.tcp_address, "orders", "billing", broadcast_address=address,
                                hostname=payload(catcher.url, "unroutable"), http_port=9)
            wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 4, what="four producers of orders")

            admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr],
                                http_client_connect_timeout=1.0, http_client_request_timeout=2.0)
            try:
                yield {"cluster": cluster, "admin": admin, "real": real.http_addr, "liar": liar.node,
                       "typed": typed.node, "unroutable": "%s:9" % address}
            finally:
                admin.stop()
        finally:
            for node in nodes:
                node.close()


def pages(h):
    """Every page, with what its failed-nodes warning must name (None: no warning expected)."""
    n = {k: seg(h[k]) for k in ("real", "liar", "typed", "unroutable")}
    return {
        "/": h["liar"], "/topics": h["liar"], "/topics/orders": h["liar"], "/topics/orders/billing": h["liar"],
        "/nodes": None, "/nodes/" + n["real"]: None, "/nodes/" + n["typed"]: None,
        "/nodes/" + n["liar"]: h["liar"], "/nodes/" + n["unroutable"]: "invalid address",
        "/nodes/%s/inside" % n["real"]: None, "/nodes/%s/inside" % n["liar"]: None,
        "/nodes/%s/inside" % n["typed"]: None, "/nodes/%s/inside" % n["unroutable"]: None,
        "/nodes/%s/inside?topic=orders" % n["typed"]: None,
        "/counter": h["liar"], "/lookup": None,
    }


def test_every_page_and_api_route_answers_200_naming_the_liar(hostile, catcher):
    admin = hostile["admin"]
    for path, warned in pages(hostile).items():
        status, text = call(admin.http_url + path)
        assert status == 200, (path, text[:500])
        text = text.replace('<svg class="plot" ', "<chart ")  # (nsqadmin's own charts: the server's SVG)
        for raw in RAW_MARKUP:
            assert raw not in text, (path, raw)
        if warned:
            assert 'id="failed-nodes"' in text and warned in text, path

    # the typed liar's strings are on the pages, as text
    for path in ("/topics/orders/billing", "/nodes/" + seg(hostile["typed"]), "/nodes"):
        assert "window.__pwned=&#x27;typed&#x27;" in call(admin.http_url + path)[1], path

    status, doc = call(admin.http_url + "/api/topics/orders")
    assert status == 200
    assert doc["message"].startswith("WARNING: partial failure: ")
    assert hostile["liar"] + ": malformed answer: stats.topics[0]" in doc["message"]
    assert hostile["unroutable"] + ": invalid address" in doc["message"]
    assert sorted(n["node"] for n in doc["nodes"]) == sorted([hostile["real"], hostile["typed"]])
    assert doc["message_count"] == 2 * 3  # the real broker and the typed liar, which copied its figures

    typed, liar = seg(hostile["typed"]), seg(hostile["liar"])
    for route in ("/api/topics", "/api/topics?inactive=true", "/api/topics/orders/billing", "/api/nodes",
                  "/api/nodes/" + typed, "/api/counter", "/api/nodes/%s/state" % liar,
                  "/api/nodes/%s/state" % typed, "/api/nodes/%s/state?topic=orders" % typed):
        status, doc = call(admin.http_url + route)
        assert status == 200, (route, doc)
    assert call(admin.http_url + "/api/topics/orders/billing")[1]["message"].startswith("WARNING: ")
    assert call(admin.http_url + "/api/nodes/" + liar)[0] == 502  # the one node asked failed: Go's answer
    assert not catcher.seen()


def test_pages_carry_the_csp_and_nosniff(hostile):
    admin = hostile["admin"]
    for path in list(pages(hostile)) + ["/topics/nope", "/nodes/127.0.0.1:1"]:
        with_headers = _headers(admin.http_url + path)
        assert with_headers["content-security-policy"] == CSP, path
        assert with_headers["x-content-type-options"] == "nosniff", path
    for asset in ("admin.js", "admin.css", "favicon.svg"):
        assert _headers(admin.http_url + "/static/" + asset)["x-content-type-options"] == "nosniff"


def _headers(url):
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            return {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as e:
        return {k.lower(): v for k, v in e.headers.items()}


# -- one malformed node among good ones ----------------------------------------------------------

MALFORMED = {
    "a string for a number": {"topics": [{"topic_name": "orders", "depth": "12"}]},
    "a float for a count": {"topics": [{"topic_name": "orders", "message_count": 1.5}]},
    "a bool for a count": {"topics": [{"topic_name": "orders", "channels": [{"channel_name": "billing",
                                                                              "depth": True}]}]},
    "a number for a name": {"topics": [{"topic_name": 7}]},
    "a string for is_dead_letter_topic": {"topics": [{"topic_name": "orders", "is_dead_letter_topic": "yes"}]},
    "a client that is a string": {"topics": [{"topic_name": "orders", "channels": [
        {"channel_name": "billing", "clients": ["<b>client</b>"]}]}]},
    "topics that are not a list": {"topics": "orders"},
    "a list for the document": [],
    "not JSON": b"<html>not json",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_node_leaves_every_route_at_200(case):
    with Cluster(2) as cluster:
        for broker in cluster:
            broker.http("POST", "/topic/create?topic=orders")
            broker.http("POST", "/channel/create?topic=orders&channel=billing")
            broker.http("POST", "/pub?topic=orders", b"hello")
        bad = HostileNode({"/stats": MALFORMED[case], "/info": {"version": "1.3.0"}})
        admin = None
        try:
            bad.register(cluster.lookupd.tcp_address, "orders", "billing")
            wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 3, what="three producers")
            admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
            for route in ("/api/topics/orders", "/api/topics/orders/billing", "/api/counter"):
                status, doc = call(admin.http_url + route)
                assert status == 200, (route, doc)
                assert doc["message"].startswith("WARNING: partial failure: ") and bad.node in doc["message"], route
            t = call(admin.http_url + "/api/topics/orders")[1]
            assert t["message_count"] == 2 and len(t["nodes"]) == 2  # the good brokers' figures, whole
            for path in ("/topics", "/topics/orders", "/topics/orders/billing", "/counter", "/nodes/" + bad.node,
                         "/nodes", "/lookup", "/nodes/%s/inside" % bad.node):
                status, text = call(admin.http_url + path)
                assert status == 200, (path, text[:300])
                if path not in ("/nodes", "/lookup", "/nodes/%s/inside" % bad.node):
                    assert 'id="failed-nodes"' in text and bad.node in text, path
        finally:
            if admin is not None:
                admin.stop()
            bad.close()


def test_a_partial_document_is_read_with_go_zero_values():
    """Fields left out (or null) are Go's zero values, not a failure: an older or smaller nsqd is fine."""
    with Cluster(1) as cluster:
        cluster[0].http("POST", "/topic/create?topic=orders")
        sparse = HostileNode({"/stats": {"topics": [{"topic_name": "orders", "depth": 5, "paused": None,
                                                     "channels": [{"channel_name": "billing", "clients": None}]}]}})
        admin = None
        try:
            sparse.register(cluster.lookupd.tcp_address, "orders", "billing")
            wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 2, what="two producers")
            admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
            status, t = call(admin.http_url + "/api/topics/orders")
            assert status == 200 and t["message"] == "" and t["depth"] == 5
            assert [c["channel_name"] for c in t["channels"]] == ["billing"]
        finally:
            if admin is not None:
                admin.stop()
            sparse.close()


# -- in the browser ---------------------------------------------------------------------------------

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


def script_problems(log):
    """Console entries that mean script ran or was refused: errors thrown, CSP violations."""
    return [e for e in log if e.get("level") == "SEVERE" and "Failed to load resource" not in e.get("message", "")]


@pytest.mark.browser
def test_no_page_runs_what_a_node_sent(browser, hostile, catcher, tmp_path):
    admin = hostile["admin"]
    ready = {  # what shows the page's script has drawn the node's data
        "/topics/orders": "#charts .chart svg", "/topics/orders/billing": "#charts .chart svg",
        "/counter": "#charts .chart svg",
    }
    for i, path in enumerate(pages(hostile)):
        browser.get(admin.http_url + path)
        if "/inside" in path:
            browser.wait(lambda: browser.find_all("#live.ok, #live.bad"), "the inside view on " + path)
        elif path in ready:
            browser.wait(lambda: browser.find_all(ready[path]), "the charts on " + path)
        if browser.find_all("#tables"):
            # wait for one refresh of the tables (the fresh page's nodes moved in), then look again
            browser.run("document.getElementById('tables').firstChild.__old = true;")
            browser.wait(lambda: browser.run("return !document.getElementById('tables').firstChild.__old;"),
                         "the tables refreshed on " + path)
        found = browser.run(INJECTED)
        assert found == {"pwned": None, "injected": []}, path
        assert not script_problems(browser.browser_log()), path
        browser.screenshot(str(tmp_path / ("page-%02d.png" % i)))

    # the liar's inside view: its payloads are text, its "numbers" are shown as invalid
    browser.get(admin.http_url + "/nodes/%s/inside" % seg(hostile["liar"]))
    browser.wait(lambda: browser.find_all("#inside .invalid"), "invalid figures")
    text = browser.text(browser.find("#inside"))
    assert "window.__pwned='liar'" in text and "<script>" in text
    # the typed liar's names and bodies are text too, its figures drawn
    browser.get(admin.http_url + "/nodes/%s/inside?topic=orders" % seg(hostile["typed"]))
    browser.wait(lambda: browser.find_all("#inside section[data-topic=orders] [data-field=in_flight_count]"),
                 "the typed liar's topic")
    assert browser.text(browser.find("#inside [data-field=in_flight_count]")) == "2"
    assert len(browser.find_all("#inside section.topic-box")) == 1  # narrowed to one topic
    assert "window.__pwned='typed'" in browser.text(browser.find("#inside"))
    # the warning names the liar
    browser.get(admin.http_url + "/topics/orders")
    assert hostile["liar"] in browser.text(browser.find("#failed-nodes"))
    assert browser.run(INJECTED) == {"pwned": None, "injected": []}
    assert not catcher.seen()


@pytest.mark.browser
def test_the_csp_stops_a_missed_escape(browser, hostile):
    """Markup slipped into a page anyway (as a missed escape would) cannot run: the policy refuses it."""
    admin = hostile["admin"]
    browser.get(admin.http_url + "/topics")
    browser.run("window.__violations = [];"
                "document.addEventListener('securitypolicyviolation', function (e) {"
                "  window.__violations.push(e.violatedDirective); });"
                "document.getElementById('flash').insertAdjacentHTML('beforeend',"
                "  '<img src=\"/static/favicon.svg\" onerror=\"window.__pwned=1\" onload=\"window.__pwned=2\">"
                "<a href=\"javascript:window.__pwned=3\" id=\"js-link\">x</a>');"
                "var s = document.createElement('script'); s.textContent = 'window.__pwned = 4';"
                "document.body.appendChild(s);")
    browser.wait(lambda: len(browser.run("return window.__violations;")) >= 2, "the policy's refusals")
    browser.click(browser.find("#js-link"))
    browser.wait(lambda: len(browser.run("return window.__violations;")) >= 3, "the javascript: URL refused")
    assert browser.run("return window.__pwned === undefined;")
    assert set(browser.run("return window.__violations;")) <= {"script-src-elem", "script-src-attr", "script-src"}
