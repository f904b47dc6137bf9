"""nsqadmin's own charts: the sampler thread polls real brokers, keeps a bounded ring per topic and channel,
answers ``GET /api/charts/<topic>[/<channel>]``, and the pages draw it (in headless Chromium) as SVG built
element by element under the Content-Security-Policy."""

import re
import threading
from importlib import resources

import pytest

from nsqd_threaded.admin import sampler
from nsqd_threaded.testing import Broker, Cluster

from support.admin import call, start_admin
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(180)


def charts(admin, *path):
    status, doc = call(admin.http_url + "/api/charts/" + "/".join(path))
    assert status == 200, doc
    return doc


def sampler_threads():
    return [t for t in threading.enumerate() if t.name == "nsqadmin-sampler"]


def test_the_sampler_follows_a_channel_and_stops_with_nsqadmin():
    with Broker() as broker:
        broker.http("POST", "/topic/create?topic=orders")
        broker.http("POST", "/channel/create?topic=orders&channel=billing")
        before = len(sampler_threads())
        admin = start_admin(nsqd_http_addresses=[broker.http_addr], chart_sample_interval=0.05)
        try:
            assert len(sampler_threads()) == before + 1
            for n in range(7):
                broker.http("POST", "/pub?topic=orders", b"order %d" % n)
            with Conn(broker.tcp_address) as consumer:
                consumer.identify()
                consumer.sub("orders", "billing", rdy=2)
                consumer.read_message()
                consumer.read_message()
                # a sample taken after both deliveries: depth 5, two in flight, on the channel and the topic
                def sampled_both():
                    doc = charts(admin, "orders", "billing")
                    return doc if doc["in_flight"][-1:] == [2] and doc["depth"][-1:] == [5] else None

                doc = wait_for(sampled_both, timeout=30, what="a sample with two messages in flight")
                assert doc["topic"] == "orders" and doc["channel"] == "billing"
                assert doc["interval_ms"] == 50 and doc["samples"] == sampler.SAMPLES
                assert len(doc["time"]) == len(doc["message_rate"]) == len(doc["depth"]) == len(doc["in_flight"])
                assert doc["time"] == sorted(doc["time"])
                if len(doc["time"]) < sampler.SAMPLES:  # the ring has not moved on yet: its first sample is there
                    assert doc["message_rate"][0] is None  # the first sample has nothing to compare with
                topic = charts(admin, "orders")
                assert "channel" not in topic and topic["in_flight"][-1] == 2 and topic["depth"][-1] == 0
            # the seven may all have gone in before the first sample (a slow start): one more, published
            # after a sample exists, puts a rise between two samples whatever the timing
            broker.http("POST", "/pub?topic=orders", b"order 7")
            assert wait_for(lambda: any(r for r in charts(admin, "orders", "billing")["message_rate"] if r),
                            timeout=30, what="a rate above zero")
        finally:
            admin.stop()
        assert len(sampler_threads()) == before  # joined


def recent(doc):
    """The times of the recent samples (the hour's coarser points come before them)."""
    return [t for t in doc["time"] if t >= doc["recent_from"]]


def test_an_hour_of_history_in_bounded_memory():
    """The sampler keeps an hour at a coarser step before its recent samples: each of its points the mean
    rate since the one before, the depth as sampled.  Its wall clock is moved 10 s per sample by the test
    (a real broker answers each sample)."""
    with Broker() as broker:
        broker.http("POST", "/topic/create?topic=orders")
        admin = start_admin(nsqd_http_addresses=[broker.http_addr], chart_sample_interval=0)
        now = [1_700_000_000.0]
        rings = sampler.Sampler(admin.cluster, 10.0, admin.log, wall_clock=lambda: now[0])
        try:
            for i in range(500):  # 83 minutes of samples, 10 s apart
                if i % 50 == 0:
                    broker.http("POST", "/pub?topic=orders", b"x")
                rings.sample()
                now[0] += 10.0
            doc = rings.series("orders")
            times = doc["time"]
            assert len(recent(doc)) == sampler.SAMPLES  # 25 minutes at 10 s
            assert sampler.SAMPLES < len(times) <= sampler.HOUR_POINTS + sampler.SAMPLES  # the hour, then the recent
            assert times == sorted(times)
            span = times[-1] - times[0]
            assert 60 * 60 * 1000 <= span <= 61 * 60 * 1000  # an hour back
            hour = [t for t in times if t < doc["recent_from"]]
            assert {b - a for a, b in zip(hour, hour[1:])} == {30000}
            assert doc["depth"][-1] == 10
            rates = [r for r, t in zip(doc["message_rate"], times) if t < doc["recent_from"]]
            assert all(r is not None and 0 <= r < 0.1 for r in rates[1:])  # a mean: one message per 500 s
        finally:
            admin.stop()


