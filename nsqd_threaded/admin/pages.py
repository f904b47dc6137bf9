"""nsqadmin's pages: server-rendered HTML from the same documents the JSON API answers.

Each page is complete without JavaScript (tables of the figures when it was
rendered); the script (:mod:`.static`) adds what needs it: the action
buttons, the charts of the last minutes (polling the page's API route), the
live counter, and the inside view of one broker.  Nodes that did not answer
are listed at the top of the page, never a reason for it to fail.
"""

import html
import urllib.parse

from . import cluster
from .api import AdminError

NAV = (("topics", "Topics"), ("nodes", "Nodes"), ("counter", "Counter"), ("lookup", "Lookup"))


def esc(value):
    return html.escape(str(value), quote=True)


def seg(value):
    """A name as one URL path segment (``#ephemeral`` included)."""
    return urllib.parse.quote(str(value), safe="")


def num(n):
    return "{:,}".format(n) if isinstance(n, int) else esc(n)


def _percentiles(e2e):
    ps = (e2e or {}).get("percentiles") or ()
    if not ps:
        return ""
    return " ".join("p%g: %s" % (p["quantile"] * 100, _duration_ns(p["average"])) for p in ps)


def _duration_ns(ns):
    ns = float(ns)
    for unit, size in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= size:
            return "%.1f%s" % (ns / size, unit)
    return "%dns" % ns


def _yes(flag):
    return "yes" if flag else ""


