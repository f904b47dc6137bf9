// nsqadmin-threaded's script, served as /static/admin.js to every page (the only script a page has).
//
// What it does depends on the page's <body data-kind> (see admin/pages.py):
// * every page: action buttons (data-method/data-url/data-body, data-confirm asks first) and the create
//   form call the JSON API, then reload (or go to data-next); an error is shown in #flash, and a redrive's
//   moved count (or a saved policy) in the reloaded page's #flash;
// * topic, channel: the charts of message rate, depth and in flight are the server's (inline SVG in the
//   page, from its sampler's history): they follow as the tables do;
// * counter: poll the page's API route (data-api) and chart the processed rate (the history lives in the page);
// * channel: the policy form sends the fields changed (set_policy) to the channel's API route;
// * pages with #tables: fetch the page again every data-poll-ms and swap in its tables, charts and warnings;
// * inside: poll the broker's /debug/state (through nsqadmin) every data-inside-poll-ms and draw it.
//
// Everything a node sent is data, never markup: the DOM is built with createElement and textContent
// (the helper el() below), never by parsing HTML text; a figure that is not a number is drawn as "invalid".
(function () {
  "use strict";
  var body = document.body;
  var base = body.getAttribute("data-base") || "";
  var POLL_MS = setting("data-poll-ms", 2000);
  var INSIDE_POLL_MS = setting("data-inside-poll-ms", 1000);
  var SVG = "http://www.w3.org/2000/svg";

  function setting(name, fallback) {
    var n = parseInt(body.getAttribute(name), 10);
    return n > 0 ? n : fallback;
  }

  // -- building the DOM: the one way this script makes elements

  // el("div", {"class": "x", "data-topic": name}, child, ...): children are nodes, text (strings and
  // numbers become text nodes), arrays of children, or null (skipped).
  function el(tag, attrs) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, Array.prototype.slice.call(arguments, 2));
    return node;
  }

  function svg(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    return node;
  }

  function setAttrs(node, attrs) {
    Object.keys(attrs || {}).forEach(function (k) {
      if (attrs[k] !== null && attrs[k] !== undefined) node.setAttribute(k, String(attrs[k]));
    });
  }

  function append(node, children) {
    children.forEach(function (c) {
      if (c === null || c === undefined) return;
      if (Array.isArray(c)) { append(node, c); return; }
      node.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    });
  }

  function replaceChildren(node, children) {
    while (node.firstChild) node.removeChild(node.firstChild);
    append(node, children);
  }

  // -- reading what a node sent: checked, never trusted

  function isNum(v) { return typeof v === "number" && isFinite(v); }
  function invalid() { return el("span", { "class": "invalid" }, "invalid"); }
  function n(v) { return isNum(v) ? String(v) : invalid(); }                // a figure
  function t(v) {                                                           // a text field
    if (typeof v === "string") return v;
    if (v === null || v === undefined) return "";
    return isNum(v) ? String(v) : invalid();
  }
  function name(v) { return typeof v === "string" ? v : ""; }              // an attribute value
  function list(v) { return Array.isArray(v) ? v : []; }
  function obj(v) { return v !== null && typeof v === "object" && !Array.isArray(v) ? v : {}; }
  function seconds(ms) { return isNum(ms) ? (ms / 1000).toFixed(1) + "s" : invalid(); }

  // -- actions

  function message(doc) { var m = obj(doc).message; return typeof m === "string" ? m : ""; }

  function flash(text, ok) {
    var box = document.getElementById("flash");
    if (!box) return;
    box.textContent = text;
    box.className = ok ? "ok" : "";
  }
  // a banner for the page an action is about to reload, shown there once (see the end of this file):
  // "ok ..." a confirmation, "warn ..." a warning; with storage off the new figures alone show what happened
  var SAVED = "nsqadmin.saved";
  function leave(text, ok) {
    try { window.sessionStorage.setItem(SAVED, (ok ? "ok " : "warn ") + text); } catch (e) { /* off */ }
  }

  // What an error code means and what to do about it, for the banner (the code stays, for a search).
  var EXPLAIN = {
    INVALID_MAX_ATTEMPTS: "Max attempts must be a whole number from 0 (unlimited) to 65535.",
    INVALID_MSG_TTL: "The message TTL must be a duration such as 30s, 5m or 1h30m (at least 1ms), or 0 for none.",
    INVALID_TOPIC: "That is not a topic name this channel can use: letters, digits, '.', '_' and '-', at most " +
      "64 characters, not the channel's own topic and not an #ephemeral one (it would vanish). Leave it empty " +
      "to drop such messages instead.",
    INVALID_INHERIT: "Choose, for each field, either its own value or inherit; not both.",
    INVALID_CHANNEL: "A channel name is letters, digits, '.', '_' and '-' (at most 64 characters, " +
      "optionally ending in #ephemeral).",
    FORBIDDEN: "Only an admin may do this: sign in as one of nsqadmin's --admin-user names (through the " +
      "proxy that sets its --acl-http-header).",
    CROSS_ORIGIN_FORBIDDEN: "The request came from another site: use nsqadmin's own page.",
    CHANNEL_NOT_FOUND: "No node has this channel (any more): reload the topic's page to see its channels.",
    TOPIC_NOT_FOUND: "No node has this topic (any more): it may have been deleted; see the Topics page.",
    NOT_FOUND: "No such page or action on this nsqadmin.",
    UPSTREAM_ERROR: "No node took the request: check that the brokers are up (the Nodes page) and try again.",
    CONTENT_TYPE_NOT_JSON: "The request was not sent as JSON: use the page's buttons and forms.",
    MISSING_ARG_TO: "A message in this channel has no recorded source (it was published here directly, or " +
      "its record was lost in a crash): the redrive stopped at it, having moved the messages before it. " +
      "Peek to find it, then redrive with a destination (the API's \"to\") or empty the channel."
  };
  // an Error from request(): "status CODE[: detail]" -> the explanation, then the status and code as sent;
  // an UPSTREAM_ERROR whose nodes' answers name a code explained here is explained by that code
  function explain(err) {
    var text = String(err && err.message || err), code = (/^\d+ ([A-Z_]+)/.exec(text) || [])[1];
    if (code === "UPSTREAM_ERROR") {
      (text.match(/[A-Z][A-Z_]+[A-Z]/g) || []).some(function (c) {
        if (c !== code && EXPLAIN.hasOwnProperty(c)) { code = c; return true; }
        return false;
      });
    }
    return EXPLAIN.hasOwnProperty(code) ? EXPLAIN[code] + " (" + text + ")" : "Failed: " + text;
  }

  function request(method, url, payload) {
    var opts = { method: method, headers: { "Accept": "application/json" }, credentials: "same-origin" };
    if (payload !== undefined && payload !== null) {
      opts.body = typeof payload === "string" ? payload : JSON.stringify(payload);
      opts.headers["Content-Type"] = "application/json";
    }
    return fetch(url, opts).then(function (resp) {
      return resp.text().then(function (text) {
        var doc = {};
        try { doc = text ? JSON.parse(text) : {}; } catch (e) { doc = { message: text }; }
        if (!resp.ok) { throw new Error(resp.status + " " + (message(doc) || resp.statusText)); }
        return doc;
      });
    });
  }

  // -- polls and actions: a page's polls (its tables, charts, peek, inside view) never start while one
  // of its actions is under way, nor after one succeeded (the page is about to change), and an action
  // waits for the polls in flight: otherwise a poll asks for what the action has just deleted (a 404
  // the browser reports as an error).
  var gate = { acting: false, inFlight: 0, idle: [] };
  // One poll: start() makes its request and handles the answer (a promise); tick runs again after ms.
  function polled(tick, ms, start) {
    if (gate.acting) { setTimeout(tick, ms); return; }
    gate.inFlight += 1;
    start().then(null, function () {}).then(function () {
      gate.inFlight -= 1;
      if (!gate.inFlight) gate.idle.splice(0).forEach(function (resume) { resume(); });
      setTimeout(tick, ms);
    });
  }
  // An action starts: no poll from now on (until actionFailed); resolves once none is in flight.
  function act() {
    gate.acting = true;
    return gate.inFlight ? new Promise(function (resume) { gate.idle.push(resume); }) : Promise.resolve();
  }
  function actionFailed() { gate.acting = false; }

  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest ? ev.target.closest("button.action") : null;
    if (!btn) return;
    var question = btn.getAttribute("data-confirm");
    if (question && !window.confirm(question)) return;
    btn.disabled = true;
    act().then(function () {
      return request(btn.getAttribute("data-method"), btn.getAttribute("data-url"), btn.getAttribute("data-body"));
    }).then(function (doc) {
        if (message(doc)) flash(message(doc), false);
        // a redrive's answer says how many it moved: confirmed on the page it reloads (leave)
        var moved = obj(doc).moved;
        if (isNum(moved)) {
          leave("Redrive: moved " + moved + " message" + (moved === 1 ? "" : "s") + " back." +
                (message(doc) ? " Not every node answered: " + message(doc) : ""), !message(doc));
        }
        var next = btn.getAttribute("data-next");
        // data-next is a path here, never "//host"
        if (next && /^\/(?![\/\\])/.test(next)) { window.location.href = next; } else { window.location.reload(); }
      }, function (err) { actionFailed(); btn.disabled = false; flash(explain(err), false); });
  });

  var form = document.getElementById("create-form");
  if (form) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var doc = { topic: form.topic.value.trim() };
      if (form.channel.value.trim()) doc.channel = form.channel.value.trim();
      act().then(function () {
        return request("POST", form.querySelector("button").getAttribute("data-url"), doc);
      }).then(function () {
        window.location.href = base + "/topics/" + encodeURIComponent(doc.topic);
      }, function (err) { actionFailed(); flash(explain(err), false); });
    });
  }

  // the policy form: each field's select says whether it is the channel's own value or inherits the
  // broker's default; only what changed from what the page showed is sent (the others stay as they are on
  // each node): a value typed, or a select turned to "own" (that value, 0 or empty included: unlimited,
  // no TTL, drop) or to "inherit" (the field listed in "inherit"). The API checks each one.
  var POLICY_KEYS = ["max_attempts", "dead_letter_topic", "msg_ttl"];
  var policyForm = document.getElementById("policy-form");
  if (policyForm) {
    POLICY_KEYS.forEach(function (key) {
      var input = policyForm.querySelector("[name=" + key + "]");
      var mode = policyForm.querySelector("[name=" + key + "_mode]");
      if (!input || !mode) return;
      input.addEventListener("input", function () { mode.value = "own"; });
      // back to "inherit": what was typed goes (the field is sent as inherited, or not at all)
      mode.addEventListener("change", function () {
        if (mode.value === "inherit") input.value = input.getAttribute("data-initial");
      });
    });
    policyForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var doc = { action: "set_policy" }, inherit = [];
      POLICY_KEYS.forEach(function (key) {
        var input = policyForm.querySelector("[name=" + key + "]");
        var mode = policyForm.querySelector("[name=" + key + "_mode]");
        if (!input) return;
        var typed = input.value !== input.getAttribute("data-initial");
        var chosen = mode ? mode.value : "", was = mode ? mode.getAttribute("data-initial") : "";
        if (chosen === "inherit" && was !== "inherit") { inherit.push(key); return; }
        if (!typed && !(chosen === "own" && was !== "own")) return;
        var v = input.value.trim();
        if (key === "max_attempts" && v === "") v = "0"; // empty: unlimited, as on the broker
        doc[key] = key === "max_attempts" && /^[0-9]+$/.test(v) ? parseInt(v, 10) : v;
      });
      if (inherit.length) doc.inherit = inherit;
      if (Object.keys(doc).length === 1) { flash("Nothing changed: type a value or pick own or inherit.", false); return; }
      var button = policyForm.querySelector("button");
      button.disabled = true;
      act().then(function () {
        return request("POST", policyForm.getAttribute("data-url"), doc);
      }).then(function (answer) {
        if (message(answer)) { // (a warning: some nodes took it, some did not answer)
          actionFailed(); button.disabled = false;
          flash("Saved on the nodes that answered only; the others keep their policy. Set it again once they " +
                "answer (the Nodes page shows which do not). " + message(answer), false);
          return;
        }
        // the confirmation outlives the reload that shows the new policy (leave)
        leave("Policy saved on every node that has the channel.", true);
        window.location.reload();
      }, function (err) { actionFailed(); button.disabled = false; flash(explain(err), false); });
    });
  }

  // -- charts: the last minutes

  var HISTORY = 150; // points (5 minutes at one per 2 s)

  function Series(title, rate) { this.title = title; this.rate = rate; this.points = []; this.last = null; }
  Series.prototype.add = function (when, value) {
    if (!isNum(value)) return; // a node that lies leaves a gap, not a line through garbage
    var v = value;
    if (this.rate) {
      var prev = this.last;
      this.last = { t: when, v: value };
      if (!prev || when <= prev.t) return;
      v = Math.max(0, (value - prev.v) / ((when - prev.t) / 1000));
    }
    this.points.push({ t: when, v: v });
    if (this.points.length > HISTORY) this.points.shift();
  };

  // s: {title, rate, points: [{t, v}]}; a point whose v is null breaks the line (a gap in the samples)
  function drawChart(container, s) {
    // x is time: the chart spans from its first point (at most 5 minutes ago) to its last
    var w = 260, h = 54, pts = s.points.filter(function (p) { return p.v === null || isNum(p.v); });
    var known = pts.filter(function (p) { return p.v !== null; });
    var max = 1;
    known.forEach(function (p) { if (p.v > max) max = p.v; });
    var t1 = pts.length ? pts[pts.length - 1].t : 0;
    var t0 = pts.length ? Math.max(pts[0].t, t1 - 300000) : 0;
    var span = Math.max(t1 - t0, 1);
    var lines = [[]];
    pts.filter(function (p) { return p.t >= t0; }).forEach(function (p) {
      if (p.v === null) { if (lines[lines.length - 1].length) lines.push([]); return; }
      var x = known.length < 2 ? w : ((p.t - t0) / span) * w;
      lines[lines.length - 1].push(x.toFixed(1) + "," + (h - 2 - (p.v / max) * (h - 4)).toFixed(1));
    });
    var current = known.length ? known[known.length - 1].v : 0;
    var shown = s.rate ? current.toFixed(1) + "/s" : String(Math.round(current));
    var secs = Math.round(span / 1000);
    var period = secs >= 60 ? Math.floor(secs / 60) + "m" + (secs % 60 ? (secs % 60) + "s" : "") : secs + "s";
    var chart = svg("svg", { width: w, height: h, viewBox: "0 0 " + w + " " + h });
    lines.forEach(function (line) {
      if (line.length) chart.appendChild(svg("polyline", { points: line.join(" ") }));
    });
    replaceChildren(container, [
      el("div", { "class": "title" }, el("span", null, s.title), el("span", { "class": "value" }, shown)),
      chart,
      el("div", { "class": "title" }, el("span", null, "max " + (s.rate ? max.toFixed(1) + "/s" : Math.round(max))),
         el("span", null, "last " + period))
    ]);
  }

  // the sum of f over a list; NaN (drawn as a gap) when any term is not a number
  function sum(items, f) {
    var total = 0;
    list(items).forEach(function (x) { var v = f(obj(x)); total += isNum(v) ? v : NaN; });
    return total;
  }

  var EXTRACT = { // the counter page charts what it polls itself
    counter: [
      ["processed", true, function (d) {
        var stats = obj(d.stats);
        return sum(Object.keys(stats).map(function (k) { return stats[k]; }), function (s) { return s.message_count; });
      }]
    ]
  };

  function startCharts(kind, api) {
    var holder = document.getElementById("charts");
    if (!holder || !EXTRACT[kind]) return;
    var series = EXTRACT[kind].map(function (e) { return new Series(e[0], e[1]); });
    var boxes = series.map(function () { var div = el("div", { "class": "chart" }); holder.appendChild(div); return div; });
    function tick() {
      polled(tick, POLL_MS, function () { return request("GET", api).then(function (doc) {
        var now = Date.now();
        doc = obj(doc);
        EXTRACT[kind].forEach(function (e, i) { series[i].add(now, e[2](doc)); drawChart(boxes[i], series[i]); });
        if (kind === "counter") {
          var total = document.getElementById("counter-total");
          var count = EXTRACT.counter[0][2](doc);
          if (total) replaceChildren(total, [isNum(count) ? count.toLocaleString() : invalid()]);
          var rate = document.getElementById("counter-rate");
          var pts = series[0].points;
          if (rate && pts.length) rate.textContent = pts[pts.length - 1].v.toFixed(1) + " msgs/s";
        }
      }); });
    }
    tick();
  }

  // -- the inside view of one broker

  var SHOWN = 8; // messages drawn per list (the document has up to list_limit)

  function msgList(msgs, total, render) {
    msgs = list(msgs);
    var count = isNum(total) ? total : msgs.length;
    if (!count) return el("ul", { "class": "msgs" }, el("li", { "class": "due" }, "none"));
    var shown = msgs.slice(0, SHOWN);
    return el("ul", { "class": "msgs" }, shown.map(function (m) { return el("li", null, render(obj(m))); }),
              count > shown.length ? el("li", { "class": "due" }, "... and " + (count - shown.length) + " more") : null);
  }

  function stage(cls, title, children) {
    return el("div", { "class": "stage " + cls }, el("h3", null, title), children);
  }

  function backendStage(b) {
    b = obj(b);
    if (!b.kind || b.kind === "DiscardBackend") return stage("disk", "Backend", el("div", null, "ephemeral: nothing goes to disk"));
    if (b.read_file_num === undefined) {
      return stage("disk", "Backend", [el("div", { "class": "big" }, n(b.depth)), el("div", null, t(b.kind))]);
    }
    return stage("disk", "Disk queue", [
      el("div", { "class": "big" }, n(b.depth)),
      el("div", null, "read file ", n(b.read_file_num), " @ ", n(b.read_pos)),
      el("div", null, "write file ", n(b.write_file_num), " @ ", n(b.write_pos)),
      el("div", null, n(b.ops_since_sync), " ops since fsync", b.need_sync === true ? " (sync due)" : "")
    ]);
  }

  function memoryStage(depth, cap, msgs) {
    var fill = el("span");
    if (isNum(depth) && isNum(cap) && cap > 0) fill.style.width = Math.max(0, Math.min(100, (100 * depth) / cap)) + "%";
    return stage("memory", "memory queue", [
      el("div", { "class": "big" }, n(depth)),
      el("div", { "class": "bar", title: "of --mem-queue-size " + (isNum(cap) ? cap : "invalid") }, fill),
      msgList(msgs, depth, function (m) { return [t(m.id), " ", t(m.body)]; })
    ]);
  }

  function paused(doc) { return doc.paused === true ? [" ", el("span", { "class": "badge" }, "paused")] : null; }

  function clientsTable(clients) {
    var rows = list(clients).map(function (cl) {
      cl = obj(cl);
      return el("tr", null,
        el("td", null, n(cl.id), " ", t(cl.hostname || cl.client_id), " ", t(cl.user_agent)),
        el("td", null, t(cl.remote_address)),
        el("td", { "data-field": "ready_count" }, n(cl.ready_count)),
        el("td", null, n(cl.in_flight_count)), el("td", null, n(cl.message_count)),
        el("td", null, n(cl.finish_count)), el("td", null, n(cl.requeue_count)),
        el("td", null, isNum(cl.msg_timeout_ms) ? cl.msg_timeout_ms / 1000 + "s" : invalid()));
    });
    if (!rows.length) rows = [el("tr", null, el("td", { colspan: 8, "class": "none" }, "no subscriber"))];
    return el("table", { "class": "stats clients" },
      el("thead", null, el("tr", null, ["client", "address", "RDY", "in flight", "delivered", "finished", "requeued",
                                        "msg timeout"].map(function (h) { return el("th", null, h); }))),
      el("tbody", null, rows));
  }

  function channelBox(c, cap) {
    return el("div", { "class": "channel-box", "data-channel": name(c.name) },
      el("h3", { "class": "cname" }, "channel ", t(c.name), paused(c)),
      el("div", { "class": "flow" },
        memoryStage(c.memory_depth, cap, c.memory), backendStage(c.backend),
        stage("inflight", "in flight", [
          el("div", { "class": "big", "data-field": "in_flight_count" }, n(c.in_flight_count)),
          msgList(c.in_flight, c.in_flight_count, function (m) {
            return [t(m.id), " client ", n(m.client_id), " try ", n(m.attempts), " ",
                    el("span", { "class": isNum(m.deadline_in_ms) && m.deadline_in_ms < 0 ? "late" : "due" },
                       "times out in ", seconds(m.deadline_in_ms)), " ", t(m.body)];
          })]),
        stage("deferred", "deferred", [
          el("div", { "class": "big", "data-field": "deferred_count" }, n(c.deferred_count)),
          msgList(c.deferred, c.deferred_count, function (m) {
            return [t(m.id), " try ", n(m.attempts), " ", el("span", { "class": "due" }, "due in ", seconds(m.due_in_ms)),
                    " ", t(m.body)];
          })]),
        stage("", "done", [
          el("div", null, "received ", el("b", { "data-field": "message_count" }, n(c.message_count))),
          el("div", null, "requeued ", el("b", null, n(c.requeue_count))),
          el("div", null, "timed out ", el("b", { "data-field": "timeout_count" }, n(c.timeout_count)))])),
      clientsTable(c.clients));
  }

  function topicBox(tp, cap) {
    var channels = list(tp.channels).map(function (c) { return channelBox(obj(c), cap); });
    return el("section", { "class": "topic-box", "data-topic": name(tp.name) },
      el("h2", null, "topic ", t(tp.name), paused(tp)),
      el("div", { "class": "flow" },
        memoryStage(tp.memory_depth, cap, tp.memory), backendStage(tp.backend),
        stage("", "published", [el("div", { "class": "big" }, n(tp.message_count)),
                                el("div", null, n(tp.message_bytes), " bytes")])),
      channels.length ? channels : el("p", { "class": "help" }, "No channel: messages wait in the topic."));
  }

  function renderInside(doc) {
    doc = obj(doc);
    var topics = list(doc.topics).map(function (tp) { return topicBox(obj(tp), doc.mem_queue_size); });
    var threads = list(doc.threads).map(function (th) {
      th = obj(th);
      return el("tr", null, el("td", null, t(th.name)), el("td", null, t(th.waiting_in)), el("td", null, t(th.top)));
    });
    replaceChildren(document.getElementById("inside"), [
      topics.length ? topics : el("p", { "class": "help" }, "No topics yet: publish a message (POST /pub?topic=...)."),
      el("h2", null, "Threads of the broker process (" + threads.length + ")"),
      el("table", { "class": "stats threads" },
        el("thead", null, el("tr", null, el("th", null, "thread"), el("th", null, "waiting in (our code)"),
                             el("th", null, "innermost frame"))),
        el("tbody", null, threads))
    ]);
  }

  function startInside(api) {
    var live = document.getElementById("live");
    function tick() {
      polled(tick, INSIDE_POLL_MS, function () { return request("GET", api).then(function (doc) {
        renderInside(doc);
        if (live) { live.textContent = "live " + new Date().toLocaleTimeString(); live.className = "live ok"; }
      }, function (err) {
        if (live) { live.textContent = "not answering: " + err.message; live.className = "live bad"; }
      }); });
    }
    tick();
  }

  // -- a channel's next messages, for admins (data-peek: GET /api/peek/<topic>/<channel>): one row per
  // message naming its node, each field as text; a node without --channel-peek says so
  var PEEK_NOTES = {
    off: "peek is off on this node",
    refused: "this node's auth refused the peek (nsqadmin sends no secret)"
  };
  // a message's timestamp is nanoseconds since the epoch, past a double's exact integers: shown to the ms
  function published(ns) { return isNum(ns) ? new Date(ns / 1e6).toISOString() : invalid(); }
  // a dead letter's provenance as text: "orders/billing: max_attempts after 5 attempts (id ..., moved ...)"
  function deadLetter(m) {
    if (m.dead_letter === undefined) return "";
    var d = obj(m.dead_letter);
    return name(d.topic) + "/" + name(d.channel) + ": " + name(d.reason) + " after " +
      (isNum(d.attempts) ? String(d.attempts) : "?") + " attempts (original id " + name(d.id) + ", published " +
      (isNum(d.timestamp) ? new Date(d.timestamp / 1e6).toISOString() : "?") + ", moved " +
      (isNum(d.at) ? new Date(d.at / 1e6).toISOString() : "?") + ")";
  }
  function renderPeek(holder, doc) {
    var rows = [];
    list(obj(doc).nodes).forEach(function (nd) {
      nd = obj(nd);
      var msgs = list(nd.messages);
      if (nd.peek !== "on" || msgs.length === 0) {
        var note = PEEK_NOTES[nd.peek] || (nd.peek === "on" ? "no messages waiting" : "failed: " + name(nd.error));
        rows.push(el("tr", { "class": "peek-note" }, el("td", null, t(nd.node)), el("td", { "colspan": "7" }, note)));
        return;
      }
      msgs.forEach(function (m, i) {
        m = obj(m);
        rows.push(el("tr", null, el("td", null, t(nd.node)), el("td", null, String(i + 1)), el("td", null, t(m.id)),
                     el("td", null, n(m.attempts)), el("td", null, t(m.state)), el("td", null, published(m.timestamp)),
                     el("td", { "class": "body" }, t(m.body)), el("td", { "class": "dead-letter" }, deadLetter(m))));
      });
    });
    var table = el("table", { "class": "stats peek" },
      el("thead", null, el("tr", null, ["Node", "#", "ID", "Attempts", "State", "Published", "Body",
                                        "Dead letter from"].map(function (h) {
        return el("th", null, h);
      }))),
      el("tbody", null, rows));
    var old = holder.querySelector("table.peek");
    if (old) holder.replaceChild(table, old); else holder.appendChild(table);
  }

  function startPeek(url) {
    var holder = document.getElementById("peek");
    if (!holder) return;
    function tick() {
      polled(tick, POLL_MS, function () {
        return request("GET", url).then(function (doc) { renderPeek(holder, doc); },
                                        function (err) { flash(err.message, false); });
      });
    }
    tick();
  }

  // -- the server-rendered tables and charts follow too: the page itself is fetched again and its #tables,
  // #charts and #warnings are moved in (one renderer, the server's, which escapes everything; DOMParser's document is
  // inert, and its nodes are adopted, never re-parsed from text)
  function startTables() {
    var tables = document.getElementById("tables");
    if (!tables || !window.DOMParser) return;
    function tick() {
      polled(tick, POLL_MS, function () {
        return fetch(window.location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" })
        .then(function (resp) {
          if (!resp.ok) throw new Error(resp.status);
          return resp.text();
        }).then(function (text) {
          var fresh = new DOMParser().parseFromString(text, "text/html");
          ["tables", "warnings", "charts"].forEach(function (id) {
            var src = fresh.getElementById(id), dst = document.getElementById(id);
            if (src && dst) replaceChildren(dst, Array.prototype.slice.call(src.childNodes).map(function (c) {
              return document.adoptNode(c);
            }));
          });
        });
      });
    }
    setTimeout(tick, POLL_MS);
  }

  // a confirmation an action left for the page it reloaded (the policy form's, a redrive's): shown once
  try {
    var saved = window.sessionStorage.getItem(SAVED);
    if (saved) {
      window.sessionStorage.removeItem(SAVED);
      flash(saved.replace(/^(ok|warn) /, ""), saved.indexOf("warn ") !== 0);
    }
  } catch (e) { /* storage off */ }

  startTables();
  var peekUrl = body.getAttribute("data-peek");
  if (peekUrl && /^\/(?![\/\\])/.test(peekUrl)) startPeek(peekUrl);
  var kind = body.getAttribute("data-kind");
  var api = body.getAttribute("data-api");
  var charts = body.getAttribute("data-charts");
  if (kind === "inside") {
    startInside(api);
  } else if (charts) {
    // (drawn by the server, refreshed with the tables)
  } else if (kind && api) {
    startCharts(kind, api);
  }
})();
