"""nsqadmin's pages: server-rendered HTML from the same documents the JSON API answers.

Each page's figures are complete without JavaScript (tables of the figures
when it was rendered, and a topic's or channel's charts drawn as inline SVG by
:mod:`.charts`); the script (``assets/admin.js``, served by
:mod:`.static`) adds what needs it: the action buttons and the create form,
the counter page's chart, the live counter, the tables and charts refreshed
in place, and the inside view of one broker, which is drawn by the script only.  Nodes that did not answer (or answered
with a malformed document) are listed at the top of the page, never a
reason for it to fail.

Every page is built with :mod:`.markup`, which escapes every value it is
given: nothing a node, a lookupd or a client sent is ever markup.  Settings
the script needs (the API route, the poll interval) are ``data-`` attributes
of ``<body>``; a page has no inline script, style or event handler, so the
Content-Security-Policy (:data:`CONTENT_SECURITY_POLICY`) can forbid them all.
"""

import json
import time
import urllib.parse

from ..internal.gocompat import format_duration_ns
from . import charts, cluster
from .api import AdminError, TopicNotFound
from .markup import document, el, frag, script_file

NAV = (("topics", "Topics"), ("nodes", "Nodes"), ("counter", "Counter"), ("lookup", "Lookup"))
POLL_MS = 2000  # the tables and charts follow the cluster at this interval
INSIDE_POLL_MS = 1000  # the inside view follows its broker at this one

# Every HTML answer carries it: scripts, styles and images from nsqadmin itself only, no inline script,
# style attribute or event handler, no frames, forms posting to nsqadmin only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)

CHANNEL_HEADERS = ("Depth", "Memory + Disk", "In-Flight", "Deferred", "Requeued", "Timed Out", "Messages",
                   "Clients", "E2E latency", "")
INVALID = "invalid"
# Added to a channel table when a channel in it has a policy (a broker's /stats lists one only then).
POLICY_HEADERS = ("Policy", "Dead-lettered", "Expired")
DIFFERS = "differs by node"


def seg(value):
    """A name as one URL path segment (``#ephemeral`` included)."""
    return urllib.parse.quote(str(value), safe="")


def num(n):
    """A figure: an integer, or ``invalid`` for anything else (the boundary checks types; this is the backstop)."""
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    return el("span", {"class": "invalid"}, INVALID)


def port(n):
    """A port number, as digits (no thousands separator), or ``invalid``."""
    return str(n) if isinstance(n, int) and not isinstance(n, bool) else num(n)


def _percentiles(e2e):
    ps = (e2e or {}).get("percentiles") or ()
    return " ".join("p%g: %s" % (p["quantile"] * 100, _duration_ns(p["average"])) for p in ps)


def _duration_ns(ns):
    ns = float(ns)
    for unit, size in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= size:
            return "%.1f%s" % (ns / size, unit)
    return "%dns" % ns


def _paused(doc):
    return "paused" if doc["paused"] else ""


def _badge(label):
    return el("span", {"class": "badge"}, label)


def _memory_disk(doc):
    return frag(num(doc["memory_depth"]), " + ", num(doc["backend_depth"]))


def channel_cells(c):
    """The figures of one channel (a node's, or the total), in :data:`CHANNEL_HEADERS` order."""
    return (num(c["depth"]), _memory_disk(c), num(c["in_flight_count"]), num(c["deferred_count"]),
            num(c["requeue_count"]), num(c["timeout_count"]), num(c["message_count"]), num(c["client_count"]),
            _percentiles(c["e2e_processing_latency"]), _paused(c))


def has_policy(channels):
    """True when any of these channel documents carries the policy fields."""
    return any("max_attempts" in c for c in channels)


def ttl_text(ms):
    """A message TTL in milliseconds as a Go duration (``30s``); None: the nodes differ."""
    if ms is None:
        return DIFFERS
    return format_duration_ns(ms * 1000000) if isinstance(ms, int) and not isinstance(ms, bool) else num(ms)


