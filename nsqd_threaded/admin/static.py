"""nsqadmin's stylesheet and script, as Python strings (so a copied ``.pyz`` serves them; no build step).

The script is plain JavaScript run by every page; what it does depends on the
page's ``data-kind`` (see :mod:`.pages`):

* every page: action buttons (``data-method``/``data-url``/``data-body``,
  ``data-confirm`` asks first) and the create form call the JSON API, then
  reload (or go to ``data-next``); an error is shown in ``#flash``;
* ``topic``, ``channel``, ``counter``: poll the page's API route every
  :data:`POLL_MS` and draw the last minutes of rates and depths as small
  inline SVG charts (the history lives in the page);
* pages with tables (``#tables``): fetch the page again every
  :data:`POLL_MS` and swap in its tables and its list of nodes not answering;
* ``inside``: poll the broker's ``/debug/state`` (through nsqadmin) every
  second and draw it.
"""

POLL_MS = 2000

CSS = r"""
:root { --fg:#1d2733; --muted:#6b7785; --line:#dde3ea; --accent:#2d6cdf; --warn:#b35c00; --bad:#b3261e;
        --ok:#1e7b34; --bg:#f7f9fb; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color:var(--fg);
       background:var(--bg); }
header { display:flex; align-items:center; gap:1.5em; padding:.6em 1.2em; background:#18222e; color:#fff; }
header a { color:#cfd8e3; text-decoration:none; }
header a.brand { color:#fff; font-weight:600; font-size:1.1em; }
header nav a { margin-right:1em; padding:.2em 0; }
header nav a.active { color:#fff; border-bottom:2px solid var(--accent); }
header .sources { margin-left:auto; color:#8b98a8; font-size:.85em; }
main { padding:1em 1.2em; max-width:1400px; }
footer { padding:1em 1.2em; color:var(--muted); font-size:.8em; }
h1 { font-size:1.4em; margin:.3em 0 .6em; } h2 { font-size:1.1em; margin:1.2em 0 .4em; }
h1 .name { font-family:ui-monospace, Menlo, Consolas, monospace; }
a { color:var(--accent); }
table.stats { border-collapse:collapse; background:#fff; border:1px solid var(--line); min-width:50%; }
table.stats th, table.stats td { padding:.3em .7em; border-bottom:1px solid var(--line); text-align:right;
                                  white-space:nowrap; }
table.stats th:first-child, table.stats td:first-child { text-align:left; }
table.stats th { background:#eef2f6; font-weight:600; font-size:.9em; }
table.stats tr:last-child td { border-bottom:none; }
td.none { color:var(--muted); text-align:center !important; }
.badge { font-size:.6em; vertical-align:middle; background:var(--warn); color:#fff; padding:.15em .5em;
         border-radius:3px; }
.warning { background:#fff4e5; border:1px solid #f0c36d; padding:.5em .8em; margin-bottom:1em; border-radius:4px; }
.warning ul { margin:.3em 0 0; padding-left:1.2em; color:var(--muted); }
.error { color:var(--bad); }
#flash:empty { display:none; }
#flash { padding:.5em .8em; margin-bottom:1em; border-radius:4px; background:#fde7e6; border:1px solid #f2b8b5; }
#flash.ok { background:#e6f4ea; border-color:#a8dab5; }
.actions { margin-bottom:.8em; }
button { font:inherit; padding:.3em .8em; border:1px solid var(--line); border-radius:4px; background:#fff;
         cursor:pointer; }
button:hover { border-color:var(--accent); }
button.delete, button.empty { color:var(--bad); }
button.small { font-size:.8em; padding:.1em .5em; }
a.tombstoned { text-decoration:line-through; color:var(--muted); }
.charts { display:flex; flex-wrap:wrap; gap:.8em; margin:.5em 0 1em; }
.chart { background:#fff; border:1px solid var(--line); border-radius:4px; padding:.3em .5em; }
.chart .title { font-size:.8em; color:var(--muted); display:flex; justify-content:space-between; gap:1em; }
.chart .value { color:var(--fg); font-weight:600; }
.chart svg { display:block; }
.chart polyline { fill:none; stroke:var(--accent); stroke-width:1.5; }
.counter { font-size:3em; font-weight:600; }
.counter .rate { font-size:.4em; color:var(--muted); margin-left:1em; }
.live { font-size:.55em; vertical-align:middle; color:var(--muted); }
.live.ok { color:var(--ok); } .live.bad { color:var(--bad); }
.help { color:var(--muted); max-width:60em; }
.topic-box { background:#fff; border:1px solid var(--line); border-radius:6px; padding:.6em .9em; margin-bottom:1em; }
.topic-box h2 { margin:.1em 0 .5em; font-family:ui-monospace, Menlo, Consolas, monospace; }
.flow { display:flex; flex-wrap:wrap; gap:.8em; align-items:stretch; }
.stage { border:1px solid var(--line); border-radius:4px; padding:.4em .6em; min-width:11em; background:#fbfcfd; }
.stage h3 { margin:0 0 .3em; font-size:.85em; color:var(--muted); text-transform:uppercase; letter-spacing:.04em; }
.stage .big { font-size:1.6em; font-weight:600; }
.stage.inflight { border-color:#9cb9ef; } .stage.deferred { border-color:#e0c27a; }
.stage.disk { border-color:#c9b3e6; }
.channel-box { border-top:1px dashed var(--line); margin-top:.6em; padding-top:.6em; }
.channel-box h3.cname { margin:.1em 0 .4em; font-family:ui-monospace, Menlo, Consolas, monospace; font-size:1em; }
.msgs { font-family:ui-monospace, Menlo, Consolas, monospace; font-size:.8em; margin:.3em 0 0; padding:0;
        list-style:none; }
.msgs li { white-space:nowrap; }
.msgs .due { color:var(--muted); }
.msgs .late { color:var(--bad); }
.bar { height:6px; background:#e8edf3; border-radius:3px; overflow:hidden; margin-top:.3em; }
.bar span { display:block; height:100%; background:var(--accent); }
table.threads td:nth-child(2), table.threads td:nth-child(3) { text-align:left; font-family:ui-monospace, Menlo,
  Consolas, monospace; font-size:.85em; }
form.create input { font:inherit; padding:.3em .5em; border:1px solid var(--line); border-radius:4px; }
"""