def test_the_rings_are_bounded():
    with Broker() as broker:
        broker.http("POST", "/topic/create?topic=orders")
        admin = start_admin(nsqd_http_addresses=[broker.http_addr], chart_sample_interval=0.01)
        try:
            full = wait_for(lambda: len(recent(charts(admin, "orders"))) == sampler.SAMPLES, timeout=120,
                            interval=0.2, what="a full ring")
            assert full
            first = recent(charts(admin, "orders"))[0]
            # the ring moves on, and stays as long; the hour's history before it is bounded too
            wait_for(lambda: recent(charts(admin, "orders"))[0] > first, timeout=30, what="the ring to move")
            doc = charts(admin, "orders")
            assert len(recent(doc)) == sampler.SAMPLES
            assert len(doc["time"]) <= sampler.SAMPLES + sampler.HOUR_POINTS
        finally:
            admin.stop()


def test_rates_and_depths_are_summed_over_nodes():
    with Cluster(2) as cluster:
        for broker in cluster:
            broker.http("POST", "/topic/create?topic=orders")
            broker.http("POST", "/channel/create?topic=orders&channel=billing")
        wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 2, what="registrations")
        admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], chart_sample_interval=0.05)
        try:
            for i, broker in enumerate(cluster):
                for n in range(3 + i):
                    broker.http("POST", "/pub?topic=orders", b"x")
            wait_for(lambda: charts(admin, "orders", "billing")["depth"][-1:] == [7], timeout=30,
                     what="depth 3 + 4 over the two nodes")
            assert charts(admin, "orders")["depth"][-1] == 0
        finally:
            admin.stop()


def test_no_sampling_no_charts():
    with Broker() as broker:
        broker.http("POST", "/topic/create?topic=orders")
        before = len(sampler_threads())
        admin = start_admin(nsqd_http_addresses=[broker.http_addr], chart_sample_interval=0)
        try:
            assert len(sampler_threads()) == before
            doc = charts(admin, "orders")
            assert doc["interval_ms"] == 0 and doc["time"] == [] and doc["depth"] == []
            status, page = call(admin.http_url + "/topics/orders")
            assert status == 200 and "data-charts" not in page
        finally:
            admin.stop()


def test_the_pages_draw_the_charts_themselves():
    """A page fetched once, without script, holds its charts: SVG with both axes' labels, the line, the
    value now; made of elements only (no style, no script), under the page's Content-Security-Policy."""
    with Broker() as broker:
        broker.http("POST", "/topic/create?topic=orders")
        broker.http("POST", "/channel/create?topic=orders&channel=billing")
        for _ in range(4):
            broker.http("POST", "/pub?topic=orders", b"x")
        admin = start_admin(nsqd_http_addresses=[broker.http_addr], chart_sample_interval=0.2)

        def charts_section():
            page = call(admin.http_url + "/topics/orders/billing")[1]
            return page[page.index('<div class="charts" id="charts">'):page.index('<div id="tables">')]

        def every_chart_has_a_line():
            # A sample that came late (a loaded machine) is a gap, and a line needs two samples in a
            # row on either side of one (the rate's first sample has no value): the page is fetched
            # again until each chart holds a stretch of them.
            svgs = charts_section().split("<svg ")[1:]
            return len(svgs) == 3 and all("<polyline " in svg for svg in svgs)

        try:
            wait_for(every_chart_has_a_line, timeout=60, interval=0.2, what="a line in every chart")
            section = charts_section()
            for key in ("message_rate", "depth", "in_flight"):
                assert '<div class="chart" data-series="%s"' % key in section
            assert section.count("<svg ") == 3
            assert '<span class="value">4</span>' in section  # the depth now
            assert '<text class="x-label"' in section and ">now</text>" in section and ">-5m</text>" in section
            assert '<text class="y-label"' in section and ">0</text>" in section and "/s</text>" in section
            assert "<title>depth, last 5m: now 4, at most 4</title>" in section
            assert "style" not in section and "script" not in section.lower()
            assert "<svg " in call(admin.http_url + "/topics/orders")[1]
        finally:
            admin.stop()


def test_chart_figures():
    from nsqd_threaded.admin import charts as drawn

    assert [drawn.nice_ceiling(v) for v in (0, 0.3, 1, 3, 7, 12, 26, 99, 101, 2400)] == [
        1, 1, 1, 5, 10, 20, 50, 100, 200, 2500]
    assert drawn.value_text(None, True) == "-" and drawn.value_text(2.25, True) == "2.2/s"
    assert drawn.value_text(12345, False) == "12,345" and drawn.value_text(1500.4, True) == "1,500/s"
    # A node that sent garbage: a gap in the line, never text in the page.
    box = drawn.chart("depth", "depth", False, [1000, 2000, "x", 3000, 4000], [1, "<b>", 2, True, 3],
                      None, 1000, 30000, 4000).render()
    assert "<b>" not in box and box.count("<polyline") == 0 and box.count("<circle") == 2


