"""nsqadmin in headless Chromium against a three-broker cluster with our lookupd: every page loads
without a script error, the charts and the inside view draw, and the pause, empty and delete
buttons act on the brokers.  Screenshots go to the test's tmp_path."""

import os

import pytest

from nsqd_threaded.testing import Cluster

from support.admin import start_admin
from support.wire import Conn, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


@pytest.fixture
def setup():
    with Cluster(3) as cluster:
        for i, broker in enumerate(cluster):
            broker.http("POST", "/topic/create?topic=orders")
            broker.http("POST", "/channel/create?topic=orders&channel=billing")
            broker.http("POST", "/channel/create?topic=orders&channel=audit")
            for n in range(4 + i):
                broker.http("POST", "/pub?topic=orders", b"order %d-%d" % (i, n))
        wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 3, what="registrations")
        admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr])
        try:
            yield cluster, admin
        finally:
            admin.stop()


def severe(log):
    return [entry for entry in log if entry.get("level") == "SEVERE"]


def channel(broker, topic, name):
    for t in broker.stats(topic=topic)["topics"]:
        for c in t["channels"]:
            if c["channel_name"] == name:
                return c
    return None


def test_every_page_loads_and_draws(browser, setup, tmp_path):
    cluster, admin = setup
    node = cluster[0].http_addr
    with Conn(cluster[0].tcp_address) as consumer:
        consumer.identify(user_agent="browser-test")
        consumer.sub("orders", "billing", rdy=1)
        consumer.read_message()
        pages = {
            "topics": ("/topics", "table.topics tbody tr"),
            "topic": ("/topics/orders", "#charts .chart svg"),
            "channel": ("/topics/orders/billing", "table.clients tbody tr"),
            "nodes": ("/nodes", "table.nodes tbody tr"),
            "node": ("/nodes/" + node, "a.inside-link"),
            "counter": ("/counter", "#charts .chart svg"),
            "lookup": ("/lookup", "ul.lookup li"),
            "inside": ("/nodes/%s/inside" % node, "#inside section[data-topic=orders]"),
        }
        for name, (path, selector) in pages.items():
            browser.get(admin.http_url + path)
            browser.wait(lambda: browser.find_all(selector), "%s on %s" % (selector, path))
            browser.screenshot(str(tmp_path / ("%s.png" % name)))
            log = browser.browser_log()
            assert not severe(log), (path, log)

        # the inside view follows the message: in flight now, then finished
        browser.get(admin.http_url + "/nodes/%s/inside" % node)
        inflight = '#inside [data-channel=billing] [data-field=in_flight_count]'
        browser.wait(lambda: browser.find_all(inflight) and browser.text(browser.find(inflight)) == "1",
                     "one message in flight")
        consumer.cmd(b"RDY 0")
    browser.wait(lambda: browser.text(browser.find(inflight)) == "0", "the message back after the consumer left")
    assert os.path.getsize(tmp_path / "inside.png") > 1000


def mark_page(browser):
    """Mark the page's window: the mark is gone once the page is loaded again."""
    browser.run("window.testMark = true;")


def page_reloaded(browser):
    return browser.run("return window.testMark === undefined && document.readyState === 'complete';")


def page_state(browser):
    """Where the browser stands, for a failure: the page, its flash message, the console."""
    try:
        flash = browser.run("var f = document.getElementById('flash'); return f ? f.textContent : null;")
        return "page %s, flash %r, console %r" % (browser.url, flash, browser.browser_log())
    except Exception as e:  # noqa: BLE001 - a description of a failure must not fail itself
        return "page state unknown (%s)" % e


def test_buttons_pause_empty_delete(browser, setup, tmp_path):
    cluster, admin = setup
    browser.get(admin.http_url + "/topics/orders/billing")
    browser.click(browser.find("button.pause"))
    browser.wait(lambda: all(channel(b, "orders", "billing")["paused"] for b in cluster), "billing paused")
    browser.wait(lambda: browser.find_all("h1 .badge"), "the page to show paused")
    browser.screenshot(str(tmp_path / "paused.png"))

    browser.get(admin.http_url + "/topics/orders/audit")
    assert channel(cluster[2], "orders", "audit")["depth"] == 6
    mark_page(browser)
    browser.click(browser.find("button.empty"))
    browser.wait(browser.alert_open, "the confirmation")
    browser.accept_alert()
    browser.wait(lambda: all(channel(b, "orders", "audit")["depth"] == 0 for b in cluster), "audit emptied")
    assert all(channel(b, "orders", "billing")["depth"] > 0 for b in cluster)
    # The action reloads its page once the nodes have answered: a page asked for before that reload
    # would be replaced by it (the channel page again, whose delete button deletes the channel).
    browser.wait(lambda: page_reloaded(browser), lambda: "the channel page reloaded: %s" % page_state(browser))

    browser.get(admin.http_url + "/topics/orders")
    browser.click(browser.find("button.delete"))
    browser.wait(browser.alert_open, "the confirmation")
    browser.accept_alert()
    browser.wait(lambda: all(not b.stats()["topics"] for b in cluster), lambda: "the topic deleted on every "
                 "broker: %r; lookupd: %r; %s" % ([[t["topic_name"] for t in b.stats()["topics"]] for b in cluster],
                                                   cluster.lookupd.lookup("orders"), page_state(browser)))
    browser.wait(lambda: browser.url.endswith("/topics"), "the topics page")
    log = browser.browser_log()
    assert not severe(log), log


def test_create_form(browser, setup):
    cluster, admin = setup
    browser.get(admin.http_url + "/lookup")
    browser.run("document.querySelector('#create-form [name=topic]').value = 'made';"
                "document.querySelector('#create-form [name=channel]').value = 'here';")
    browser.click(browser.find("#create-form button"))
    browser.wait(lambda: browser.url.endswith("/topics/made"), "the new topic's page")
    assert "made" in cluster.lookupd.get("/topics")["topics"]
    assert cluster.lookupd.get("/channels?topic=made")["channels"] == ["here"]
