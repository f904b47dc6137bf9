"""A page on another origin cannot change the cluster through the operator's browser; curl still can.

The browser test serves an attacker's page from a second local HTTP server (another port is
another origin) whose HTML forms submit themselves to nsqadmin's actions and to nsqd's and
nsqlookupd's state-changing routes, as an operator's Chromium would send them; the daemons'
own state shows that nothing changed, and the same requests without ``Origin`` then work.
The other tests send the exact requests such forms make, with a plain HTTP client.
"""

import html
import http.server
import json

import pytest

from nsqd_threaded.testing import Cluster

from support.admin import call, start_admin
from support.http_server import ThreadedHTTPServer
from support.wire import wait_for

pytestmark = pytest.mark.timeout(180)

JSON = {"Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
TEXT = {"Content-Type": "text/plain"}


@pytest.fixture
def setup():
    with Cluster(2) as cluster:
        for broker in cluster:
            assert broker.http("POST", "/topic/create?topic=orders")[0] == 200
            assert broker.http("POST", "/channel/create?topic=orders&channel=billing")[0] == 200
            assert broker.http("POST", "/pub?topic=orders", b"an order")[0] == 200
        wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 2, what="registrations")
        admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
        try:
            yield cluster, admin
        finally:
            admin.stop()


def channel(broker, topic, name):
    for t in broker.stats(topic=topic)["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == name:
                return c
    return None


def assert_untouched(cluster):
    for broker in cluster:
        [topic] = broker.stats()["topics"]
        assert topic["topic_name"] == "orders" and not topic["paused"]
        billing = channel(broker, "orders", "billing")
        assert billing["depth"] == 1 and not billing["paused"]
    assert cluster.lookupd.get("/topics")["topics"] == ["orders"]


# -- the requests a cross-site form makes, sent by hand ----------------------------------------------


def test_admin_actions_refuse_what_a_form_on_another_site_sends(setup):
    cluster, admin = setup
    url = admin.http_url + "/api/topics/orders"
    evil = {"Origin": "http://127.0.0.1:1"}
    # enctype=text/plain whose body is valid JSON, a urlencoded form, from another origin: 403
    assert call(url, "POST", b'{"action":"pause","x":"="}', {**TEXT, **evil}) == (
        403, {"message": "CROSS_ORIGIN_FORBIDDEN"})
    assert call(url + "/billing", "POST", b"action=empty", {**FORM, **evil})[0] == 403
    assert call(url + "/billing", "POST", b'{"action":"redrive","to":"planted"}', {**JSON, **evil})[0] == 403
    assert call(admin.http_url + "/api/topics", "POST", b'{"topic":"planted"}', {**JSON, **evil})[0] == 403
    assert call(url, "DELETE", None, evil)[0] == 403
    # a browser that sends no Origin but a Referer from elsewhere
    assert call(url, "POST", {"action": "pause"}, {"Referer": "http://evil.example/page.html"})[0] == 403
    # no Origin at all, but a body a form could send: not JSON, refused
    assert call(url, "POST", b'{"action":"pause"}', TEXT) == (415, {"message": "CONTENT_TYPE_NOT_JSON"})
    assert call(url, "POST", b'{"action":"pause"}', FORM)[0] == 415
    assert_untouched(cluster)

    # the page's own script (same origin, JSON) and curl (no Origin, JSON) act as before
    own = {"Origin": admin.http_url, "Referer": admin.http_url + "/topics/orders"}
    assert call(url, "POST", {"action": "pause"}, own)[0] == 200
    assert all(b.stats(topic="orders")["topics"][0]["paused"] for b in cluster)
    assert call(url, "POST", {"action": "unpause"}, {"Content-Type": "application/json; charset=utf-8"})[0] == 200
    assert call(url + "/billing", "POST", {"action": "empty"})[0] == 200
    assert all(channel(b, "orders", "billing")["depth"] == 0 for b in cluster)
    assert call(url, "DELETE")[0] == 200
    assert all(not b.stats()["topics"] for b in cluster)


def test_reads_stay_open_to_any_origin(setup):
    cluster, admin = setup
    status, doc = call(admin.http_url + "/api/topics", headers={"Origin": "http://evil.example"})
    assert (status, doc["topics"]) == (200, ["orders"])


# -- in a real browser ---------------------------------------------------------------------------------


ATTACK = """<!doctype html>
<html><head><title>cute cats</title></head><body>
%(forms)s
<script>
window.addEventListener("load", function () {
  var frames = document.querySelectorAll("iframe"), loaded = 0;
  frames.forEach(function (f) {
    f.addEventListener("load", function () {
      loaded += 1;
      if (loaded === frames.length) document.title = "submitted";
    });
  });
  document.querySelectorAll("form").forEach(function (form) { form.submit(); });
});
</script>
</body></html>
"""


def attack_forms(admin_url, nsqd_url, lookupd_url):
    """Self-submitting forms, each into its own frame: (action URL, enctype, fields)."""
    forms = [
        # text/plain sends name=value: the JSON sits in the name, the "=" in a dummy string
        (admin_url + "/api/topics/orders", "text/plain", [('{"action":"pause","x":"', '"}')]),
        (admin_url + "/api/topics/orders/billing", "text/plain", [('{"action":"empty","x":"', '"}')]),
        (admin_url + "/api/topics", "text/plain", [('{"topic":"planted","x":"', '"}')]),
        (admin_url + "/api/topics/orders/billing", "text/plain", [('{"action":"redrive","to":"planted","x":"', '"}')]),
        (admin_url + "/api/topics/orders", "application/x-www-form-urlencoded", [("action", "pause")]),
        (nsqd_url + "/topic/delete?topic=orders", "application/x-www-form-urlencoded", [("x", "1")]),
        (nsqd_url + "/channel/empty?topic=orders&channel=billing", "application/x-www-form-urlencoded",
         [("x", "1")]),
        (nsqd_url + "/channel/empty?topic=orders&channel=billing", "text/plain", [("x", "1")]),
        (nsqd_url + "/channel/redrive?topic=orders&channel=billing&to=planted", "application/x-www-form-urlencoded",
         [("x", "1")]),
        (lookupd_url + "/topic/delete?topic=orders", "application/x-www-form-urlencoded", [("x", "1")]),
    ]
    out = []
    for i, (action, enctype, fields) in enumerate(forms):
        inputs = "".join('<input type="hidden" name="%s" value="%s">' % (html.escape(n), html.escape(v))
                         for n, v in fields)
        out.append('<iframe name="f%d"></iframe><form method="post" target="f%d" action="%s" enctype="%s">%s</form>'
                   % (i, i, html.escape(action), enctype, inputs))
    return "\n".join(out)


class AttackerSite:
    """Another origin: a local HTTP server that serves one page."""

    def __init__(self, page):
        body = page.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadedHTTPServer(("127.0.0.1", 0), Handler, "test-attacker-site").start()
        self.url = "http://127.0.0.1:%d/cats.html" % self.server.server_address[1]

    def close(self):
        self.server.close()


@pytest.mark.browser
def test_a_page_on_another_origin_changes_nothing(browser, setup, tmp_path):
    cluster, admin = setup
    broker = cluster[0]
    site = AttackerSite(ATTACK % {"forms": attack_forms(admin.http_url, broker.http_url, cluster.lookupd.http_url)})
    try:
        browser.get(site.url)
        browser.wait(lambda: browser.run("return document.title") == "submitted", "every form's answer")
        browser.screenshot(str(tmp_path / "attack.png"))
    finally:
        site.close()
    assert_untouched(cluster)

    # the same requests without Origin (curl, a client library) act as they always did
    assert call(admin.http_url + "/api/topics/orders", "POST", json.dumps({"action": "pause"}).encode(),
                JSON)[0] == 200
    assert all(b.stats(topic="orders")["topics"][0]["paused"] for b in cluster)
    assert broker.http("POST", "/channel/empty?topic=orders&channel=billing", b"x=1")[0] == 200
    assert channel(broker, "orders", "billing")["depth"] == 0
    assert broker.http("POST", "/topic/delete?topic=orders", b"x=1")[0] == 200
    assert not broker.stats()["topics"]
    status, _ = call(cluster.lookupd.http_url + "/topic/delete?topic=orders", "POST", b"x=1", FORM)
    assert status == 200