def test_the_pages_name_their_charts_route():
    with Broker() as broker:
        broker.http("POST", "/topic/create?topic=orders")
        broker.http("POST", "/channel/create?topic=orders&channel=billing%23ephemeral")
        admin = start_admin(nsqd_http_addresses=[broker.http_addr], base_path="/admin")
        try:
            assert 'data-charts="/admin/api/charts/orders"' in call(admin.http_url + "/admin/topics/orders")[1]
            page = call(admin.http_url + "/admin/topics/orders/billing%23ephemeral")[1]
            assert 'data-charts="/admin/api/charts/orders/billing%23ephemeral"' in page
            status, doc = call(admin.http_url + "/admin/api/charts/orders/billing%23ephemeral")
            assert status == 200 and doc["channel"] == "billing#ephemeral"
        finally:
            admin.stop()


def test_the_script_builds_no_html_from_text():
    """The charts (and everything else) are built with createElement/createElementNS: no HTML parsing."""
    script = resources.files("nsqd_threaded.admin").joinpath("assets/admin.js").read_text()
    for forbidden in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                      ".style.cssText", "setAttribute(\"style\"", "setAttribute(\"on"):
        assert forbidden not in script, forbidden
    assert re.search(r"createElementNS\(SVG", script)


# -- in the browser ----------------------------------------------------------------------------------


@pytest.mark.browser
def test_the_pages_draw_the_samples(browser, tmp_path):
    with Cluster(2) as cluster:
        for broker in cluster:
            broker.http("POST", "/topic/create?topic=orders")
            broker.http("POST", "/channel/create?topic=orders&channel=billing")
            for n in range(5):
                broker.http("POST", "/pub?topic=orders", b"x")
        wait_for(lambda: len(cluster.lookupd.lookup("orders")) == 2, what="registrations")
        admin = start_admin(lookupd_http_addresses=[cluster.lookupd.http_addr], chart_sample_interval=0.2)
        try:
            with Conn(cluster[0].tcp_address) as consumer:
                consumer.identify()
                consumer.sub("orders", "billing", rdy=3)
                for _ in range(3):
                    consumer.read_message()
                for path, depth in (("/topics/orders/billing", "7"), ("/topics/orders", "0")):
                    browser.get(admin.http_url + path)
                    # drawn by the server: there as the page loads, with its axes, laid out at a real size
                    drawn = browser.run(
                        "return Array.prototype.map.call(document.querySelectorAll('#charts svg.plot'), function (s) {"
                        " var r = s.getBoundingClientRect(); return [r.width, r.height,"
                        " s.querySelectorAll('text.x-label').length, s.querySelectorAll('text.y-label').length]; });")
                    assert len(drawn) == 3 and all(w > 100 and h > 30 and xs >= 2 and ys == 3 for w, h, xs, ys in drawn)
                    for series in ("message_rate", "depth", "in_flight"):
                        browser.wait(lambda: browser.find_all("#charts .chart[data-series=%s] svg polyline" % series),
                                     "the %s chart on %s" % (series, path))
                    value = "#charts .chart[data-series=%s] .value"
                    browser.wait(lambda: browser.text(browser.find(value % "in_flight")) == "3", "3 in flight")
                    browser.wait(lambda: browser.text(browser.find(value % "depth")) == depth, "the depth")
                    samples = int(browser.run(
                        "return document.querySelector('#charts .chart[data-series=depth]')"
                        ".getAttribute('data-samples');"))
                    assert samples >= 2
                    browser.screenshot(str(tmp_path / ("%s.png" % path.strip("/").replace("/", "-"))))
                    assert not [e for e in browser.browser_log() if e.get("level") == "SEVERE"], path
        finally:
            admin.stop()


@pytest.mark.browser
def test_a_browser_without_script_shows_the_charts(browser, tmp_path):
    """Script off in Chromium: the page as fetched once still has its three charts, laid out, with axes."""
    with Broker() as broker:
        broker.http("POST", "/topic/create?topic=orders")
        broker.http("POST", "/channel/create?topic=orders&channel=billing")
        for _ in range(6):
            broker.http("POST", "/pub?topic=orders", b"x")
        admin = start_admin(nsqd_http_addresses=[broker.http_addr], chart_sample_interval=0.05)
        try:
            wait_for(lambda: len(charts(admin, "orders", "billing")["time"]) >= 3, timeout=30, what="samples")
            browser.get(admin.http_url + "/")  # (a page of nsqadmin's first: DevTools acts on it)
            browser.disable_script()
            browser.get(admin.http_url + "/topics/orders/billing")
            sizes = browser.run(
                "return Array.prototype.map.call(document.querySelectorAll('#charts svg.plot'), function (s) {"
                " var r = s.getBoundingClientRect(); return [r.width, r.height,"
                " s.querySelectorAll('polyline').length, s.querySelectorAll('text').length]; });")
            assert len(sizes) == 3 and all(w > 100 and h > 30 and lines >= 1 and labels >= 5
                                           for w, h, lines, labels in sizes), sizes
            value = "#charts .chart[data-series=depth] .value"
            assert browser.text(browser.find(value)) == "6"
            browser.screenshot(str(tmp_path / "no-script.png"))
        finally:
            admin.stop()