class Pages:
    """The HTML of one NSQAdmin's pages."""

    def __init__(self, admin):
        self.admin = admin
        self.api = None  # set lazily: the router's AdminAPI (pages render its documents)
        self.base = admin.options.base_path.rstrip("/")

    def _api(self):
        if self.api is None:
            from .api import AdminAPI

            self.api = AdminAPI(self.admin)
        return self.api

    def url(self, *parts):
        return self.base + "/" + "/".join(seg(p) for p in parts)

    # -- layout

    def layout(self, title, section, body, answer=None, data=None):
        nav = "".join(
            '<a class="%s" href="%s">%s</a>' % ("active" if key == section else "", self.url(key), label)
            for key, label in NAV
        )
        opts = self.admin.options
        sources = opts.lookupd_http_addresses or opts.nsqd_http_addresses
        source_kind = "nsqlookupd" if opts.lookupd_http_addresses else "nsqd"
        warning = ""
        if answer is not None and answer.failed:
            items = "".join("<li>%s</li>" % esc(e) for e in answer.errors)
            warning = ('<div class="warning" id="failed-nodes"><strong>Not answering (%d):</strong> %s'
                       '<ul>%s</ul></div>' % (len(answer.failed), esc(", ".join(answer.failed)), items))
        warning = '<div id="warnings">%s</div>' % warning
        attrs = "".join(' data-%s="%s"' % (k, esc(v)) for k, v in (data or {}).items())
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<title>%(title)s - nsqadmin</title>"
            "<link rel=\"icon\" href=\"%(base)s/static/favicon.svg\">"
            "<link rel=\"stylesheet\" href=\"%(base)s/static/admin.css\"></head>"
            "<body data-base=\"%(base)s\"%(attrs)s><header><a class=\"brand\" href=\"%(base)s/\">nsqadmin</a>"
            "<nav>%(nav)s</nav><span class=\"sources\">%(kind)s: %(sources)s</span></header>"
            "<main><div id=\"flash\" role=\"status\"></div>%(warning)s%(body)s</main>"
            "<footer>nsqadmin-threaded v%(version)s</footer>"
            "<script src=\"%(base)s/static/admin.js\"></script></body></html>\n"
        ) % {
            "title": esc(title), "base": esc(self.base), "attrs": attrs, "nav": nav, "kind": source_kind,
            "sources": esc(", ".join(sources)), "warning": warning, "body": body,
            "version": esc(self.admin.version),
        }

    def error_page(self, status, message):
        body = '<h1>Error %d</h1><p class="error">%s</p>' % (status, esc(message))
        return self.layout("Error", "", body)

    def button(self, label, method, url, body=None, confirm=None, next_url=None, cls=""):
        attrs = {"data-method": method, "data-url": url}
        if body is not None:
            import json

            attrs["data-body"] = json.dumps(body)
        if confirm:
            attrs["data-confirm"] = confirm
        if next_url:
            attrs["data-next"] = next_url
        return '<button type="button" class="action %s"%s>%s</button>' % (
            cls, "".join(' %s="%s"' % (k, esc(v)) for k, v in attrs.items()), esc(label))

    @staticmethod
    def table(headers, rows, cls="stats"):
        head = "".join("<th>%s</th>" % h for h in headers)
        body = "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % c for c in row) for row in rows)
        if not rows:
            body = '<tr><td colspan="%d" class="none">none</td></tr>' % len(headers)
        return '<table class="%s"><thead><tr>%s</tr></thead><tbody>%s</tbody></table>' % (cls, head, body)

    # -- topics

    def topics(self):
        api = self._api()
        answer = api.topics()
        producers, g1 = api.ci.producers()
        per_node, g2 = api.ci.nsqd_stats(producers)
        answer.failed = sorted(set(answer.failed) | set(g1.errors) | set(g2.errors))
        answer.errors = sorted(set(answer.errors) | {str(e) for g in (g1, g2) for e in g.errors.values()})
        by_topic = {}
        for t in per_node:
            by_topic.setdefault(t["topic_name"], []).append(t)
        rows = []
        for name in answer.doc["topics"]:
            total = cluster.topic_stats(name, by_topic.get(name, []))
            rows.append((
                '<a href="%s">%s</a>' % (self.url("topics", name), esc(name)),
                num(total["depth"]), num(sum(c["in_flight_count"] for c in total["channels"])),
                num(total["message_count"]), num(len(total["channels"])), num(len(total["nodes"])),
                "paused" if total["paused"] else "",
            ))
        body = ('<h1>Topics</h1><div id="tables">' + self.table(
            ("Topic", "Depth", "In-Flight", "Messages", "Channels", "Nodes", ""), rows, "stats topics") + "</div>")
        return self.layout("Topics", "topics", body, answer)

    def _topic_row(self, t, label):
        return (label, num(t["depth"]), num(t["memory_depth"]) + " + " + num(t["backend_depth"]),
                num(t["message_count"]), num(sum(c["client_count"] for c in t["channels"])),
                esc(_percentiles(t["e2e_processing_latency"])), "paused" if t["paused"] else "")

    def topic(self, topic):
        answer = self._api().topic(topic)
        t = answer.doc
        api_url = self.url("api", "topics", topic)
        actions = " ".join((
            self.button("Unpause" if t["paused"] else "Pause", "POST", api_url,
                        {"action": "unpause" if t["paused"] else "pause"}, cls="pause"),
            self.button("Empty Queue", "POST", api_url, {"action": "empty"},
                        confirm="Empty the topic queue of %s on every node?" % topic, cls="empty"),
            self.button("Delete Topic", "DELETE", api_url, confirm="Delete topic %s?" % topic,
                        next_url=self.url("topics"), cls="delete"),
        ))
        node_rows = [self._topic_row(n, '<a href="%s">%s</a> %s' % (
            self.url("nodes", n["node"]), esc(n["node"]),
            self.button("Tombstone", "DELETE", self.url("api", "nodes", n["node"]), {"topic": topic},
                        confirm="Tombstone topic %s on %s?" % (topic, n["node"]), cls="small tombstone")
            if self.admin.options.lookupd_http_addresses else "")) for n in t["nodes"]]
        node_rows.append(self._topic_row(t, "<strong>Total</strong>"))
        channel_rows = []
        for c in t["channels"]:
            channel_rows.append((
                '<a href="%s">%s</a>' % (self.url("topics", topic, c["channel_name"]), esc(c["channel_name"])),
                num(c["depth"]), num(c["memory_depth"]) + " + " + num(c["backend_depth"]),
                num(c["in_flight_count"]), num(c["deferred_count"]), num(c["requeue_count"]),
                num(c["timeout_count"]), num(c["message_count"]), num(c["client_count"]),
                esc(_percentiles(c["e2e_processing_latency"])), "paused" if c["paused"] else "",
            ))
        body = (
            '<h1>Topic <span class="name">%s</span>%s</h1><div class="actions">%s</div>'
            '<div class="charts" id="charts"></div>'
            '<div id="tables"><h2>Nodes</h2>%s<h2>Channels</h2>%s</div>'
        ) % (esc(topic), ' <span class="badge">paused</span>' if t["paused"] else "", actions,
             self.table(("Node", "Depth", "Memory + Disk", "Messages", "Clients", "E2E latency", ""), node_rows),
             self.table(("Channel", "Depth", "Memory + Disk", "In-Flight", "Deferred", "Requeued", "Timed Out",
                         "Messages", "Clients", "E2E latency", ""), channel_rows, "stats channels"))
        return self.layout("Topic %s" % topic, "topics", body, answer,
                           {"kind": "topic", "api": api_url, "topic": topic})

    def channel(self, topic, channel):
        answer = self._api().channel(topic, channel)
        c = answer.doc
        if "channel_name" not in c:
            raise AdminError(404, "CHANNEL_NOT_FOUND")
        api_url = self.url("api", "topics", topic, channel)
        actions = " ".join((
            self.button("Unpause" if c["paused"] else "Pause", "POST", api_url,
                        {"action": "unpause" if c["paused"] else "pause"}, cls="pause"),
            self.button("Empty Queue", "POST", api_url, {"action": "empty"},
                        confirm="Empty channel %s of topic %s on every node?" % (channel, topic), cls="empty"),
            self.button("Delete Channel", "DELETE", api_url, confirm="Delete channel %s?" % channel,
                        next_url=self.url("topics", topic), cls="delete"),
        ))

        def row(n, label):
            return (label, num(n["depth"]), num(n["memory_depth"]) + " + " + num(n["backend_depth"]),
                    num(n["in_flight_count"]), num(n["deferred_count"]), num(n["requeue_count"]),
                    num(n["timeout_count"]), num(n["message_count"]), num(n["client_count"]),
                    esc(_percentiles(n["e2e_processing_latency"])), "paused" if n["paused"] else "")

        node_rows = [row(n, '<a href="%s">%s</a>' % (self.url("nodes", n["node"]), esc(n["node"])))
                     for n in c["nodes"]]
        node_rows.append(row(c, "<strong>Total</strong>"))
        import time

        now = int(time.time())
        client_rows = [(
            esc(cl["hostname"] or cl["client_id"]), esc(cl["remote_address"]), esc(cl["user_agent"] or cl["version"]),
            esc(cl["node"]),
            " ".join(f for f, on in (("TLS", cl["tls"]), ("deflate", cl["deflate"]), ("snappy", cl["snappy"]),
                                     ("authed", cl["authed"])) if on),
            num(cl["ready_count"]), num(cl["in_flight_count"]), num(cl["message_count"]), num(cl["finish_count"]),
            num(cl["requeue_count"]), esc(_since(now - cl["connect_ts"])),
        ) for cl in c["clients"]]
        body = (
            '<h1>Topic <a href="%s">%s</a> / Channel <span class="name">%s</span>%s</h1><div class="actions">%s</div>'
            '<div class="charts" id="charts"></div><div id="tables"><h2>Nodes</h2>%s<h2>Clients</h2>%s</div>'
        ) % (self.url("topics", topic), esc(topic), esc(channel),
             ' <span class="badge">paused</span>' if c["paused"] else "", actions,
             self.table(("Node", "Depth", "Memory + Disk", "In-Flight", "Deferred", "Requeued", "Timed Out",
                         "Messages", "Clients", "E2E latency", ""), node_rows),
             self.table(("Client", "Address", "User-Agent", "Node", "Features", "RDY", "In-Flight", "Messages",
                         "Finished", "Requeued", "Connected"), client_rows, "stats clients"))
        return self.layout("Channel %s/%s" % (topic, channel), "topics", body, answer,
                           {"kind": "channel", "api": api_url, "topic": topic, "channel": channel})

    # -- nodes

    def nodes(self):
        answer = self._api().nodes()
        rows = []
        for p in answer.doc["nodes"]:
            node = cluster.http_address(p)
            topics = " ".join(
                '<a class="%s" href="%s">%s</a>' % ("tombstoned" if t["tombstoned"] else "",
                                                    self.url("topics", t["topic"]), esc(t["topic"]))
                for t in p["topics"])
            rows.append((
                '<a href="%s">%s</a>' % (self.url("nodes", node), esc(p["hostname"] or node)),
                esc(p["broadcast_address"]), esc(p["tcp_port"]), esc(p["http_port"]),
                esc(p["version"]) + (' <span class="badge">out of date</span>' if p["out_of_date"] else ""),
                esc(", ".join(p["remote_addresses"])), topics,
                '<a href="%s">inside</a>' % self.url("nodes", node, "inside"),
            ))
        body = '<h1>Nodes</h1><div id="tables">' + self.table(
            ("Hostname", "Broadcast Address", "TCP Port", "HTTP Port", "Version", "Lookupd Conns.", "Topics", ""),
            rows, "stats nodes") + "</div>"
        return self.layout("Nodes", "nodes", body, answer)

    def node(self, node):
        answer = self._api().node(node)
        doc = answer.doc
        rows = []
        for t in doc["topics"]:
            rows.append(('<a href="%s"><strong>%s</strong></a>' % (self.url("topics", t["topic_name"]),
                                                                   esc(t["topic_name"])),
                         num(t["depth"]), num(t["memory_depth"]) + " + " + num(t["backend_depth"]), "", "",
                         "", "", num(t["message_count"]), "", "paused" if t["paused"] else ""))
            for c in t["channels"]:
                rows.append(('&nbsp;&nbsp;<a href="%s">%s</a>' % (
                    self.url("topics", t["topic_name"], c["channel_name"]), esc(c["channel_name"])),
                    num(c["depth"]), num(c["memory_depth"]) + " + " + num(c["backend_depth"]),
                    num(c["in_flight_count"]), num(c["deferred_count"]), num(c["requeue_count"]),
                    num(c["timeout_count"]), num(c["message_count"]), num(c["client_count"]),
                    "paused" if c["paused"] else ""))
        body = (
            '<h1>Node <span class="name">%s</span></h1><p><a class="inside-link" href="%s">Inside this broker '
            '(live)</a></p><div id="tables"><p>Messages: %s &middot; Clients: %s</p>%s</div>'
        ) % (esc(node), self.url("nodes", node, "inside"), num(doc["total_messages"]), num(doc["total_clients"]),
             self.table(("Topic / Channel", "Depth", "Memory + Disk", "In-Flight", "Deferred", "Requeued",
                         "Timed Out", "Messages", "Clients", ""), rows, "stats node"))
        return self.layout("Node %s" % node, "nodes", body, answer)

    def inside(self, node):
        self._api().find_node(node)  # 404 for a node nobody knows
        body = (
            '<h1>Inside <span class="name">%s</span> <span class="live" id="live">connecting</span></h1>'
            '<p class="help">The broker\'s own state, refreshed every second: each topic\'s queue (memory, then '
            "the disk queue), its channels' queues, the messages in flight in deadline order and the deferred "
            "ones by due time, the clients with their RDY, and the broker's threads. Publish a message, "
            "subscribe, let one time out, and watch each step.</p>"
            '<div id="inside"></div>'
        ) % esc(node)
        return self.layout("Inside %s" % node, "nodes", body, None,
                           {"kind": "inside", "api": self.url("api", "nodes", node, "state"), "node": node})

    # -- counter and lookup

    def counter(self):
        answer = self._api().counter()
        total = sum(s["message_count"] for s in answer.doc["stats"].values())
        body = (
            '<h1>Messages Processed</h1><div class="counter"><span id="counter-total">%s</span>'
            '<span class="rate" id="counter-rate"></span></div>'
            '<div class="charts" id="charts"></div>'
        ) % num(total)
        return self.layout("Counter", "counter", body, answer, {"kind": "counter", "api": self.url("api", "counter")})

    def lookup(self):
        api = self._api()
        opts = self.admin.options
        create = (
            '<h2>Create Topic / Channel</h2><form id="create-form" class="create">'
            '<input name="topic" placeholder="topic" required> <input name="channel" placeholder="channel (optional)"> '
            '<button type="submit" data-url="%s">Create</button></form>'
        ) % esc(self.url("api", "topics"))
        if not opts.lookupd_http_addresses:
            body = "<h1>Lookup</h1><p>nsqadmin was started with --nsqd-http-address: no lookupd to ask.</p>" + create
            return self.layout("Lookup", "lookup", body)
        topics, g = api.ci.lookupd_topics()
        answer = api.topics()
        pairs = [(lookupd, topic) for lookupd in opts.lookupd_http_addresses for topic in g.results.get(lookupd) or ()]
        client = api.ci.client
        found = cluster.gather(
            pairs, lambda pair: client.get_json(pair[0], "/channels?topic=" + cluster.quote(pair[1]))["channels"],
            "nsqadmin-lookupd")
        sections = []
        for lookupd in opts.lookupd_http_addresses:
            if lookupd in g.errors:
                sections.append("<h2>%s</h2><p class=\"error\">%s</p>" % (esc(lookupd), esc(g.errors[lookupd])))
                continue
            items = []
            for topic in g.results.get(lookupd) or ():
                channels = sorted(found.results.get((lookupd, topic)) or ())
                items.append('<li><a href="%s">%s</a>: %s</li>' % (
                    self.url("topics", topic), esc(topic),
                    ", ".join('<a href="%s">%s</a>' % (self.url("topics", topic, c), esc(c)) for c in channels)
                    or "<em>no channels</em>"))
            sections.append("<h2>%s</h2><ul class=\"lookup\">%s</ul>" % (esc(lookupd), "".join(items) or
                                                                         "<li><em>no topics</em></li>"))
        body = "<h1>Lookup</h1>" + "".join(sections) + create
        return self.layout("Lookup", "lookup", body, answer)


def _since(seconds):
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "%dh%02dm%02ds" % (h, m, s) if h else "%dm%02ds" % (m, s) if m else "%ds" % s