def attempts_text(n):
    if n is None:
        return DIFFERS
    return "unlimited" if n == 0 else num(n)


class Pages:
    """The HTML of one NSQAdmin's pages (each method answers a page's text)."""

    def __init__(self, admin):
        self.admin = admin
        self.api = None  # set lazily: the router's AdminAPI (pages render its documents)
        self.base = admin.options.base_path.rstrip("/")

    def _api(self):
        if self.api is None:
            from .api import AdminAPI

            self.api = AdminAPI(self.admin)
        return self.api

    def url(self, *parts, query=None):
        """A path on nsqadmin (under the base path): each part one segment, then the query, encoded."""
        path = self.base + "/" + "/".join(seg(p) for p in parts)
        return path + "?" + urllib.parse.urlencode(query) if query else path

    def link(self, label, *parts, cls=None, query=None):
        return el("a", {"href": self.url(*parts, query=query), "class": cls}, label)

    # -- layout

    def layout(self, title, section, body, answer=None, data=None):
        """The whole page around ``body`` (Markup); ``data`` becomes ``data-`` attributes for the script."""
        opts = self.admin.options
        sources = opts.lookupd_http_addresses or opts.nsqd_http_addresses
        source_kind = "nsqlookupd" if opts.lookupd_http_addresses else "nsqd"
        warning = None
        if answer is not None and answer.failed:
            warning = el("div", {"class": "warning", "id": "failed-nodes"},
                         el("strong", None, "Not answering (%d):" % len(answer.failed)), " ",
                         ", ".join(answer.failed),
                         el("ul", None, [el("li", None, e) for e in answer.errors]))
        attrs = {"data-base": self.base, "data-poll-ms": POLL_MS, "data-inside-poll-ms": INSIDE_POLL_MS}
        attrs.update(("data-" + k, v) for k, v in (data or {}).items())
        head = el("head", None,
                  el("meta", {"charset": "utf-8"}),
                  el("meta", {"name": "viewport", "content": "width=device-width, initial-scale=1"}),
                  el("title", None, "%s - nsqadmin" % title),
                  el("link", {"rel": "icon", "href": self.base + "/static/favicon.svg"}),
                  el("link", {"rel": "stylesheet", "href": self.base + "/static/admin.css"}))
        nav = [el("a", {"class": "active" if key == section else None, "href": self.url(key)}, label)
               for key, label in NAV]
        page = el("body", attrs,
                  el("header", None,
                     el("a", {"class": "brand", "href": self.base + "/"}, "nsqadmin"),
                     el("nav", None, nav),
                     el("span", {"class": "sources"}, "%s: %s" % (source_kind, ", ".join(sources)))),
                  el("main", None, el("div", {"id": "flash", "role": "status"}),
                     el("div", {"id": "warnings"}, warning), body),
                  el("footer", None, "nsqadmin-threaded v%s" % self.admin.version),
                  script_file(self.base + "/static/admin.js"))
        return document("en", head, page).render()

    def error_page(self, status, message):
        title = "Not found" if status == 404 else "Error %d" % status
        return self.layout(title, "", frag(el("h1", None, title), el("p", {"class": "error"}, message)))

    def button(self, label, method, url, body=None, confirm=None, next_url=None, cls=""):
        """An action button: the script sends ``body`` (JSON) with ``method`` to ``url`` (an API route)."""
        return el("button", {
            "type": "button", "class": "action " + cls, "data-method": method, "data-url": url,
            "data-body": json.dumps(body) if body is not None else None, "data-confirm": confirm,
            "data-next": next_url}, label)

    @staticmethod
    def table(headers, rows, cls="stats"):
        """A table of ``rows`` (tuples of cells: text, integers or Markup)."""
        body = [el("tr", None, [el("td", None, cell) for cell in row]) for row in rows]
        if not rows:
            body = el("tr", None, el("td", {"colspan": len(headers), "class": "none"}, "none"))
        return el("table", {"class": cls}, el("thead", None, el("tr", None, [el("th", None, h) for h in headers])),
                  el("tbody", None, body))

    def dead_letter(self, name):
        """The dead-letter topic: a link to its page, ``none (dropped)``, or that the nodes differ."""
        if name is None:
            return DIFFERS
        return self.link(name, "topics", name, cls="dead-letter") if name else "none (dropped)"

    def policy_summary(self, c):
        """A channel's policy in one short cell: ``max 5 · TTL 30s · → orders.dead`` (``none`` without one)."""
        if "max_attempts" not in c:
            return ""
        attempts, ttl, dlq = c["max_attempts"], c["msg_ttl"], c["dead_letter_topic"]
        if attempts == 0 and ttl == 0:
            return "none"  # a dead-letter topic alone takes nothing out
        parts = []
        if attempts != 0:
            parts.append(frag("max ", attempts_text(attempts)))
        if ttl != 0:
            parts.append(frag("TTL ", ttl_text(ttl)))
        # (None: the nodes differ, never "drop")
        parts.append(frag("\u2192 ", self.dead_letter(dlq) if dlq or dlq is None else "drop"))
        return frag([(" \u00b7 " if i else "", part) for i, part in enumerate(parts)])

    def policy_cells(self, c):
        """:data:`POLICY_HEADERS`' cells of one channel (blank for one without a policy)."""
        if "max_attempts" not in c:
            return ("", "", "")
        return (self.policy_summary(c), num(c["dead_letter_count"]), num(c["expired_count"]))

    def channel_table_cells(self, c, with_policy):
        return channel_cells(c) + (self.policy_cells(c) if with_policy else ())

    def _title(self, *parts, paused=False):
        return el("h1", None, parts, [" ", _badge("paused")] if paused else None)

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
            total = cluster.cluster_topic_stats(name, by_topic.get(name, []))
            rows.append((
                self.link(name, "topics", name), num(total["depth"]),
                num(sum(c["in_flight_count"] for c in total["channels"])), num(total["message_count"]),
                num(len(total["channels"])), num(len(total["nodes"])), _paused(total),
            ))
        body = frag(el("h1", None, "Topics"), el("div", {"id": "tables"}, self.table(
            ("Topic", "Depth", "In-Flight", "Messages", "Channels", "Nodes", ""), rows, "stats topics")))
        return self.layout("Topics", "topics", body, answer)

    def _topic_row(self, t, label):
        return (label, num(t["depth"]), _memory_disk(t), num(t["message_count"]),
                num(sum(c["client_count"] for c in t["channels"])), _percentiles(t["e2e_processing_latency"]),
                _paused(t))

    def _topic_answer(self, topic):
        """The topic's answer for a page: a topic nobody knows is a 404 page (the API says 502, as Go)."""
        try:
            answer = self._api().topic(topic)
        except TopicNotFound:
            answer = None
        if answer is None or (not answer.doc["nodes"] and not answer.failed
                              and not self.admin.options.lookupd_http_addresses):
            raise AdminError(404, "No node has a topic named %s." % topic)
        return answer

    def topic(self, topic):
        answer = self._topic_answer(topic)
        t = answer.doc
        api_url = self.url("api", "topics", topic)
        actions = (
            self.button("Unpause" if t["paused"] else "Pause", "POST", api_url,
                        {"action": "unpause" if t["paused"] else "pause"}, cls="pause"), " ",
            self.button("Empty Queue", "POST", api_url, {"action": "empty"},
                        confirm="Empty the topic queue of %s on every node?" % topic, cls="empty"), " ",
            self.button("Delete Topic", "DELETE", api_url, confirm="Delete topic %s?" % topic,
                        next_url=self.url("topics"), cls="delete"),
        )
        tombstones = bool(self.admin.options.lookupd_http_addresses)
        node_rows = [self._topic_row(n, frag(
            self.link(n["node"], "nodes", n["node"]), " ",
            self.link("inside", "nodes", n["node"], "inside", cls="inside-link", query={"topic": topic}), " ",
            self.button("Tombstone", "DELETE", self.url("api", "nodes", n["node"]), {"topic": topic},
                        confirm="Tombstone topic %s on %s?" % (topic, n["node"]), cls="small tombstone")
            if tombstones else None)) for n in t["nodes"]]
        node_rows.append(self._topic_row(t, el("strong", None, "Total")))
        policies = has_policy(t["channels"])
        channel_rows = [(self.link(c["channel_name"], "topics", topic, c["channel_name"]),)
                        + self.channel_table_cells(c, policies) for c in t["channels"]]
        body = frag(
            self._title("Topic ", el("span", {"class": "name"}, topic), paused=t["paused"]),
            el("div", {"class": "actions"}, actions),
            self.charts_section(topic),
            el("div", {"id": "tables"},
               el("h2", None, "Nodes"),
               self.table(("Node", "Depth", "Memory + Disk", "Messages", "Clients", "E2E latency", ""), node_rows),
               el("h2", None, "Channels"),
               self.table(("Channel",) + CHANNEL_HEADERS + (POLICY_HEADERS if policies else ()), channel_rows,
                          "stats channels")))
        return self.layout("Topic %s" % topic, "topics", body, answer,
                           {"kind": "topic", "api": api_url, "topic": topic, "charts": self.charts_url(topic)})

    def channel(self, topic, channel, peek=False, redrive=False):
        """The channel page; with ``peek`` (an admin's request) its Peek section, filled by the script;
        with ``redrive`` (a request that may act) and on a dead-letter topic (a node says
        ``is_dead_letter_topic``) its Redrive button, which asks first."""
        try:
            answer = self._api().channel(topic, channel)
        except TopicNotFound:
            raise AdminError(404, "No node has a topic named %s." % topic) from None
        c = answer.doc
        if "channel_name" not in c:
            raise AdminError(404, "CHANNEL_NOT_FOUND: no node has a channel named %s in topic %s."
                             % (channel, topic))
        api_url = self.url("api", "topics", topic, channel)
        actions = (
            self.button("Unpause" if c["paused"] else "Pause", "POST", api_url,
                        {"action": "unpause" if c["paused"] else "pause"}, cls="pause"), " ",
            self.button("Empty Queue", "POST", api_url, {"action": "empty"},
                        confirm="Empty channel %s of topic %s on every node?" % (channel, topic), cls="empty"), " ",
            self.button("Delete Channel", "DELETE", api_url, confirm="Delete channel %s?" % channel,
                        next_url=self.url("topics", topic), cls="delete"),
        )
        if redrive and c.get("is_dead_letter_topic"):
            actions += (" ", self.button(
                "Redrive", "POST", api_url, {"action": "redrive"}, cls="redrive",
                confirm="Send every message of channel %s of topic %s back to the topic it was dead-lettered from, "
                        "on every node? A message without a recorded source stops the redrive." % (channel, topic)))
        policies = has_policy(c["nodes"])
        node_rows = [(self.link(n["node"], "nodes", n["node"]),) + self.channel_table_cells(n, policies)
                     for n in c["nodes"]]
        node_rows.append((el("strong", None, "Total"),) + self.channel_table_cells(c, policies))
        now = int(time.time())
        client_rows = [(
            cl["hostname"] or cl["client_id"], cl["remote_address"], cl["user_agent"] or cl["version"], cl["node"],
            " ".join(f for f, on in (("TLS", cl["tls"]), ("deflate", cl["deflate"]), ("snappy", cl["snappy"]),
                                     ("authed", cl["authed"])) if on),
            num(cl["ready_count"]), num(cl["in_flight_count"]), num(cl["message_count"]), num(cl["finish_count"]),
            num(cl["requeue_count"]), _since(now - cl["connect_ts"]),
        ) for cl in c["clients"]]
        body = frag(
            self._title("Topic ", self.link(topic, "topics", topic), " / Channel ",
                        el("span", {"class": "name"}, channel), paused=c["paused"]),
            el("div", {"class": "actions"}, actions),
            self.policy_form(c, api_url),
            self.charts_section(topic, channel),
            el("div", {"id": "tables"},
               self.policy_section(c),
               el("h2", None, "Nodes"),
               self.table(("Node",) + CHANNEL_HEADERS + (POLICY_HEADERS if policies else ()), node_rows),
               el("h2", None, "Clients"),
               self.table(("Client", "Address", "User-Agent", "Node", "Features", "RDY", "In-Flight", "Messages",
                           "Finished", "Requeued", "Connected"), client_rows, "stats clients")),
            el("div", {"id": "peek", "class": "peek"}, el("h2", None, "Peek"),
               el("p", None, "The next messages of each node (an admin's view; nothing is consumed)."))
            if peek else None)
        return self.layout("Channel %s/%s" % (topic, channel), "topics", body, answer,
                           {"kind": "channel", "api": api_url, "topic": topic, "channel": channel,
                            "charts": self.charts_url(topic, channel),
                            "peek": self.url("api", "peek", topic, channel) if peek else None})

    def charts_section(self, topic, channel=""):
        """The ``#charts`` of a topic or channel page, drawn here (see :mod:`.charts`); empty when nsqadmin
        keeps no samples."""
        if self.admin.sampler is None:
            return el("div", {"class": "charts", "id": "charts"})
        return el("div", {"class": "charts", "id": "charts"},
                  charts.charts(self._api().charts(topic, channel), int(time.time() * 1000)))

    def charts_url(self, *parts):
        """The charts' API route of a topic or channel, or None when nsqadmin keeps no samples."""
        return self.url("api", "charts", *parts) if self.admin.sampler is not None else None

    def policy_section(self, c):
        """A channel's policy over its nodes (as their /stats give it) and what it took out: for each field
        the value in force, the channel's own setting (or that it inherits) and the broker's default."""
        if has_policy(c["nodes"]):
            own, default = c.get("own_policy"), c.get("default_policy")
            fields = (("Max attempts", "max_attempts", attempts_text),
                      ("Dead-letter topic", "dead_letter_topic", self.dead_letter),
                      ("Message TTL", "msg_ttl", lambda ms: ttl_text(ms) if ms != 0 else "none"))
            rows = [el("tr", {"data-field": key}, el("th", None, label),
                       el("td", {"class": "effective"}, render(c[key])),
                       el("td", {"class": "own"}, self.own_text(own, key, render)),
                       el("td", {"class": "default"}, "" if default is None else render(default[key])
                          if key in default else DIFFERS))
                    for label, key, render in fields]
            rows.extend(el("tr", None, el("th", None, label), el("td", {"colspan": 3}, num(c[key])))
                        for label, key in (("Dead-lettered (over max attempts)", "dead_letter_count"),
                                           ("Expired (over the TTL)", "expired_count")))
            shown = el("table", {"class": "stats policy"},
                       el("thead", None, el("tr", None, [el("th", None, h) for h in (
                           "", "In force", "This channel's own", "Broker default")])),
                       el("tbody", None, rows))
        else:
            shown = el("p", {"class": "policy none"}, "No policy: every message is delivered until it is finished.")
        return frag(el("h2", None, "Policy"), shown)

    @staticmethod
    def own_text(own, key, render):
        """A channel's own setting of one field: its value, ``inherits the default``, or that the nodes differ."""
        if own is None:
            return ""  # (a broker that does not tell it)
        if key not in own:
            return DIFFERS
        return el("span", {"class": "inherited"}, "inherits the default") if own[key] is None else render(own[key])

    def policy_form(self, c, api_url):
        """The form that sets a channel's policy (the script sends the fields changed, as ``set_policy``).

        Each field is the channel's own value or "inherit the broker's default" (its select), so the form
        can set an own "unlimited", "drop" or "no TTL" as well as give a field back to the default."""
        fields = (
            ("max_attempts", "max attempts (0: unlimited)", "number", str, lambda n: str(n) if n else "unlimited"),
            ("dead_letter_topic", "dead-letter topic (empty: drop)", "text", str, lambda name: name or "drop"),
            ("msg_ttl", "message TTL (30s, 5m; 0: none)", "text", lambda ms: format_duration_ns(ms * 1000000),
             lambda ms: format_duration_ns(ms * 1000000) if ms else "none"),
        )
        own = c.get("own_policy")
        inputs = []
        for key, label, kind, text, described in fields:
            if own is not None:
                value, differs = (own.get(key), key not in own)
            else:  # (a broker that does not tell its own policy: what is in force)
                value, differs = c.get(key), c.get(key) is None and "max_attempts" in c
            inherited = own is not None and not differs and value is None
            mode = "" if differs else "inherit" if inherited or ("max_attempts" not in c) else "own"
            shown = "" if value is None else text(value)
            default = (c.get("default_policy") or {}).get(key)
            inputs.append(el("label", None, label, " ", el("select", {
                "name": key + "_mode", "data-initial": mode, "aria-label": label + ": own or inherited"},
                el("option", {"value": "", "selected": not mode, "disabled": True}, DIFFERS) if differs else None,
                el("option", {"value": "inherit", "selected": mode == "inherit"},
                   "inherit" if default is None else "inherit (%s)" % described(default)),
                el("option", {"value": "own", "selected": mode == "own"}, "own")), " ", el("input", {
                    "name": key, "type": kind, "min": "0" if kind == "number" else None, "value": shown,
                    "data-initial": shown, "placeholder": DIFFERS if differs else None})))
            inputs.append(" ")
        return el("form", {"id": "policy-form", "class": "policy", "data-url": api_url},
                  inputs, el("button", {"type": "submit"}, "Set policy"))

    # -- nodes

    def nodes(self):
        answer = self._api().nodes()
        rows = []
        for p in answer.doc["nodes"]:
            node = cluster.http_address(p)
            topics = [(self.link(t["topic"], "topics", t["topic"], cls="tombstoned" if t["tombstoned"] else None),
                       " ") for t in p["topics"]]
            rows.append((
                self.link(p["hostname"] or node, "nodes", node), p["broadcast_address"], port(p["tcp_port"]),
                port(p["http_port"]), frag(p["version"], [" ", _badge("out of date")] if p["out_of_date"] else None),
                ", ".join(p["remote_addresses"]), topics, self.link("inside", "nodes", node, "inside"),
            ))
        body = frag(el("h1", None, "Nodes"), el("div", {"id": "tables"}, self.table(
            ("Hostname", "Broadcast Address", "TCP Port", "HTTP Port", "Version", "Lookupd Conns.", "Topics", ""),
            rows, "stats nodes")))
        return self.layout("Nodes", "nodes", body, answer)

    def node(self, node):
        answer = self._api().node(node, partial=True)
        doc = answer.doc
        rows = []
        policies = has_policy([c for t in doc["topics"] for c in t["channels"]])
        for t in doc["topics"]:
            name = t["topic_name"]
            rows.append((
                frag(self.link(el("strong", None, name), "topics", name), " ",
                     self.link("inside", "nodes", node, "inside", cls="inside-link", query={"topic": name})),
                num(t["depth"]), _memory_disk(t), "", "", "", "", num(t["message_count"]), "",
                _percentiles(t["e2e_processing_latency"]), _paused(t)) + (("", "", "") if policies else ()))
            rows.extend((frag("\u00a0\u00a0", self.link(c["channel_name"], "topics", name, c["channel_name"])),)
                        + self.channel_table_cells(c, policies) for c in t["channels"])
        body = frag(
            el("h1", None, "Node ", el("span", {"class": "name"}, node)),
            el("p", None, self.link("Inside this broker (live)", "nodes", node, "inside", cls="inside-link")),
            el("div", {"id": "tables"},
               el("p", None, "Messages: ", num(doc["total_messages"]), " \u00b7 Clients: ", num(doc["total_clients"])),
               self.table(("Topic / Channel",) + CHANNEL_HEADERS + (POLICY_HEADERS if policies else ()), rows,
                          "stats node")))
        return self.layout("Node %s" % node, "nodes", body, answer)

    def inside(self, node, topic=""):
        self._api().find_node(node)  # 404 for a node nobody knows
        api_url = self.url("api", "nodes", node, "state", query={"topic": topic} if topic else None)
        narrowed = None
        if topic:
            narrowed = frag(" / topic ", el("span", {"class": "name"}, topic), " ",
                            self.link("(all topics)", "nodes", node, "inside", cls="all-topics"))
        body = frag(
            el("h1", None, "Inside ", el("span", {"class": "name"}, node), narrowed, " ",
               el("span", {"class": "live", "id": "live"}, "connecting")),
            el("p", {"class": "help"},
               "The broker's own state, refreshed every second: each topic's queue (memory, then the disk queue), "
               "its channels' queues, the messages in flight in deadline order and the deferred ones by due time, "
               "the clients with their RDY, and the broker's threads. Publish a message, subscribe, let one time "
               "out, and watch each step. This view is drawn by the page's script: it needs JavaScript."),
            el("div", {"id": "inside"}))
        return self.layout("Inside %s" % node, "nodes", body, None,
                           {"kind": "inside", "api": api_url, "node": node, "topic": topic or None})

    # -- counter and lookup

    def counter(self):
        answer = self._api().counter()
        total = sum(s["message_count"] for s in answer.doc["stats"].values())
        body = frag(
            el("h1", None, "Messages Processed"),
            el("div", {"class": "counter"}, el("span", {"id": "counter-total"}, num(total)),
               el("span", {"class": "rate", "id": "counter-rate"})),
            el("div", {"class": "charts", "id": "charts"}))
        return self.layout("Counter", "counter", body, answer, {"kind": "counter", "api": self.url("api", "counter")})

    def lookup(self):
        api = self._api()
        opts = self.admin.options
        create = frag(
            el("h2", None, "Create Topic / Channel"),
            el("form", {"id": "create-form", "class": "create"},
               el("input", {"name": "topic", "placeholder": "topic", "required": True}), " ",
               el("input", {"name": "channel", "placeholder": "channel (optional)"}), " ",
               el("button", {"type": "submit", "data-url": self.url("api", "topics")}, "Create")))
        if not opts.lookupd_http_addresses:
            body = frag(el("h1", None, "Lookup"),
                        el("p", None, "nsqadmin was started with --nsqd-http-address: no lookupd to ask."), create)
            return self.layout("Lookup", "lookup", body)
        topics, g = api.ci.lookupd_topics()
        answer = api.topics()
        found = api.ci.lookupd_channels_of(g.results)
        sections = []
        for lookupd in opts.lookupd_http_addresses:
            if lookupd in g.errors:
                sections.append(frag(el("h2", None, lookupd), el("p", {"class": "error"}, str(g.errors[lookupd]))))
                continue
            entries = []
            for topic in g.results.get(lookupd) or ():
                channels = found.results.get((lookupd, topic)) or ()
                entries.append(el("li", None, self.link(topic, "topics", topic), ": ",
                                  [(", " if i else "", self.link(c, "topics", topic, c))
                                   for i, c in enumerate(channels)] or el("em", None, "no channels")))
            sections.append(frag(el("h2", None, lookupd), el("ul", {"class": "lookup"},
                                                              entries or el("li", None, el("em", None, "no topics")))))
        body = frag(el("h1", None, "Lookup"), sections, create)
        return self.layout("Lookup", "lookup", body, answer)


def _since(seconds):
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "%dh%02dm%02ds" % (h, m, s) if h else "%dm%02ds" % (m, s) if m else "%ds" % s