JS = r"""
(function () {
  "use strict";
  var body = document.body;
  var base = body.getAttribute("data-base") || "";

  function flash(text, ok) {
    var el = document.getElementById("flash");
    if (!el) return;
    el.textContent = text;
    el.className = ok ? "ok" : "";
  }

  function request(method, url, payload) {
    var opts = { method: method, headers: { "Accept": "application/json" } };
    if (payload !== undefined && payload !== null) {
      opts.body = typeof payload === "string" ? payload : JSON.stringify(payload);
      opts.headers["Content-Type"] = "application/json";
    }
    return fetch(url, opts).then(function (resp) {
      return resp.text().then(function (text) {
        var doc = {};
        try { doc = text ? JSON.parse(text) : {}; } catch (e) { doc = { message: text }; }
        if (!resp.ok) { throw new Error(resp.status + " " + (doc.message || resp.statusText)); }
        return doc;
      });
    });
  }

  // -- actions
  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest ? ev.target.closest("button.action") : null;
    if (!btn) return;
    var question = btn.getAttribute("data-confirm");
    if (question && !window.confirm(question)) return;
    btn.disabled = true;
    request(btn.getAttribute("data-method"), btn.getAttribute("data-url"), btn.getAttribute("data-body"))
      .then(function (doc) {
        if (doc.message) { flash(doc.message, false); }
        var next = btn.getAttribute("data-next");
        if (next) { window.location.href = next; } else { window.location.reload(); }
      }, function (err) { btn.disabled = false; flash(err.message, false); });
  });

  var form = document.getElementById("create-form");
  if (form) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var doc = { topic: form.topic.value.trim() };
      if (form.channel.value.trim()) doc.channel = form.channel.value.trim();
      request("POST", form.querySelector("button").getAttribute("data-url"), doc).then(function () {
        window.location.href = base + "/topics/" + encodeURIComponent(doc.topic);
      }, function (err) { flash(err.message, false); });
    });
  }

  // -- charts: the last minutes, kept in the page
  var HISTORY = 150; // points (5 minutes at one per 2 s)

  function Series(title, rate) { this.title = title; this.rate = rate; this.points = []; this.last = null; }
  Series.prototype.add = function (t, value) {
    var v = value;
    if (this.rate) {
      var prev = this.last;
      this.last = { t: t, v: value };
      if (!prev || t <= prev.t) return;
      v = Math.max(0, (value - prev.v) / ((t - prev.t) / 1000));
    }
    this.points.push({ t: t, v: v });
    if (this.points.length > HISTORY) this.points.shift();
  };

  function drawChart(container, s) {
    // x is time: the chart spans from its first point (at most 5 minutes ago) to now
    var w = 260, h = 54, pts = s.points;
    var max = 1;
    pts.forEach(function (p) { if (p.v > max) max = p.v; });
    var t1 = pts.length ? pts[pts.length - 1].t : 0;
    var t0 = pts.length ? Math.max(pts[0].t, t1 - 300000) : 0;
    var span = Math.max(t1 - t0, 1);
    var coords = pts.filter(function (p) { return p.t >= t0; }).map(function (p) {
      var x = pts.length < 2 ? w : ((p.t - t0) / span) * w;
      return x.toFixed(1) + "," + (h - 2 - (p.v / max) * (h - 4)).toFixed(1);
    }).join(" ");
    var current = pts.length ? pts[pts.length - 1].v : 0;
    var shown = s.rate ? current.toFixed(1) + "/s" : String(Math.round(current));
    var secs = Math.round(span / 1000);
    var period = secs >= 60 ? Math.floor(secs / 60) + "m" + (secs %% 60 ? (secs %% 60) + "s" : "") : secs + "s";
    container.innerHTML = '<div class="title"><span>' + s.title + '</span><span class="value">' + shown +
      '</span></div><svg width="' + w + '" height="' + h + '" viewBox="0 0 ' + w + " " + h +
      '"><polyline points="' + coords + '"/></svg><div class="title"><span>max ' +
      (s.rate ? max.toFixed(1) + "/s" : Math.round(max)) + "</span><span>last " + period + "</span></div>";
  }

  function sum(list, f) { var n = 0; (list || []).forEach(function (x) { n += f(x) || 0; }); return n; }

  var EXTRACT = {
    topic: [
      ["publish", true, function (d) { return d.message_count; }],
      ["finish", true, function (d) {
        return sum(d.channels, function (c) { return sum(c.clients, function (cl) { return cl.finish_count; }); });
      }],
      ["topic depth", false, function (d) { return d.depth; }],
      ["channels depth", false, function (d) { return sum(d.channels, function (c) { return c.depth; }); }]
    ],
    channel: [
      ["received", true, function (d) { return d.message_count; }],
      ["finish", true, function (d) { return sum(d.clients, function (cl) { return cl.finish_count; }); }],
      ["depth", false, function (d) { return d.depth; }],
      ["in-flight", false, function (d) { return d.in_flight_count; }]
    ],
    counter: [
      ["processed", true, function (d) {
        var n = 0; Object.keys(d.stats || {}).forEach(function (k) { n += d.stats[k].message_count; }); return n;
      }]
    ]
  };

  function startCharts(kind, api) {
    var holder = document.getElementById("charts");
    if (!holder || !EXTRACT[kind]) return;
    var series = EXTRACT[kind].map(function (e) { return new Series(e[0], e[1]); });
    var boxes = series.map(function () {
      var div = document.createElement("div"); div.className = "chart"; holder.appendChild(div); return div;
    });
    function tick() {
      request("GET", api).then(function (doc) {
        var t = Date.now();
        EXTRACT[kind].forEach(function (e, i) { series[i].add(t, e[2](doc)); drawChart(boxes[i], series[i]); });
        if (kind === "counter") {
          var total = document.getElementById("counter-total");
          var n = EXTRACT.counter[0][2](doc);
          if (total) total.textContent = n.toLocaleString();
          var rate = document.getElementById("counter-rate");
          var pts = series[0].points;
          if (rate && pts.length) rate.textContent = pts[pts.length - 1].v.toFixed(1) + " msgs/s";
        }
      }, function () {}).then(function () { setTimeout(tick, %(poll)d); });
    }
    tick();
  }

  // -- the inside view of one broker
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  var SHOWN = 8; // messages drawn per list (the document has up to list_limit)

  function msgList(msgs, total, render) {
    if (!total) return '<ul class="msgs"><li class="due">none</li></ul>';
    var shown = msgs.slice(0, SHOWN);
    var more = total > shown.length ? '<li class="due">... and ' + (total - shown.length) + " more</li>" : "";
    return '<ul class="msgs">' + shown.map(render).join("") + more + "</ul>";
  }

  function backendStage(b) {
    if (!b || b.kind === "DiscardBackend") {
      return '<div class="stage disk"><h3>Backend</h3><div>ephemeral: nothing goes to disk</div></div>';
    }
    if (b.read_file_num === undefined) {
      return '<div class="stage disk"><h3>Backend</h3><div class="big">' + b.depth + "</div><div>" +
        esc(b.kind) + "</div></div>";
    }
    return '<div class="stage disk"><h3>Disk queue</h3><div class="big">' + b.depth + "</div>" +
      "<div>read file " + b.read_file_num + " @ " + b.read_pos + "</div>" +
      "<div>write file " + b.write_file_num + " @ " + b.write_pos + "</div>" +
      "<div>" + b.ops_since_sync + " ops since fsync" + (b.need_sync ? " (sync due)" : "") + "</div></div>";
  }

  function memoryStage(title, depth, cap, msgs) {
    var pct = cap ? Math.min(100, (100 * depth) / cap) : 0;
    return '<div class="stage memory"><h3>' + title + '</h3><div class="big">' + depth + "</div>" +
      '<div class="bar" title="of --mem-queue-size ' + cap + '"><span style="width:' + pct + '%%"></span></div>' +
      msgList(msgs, depth, function (m) { return "<li>" + esc(m.id) + " " + esc(m.body) + "</li>"; }) + "</div>";
  }

  function renderInside(doc) {
    var cap = doc.mem_queue_size;
    var html = "";
    if (!doc.topics.length) html += '<p class="help">No topics yet: publish a message (POST /pub?topic=...).</p>';
    doc.topics.forEach(function (t) {
      html += '<section class="topic-box" data-topic="' + esc(t.name) + '"><h2>topic ' + esc(t.name) +
        (t.paused ? ' <span class="badge">paused</span>' : "") + '</h2><div class="flow">' +
        memoryStage("memory queue", t.memory_depth, cap, t.memory) + backendStage(t.backend) +
        '<div class="stage"><h3>published</h3><div class="big">' + t.message_count + "</div><div>" +
        t.message_bytes + " bytes</div></div></div>";
      if (!t.channels.length) html += '<p class="help">No channel: messages wait in the topic.</p>';
      t.channels.forEach(function (c) {
        html += '<div class="channel-box" data-channel="' + esc(c.name) + '"><h3 class="cname">channel ' +
          esc(c.name) + (c.paused ? ' <span class="badge">paused</span>' : "") + '</h3><div class="flow">' +
          memoryStage("memory queue", c.memory_depth, cap, c.memory) + backendStage(c.backend) +
          '<div class="stage inflight"><h3>in flight</h3><div class="big" data-field="in_flight_count">' +
          c.in_flight_count + "</div>" +
          msgList(c.in_flight, c.in_flight_count, function (m) {
            return "<li>" + esc(m.id) + " client " + m.client_id + " try " + m.attempts + ' <span class="' +
              (m.deadline_in_ms < 0 ? "late" : "due") + '">times out in ' + (m.deadline_in_ms / 1000).toFixed(1) +
              "s</span> " + esc(m.body) + "</li>";
          }) + "</div>" +
          '<div class="stage deferred"><h3>deferred</h3><div class="big" data-field="deferred_count">' +
          c.deferred_count + "</div>" +
          msgList(c.deferred, c.deferred_count, function (m) {
            return "<li>" + esc(m.id) + " try " + m.attempts + ' <span class="due">due in ' +
              (m.due_in_ms / 1000).toFixed(1) + "s</span> " + esc(m.body) + "</li>";
          }) + "</div>" +
          '<div class="stage"><h3>done</h3><div>received <b data-field="message_count">' + c.message_count +
          "</b></div><div>requeued <b>" + c.requeue_count + "</b></div><div>timed out <b data-field=" +
          '"timeout_count">' + c.timeout_count + "</b></div></div></div>";
        html += '<table class="stats clients"><thead><tr><th>client</th><th>address</th><th>RDY</th>' +
          "<th>in flight</th><th>delivered</th><th>finished</th><th>requeued</th><th>msg timeout</th>" +
          "</tr></thead><tbody>" + (c.clients.length ? c.clients.map(function (cl) {
            return "<tr><td>" + cl.id + " " + esc(cl.hostname || cl.client_id) + " " + esc(cl.user_agent) +
              "</td><td>" + esc(cl.remote_address) + '</td><td data-field="ready_count">' + cl.ready_count +
              "</td><td>" + cl.in_flight_count + "</td><td>" + cl.message_count + "</td><td>" + cl.finish_count +
              "</td><td>" + cl.requeue_count + "</td><td>" + (cl.msg_timeout_ms / 1000) + "s</td></tr>";
          }).join("") : '<tr><td colspan="8" class="none">no subscriber</td></tr>') + "</tbody></table></div>";
      });
      html += "</section>";
    });
    html += '<h2>Threads of the broker process (' + doc.threads.length + ')</h2>' +
      '<table class="stats threads"><thead><tr><th>thread</th><th>waiting in (our code)</th><th>innermost frame' +
      "</th></tr></thead><tbody>" + doc.threads.map(function (th) {
        return "<tr><td>" + esc(th.name) + "</td><td>" + esc(th.waiting_in) + "</td><td>" + esc(th.top) +
          "</td></tr>";
      }).join("") + "</tbody></table>";
    document.getElementById("inside").innerHTML = html;
  }

  function startInside(api) {
    var live = document.getElementById("live");
    function tick() {
      request("GET", api).then(function (doc) {
        renderInside(doc);
        if (live) { live.textContent = "live " + new Date().toLocaleTimeString(); live.className = "live ok"; }
      }, function (err) {
        if (live) { live.textContent = "not answering: " + err.message; live.className = "live bad"; }
      }).then(function () { setTimeout(tick, 1000); });
    }
    tick();
  }

  // -- the server-rendered tables follow too: the page itself is fetched again and its
  // #tables and #warnings are swapped in (one renderer, the server's)
  function startTables() {
    var tables = document.getElementById("tables");
    if (!tables || !window.DOMParser) return;
    function tick() {
      fetch(window.location.href, { headers: { "Accept": "text/html" } }).then(function (resp) {
        if (!resp.ok) throw new Error(resp.status);
        return resp.text();
      }).then(function (text) {
        var doc = new DOMParser().parseFromString(text, "text/html");
        ["tables", "warnings"].forEach(function (id) {
          var fresh = doc.getElementById(id), old = document.getElementById(id);
          if (fresh && old) old.innerHTML = fresh.innerHTML;
        });
      }, function () {}).then(function () { setTimeout(tick, %(poll)d); });
    }
    setTimeout(tick, %(poll)d);
  }

  startTables();
  var kind = body.getAttribute("data-kind");
  var api = body.getAttribute("data-api");
  if (kind === "inside") { startInside(api); } else if (kind && api) { startCharts(kind, api); }
})();
""".replace("%(poll)d", str(POLL_MS)).replace("%%", "%")

FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" '
    'fill="#18222e"/><path d="M3 12V4l5 8V4M10 4h3v8h-3" stroke="#2d6cdf" stroke-width="1.6" fill="none"/></svg>'
)

ASSETS = {
    "favicon.svg": ("image/svg+xml", FAVICON),
    "admin.css": ("text/css; charset=utf-8", CSS),
    "admin.js": ("text/javascript; charset=utf-8", JS),
}
