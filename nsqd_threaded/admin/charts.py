"""nsqadmin's charts of a topic or channel, drawn by the server: inline SVG in the page itself.

A page fetched once (a screenshot, a browser without script, a terminal
browser's dump) already shows them: message rate, depth and messages in
flight over up to the last hour (:mod:`.sampler` keeps it), each with its
axes (the value scale on the left, minutes ago along the bottom), the value
now and the highest shown.  The page's script only fetches the page again
and moves the fresh charts in, as it does the tables.

Every element is made with :mod:`.markup`'s builder (``el``), which escapes
every value and refuses inline styles and event handlers, so the charts
obey the pages' Content-Security-Policy; what a node sent reaches them only
as numbers checked here (anything else is a gap in the line).
"""

from .markup import el, frag

# (the column of the samples, the chart's title, whether it is a rate per second)
SERIES = (("message_rate", "message rate", True), ("depth", "depth", False), ("in_flight", "in flight", False))

WIDTH, HEIGHT = 360, 130  # the SVG's user units (its viewBox): the plot and its axes' labels
LEFT, RIGHT, TOP, BOTTOM = 46, 8, 8, 20  # room around the plot for the labels
MIN_SPAN_MS = 5 * 60 * 1000  # a chart spans at least five minutes (the samples may cover less)
MAX_SPAN_MS = 60 * 60 * 1000  # and at most an hour
GAP = 2.5  # a step between two samples longer than this many expected steps breaks the line
TICK_STEPS_MIN = (1, 2, 5, 10, 15, 20, 30)  # minutes between two ticks of the time axis


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def value_text(v, rate):
    """A figure as a chart shows it: ``12.5/s`` for a rate, ``1,234`` for a count, ``-`` for none."""
    if v is None:
        return "-"
    if rate:
        return ("%.1f/s" % v) if v < 1000 else "{:,.0f}/s".format(v)
    return "{:,}".format(int(round(v)))


def nice_ceiling(v):
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``v`` (1 at least): the scale's top."""
    if v <= 1:
        return 1
    power = 1
    while power * 10 < v:
        power *= 10
    for m in (1, 2, 2.5, 5, 10):
        if m * power >= v:
            top = m * power
            return int(top) if top == int(top) else top
    return 10 * power


def _scale_text(v, rate):
    text = ("%g" % v) if isinstance(v, float) else "{:,}".format(v)
    return text + ("/s" if rate else "")


def _minutes_text(ms):
    minutes = int(round(ms / 60000.0))
    return "now" if minutes == 0 else "-%dm" % minutes


def chart(key, title, rate, times, values, recent_from, interval_ms, hour_step_ms, now_ms):
    """One chart (``<div class="chart">``): its title and value now, the SVG plot with axes, the scale's top
    and the span shown.  ``times``/``values`` are a column of the samples (see :meth:`.Sampler.series`)."""
    points = [(t, v if _number(v) else None) for t, v in zip(times, values) if isinstance(t, int)
              and not isinstance(t, bool)]
    end = max(now_ms, points[-1][0]) if points else now_ms
    start = end - min(MAX_SPAN_MS, max(MIN_SPAN_MS, end - points[0][0] if points else 0))
    shown = [(t, v) for t, v in points if t >= start]
    known = [v for _, v in shown if v is not None]
    top = nice_ceiling(max(known) if known else 0)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t):
        return LEFT + (t - start) * plot_w / float(end - start)

    def y(v):
        return TOP + plot_h - (v * plot_h / float(top))

    parts = []
    # The value scale: 0, half and the top, with a grid line each.
    for v in (0, top / 2.0 if top % 2 else top // 2, top):
        py = "%.1f" % y(v)
        parts.append(el("line", {"class": "grid", "x1": LEFT, "x2": WIDTH - RIGHT, "y1": py, "y2": py}))
        parts.append(el("text", {"class": "y-label", "x": LEFT - 4, "y": "%.1f" % (y(v) + 3.5),
                                 "text-anchor": "end"}, _scale_text(v, rate)))
    # The time axis: ticks at whole minutes ago, no more than six.
    span_min = (end - start) / 60000.0
    step = next((s for s in TICK_STEPS_MIN if span_min / s <= 6), 60)
    for minutes in range(0, int(span_min) + 1, step):
        px = "%.1f" % x(end - minutes * 60000)
        parts.append(el("line", {"class": "tick", "x1": px, "x2": px, "y1": TOP + plot_h, "y2": TOP + plot_h + 4}))
        parts.append(el("text", {"class": "x-label", "x": px, "y": HEIGHT - 4,
                                 "text-anchor": "end" if minutes == 0 else "middle"}, _minutes_text(minutes * 60000)))
    parts.append(el("line", {"class": "axis", "x1": LEFT, "x2": LEFT, "y1": TOP, "y2": TOP + plot_h}))
    parts.append(el("line", {"class": "axis", "x1": LEFT, "x2": WIDTH - RIGHT, "y1": TOP + plot_h,
                             "y2": TOP + plot_h}))
    # The line: broken where a sample is missing, has no value, or the next comes late.
    lines, line, previous = [], [], None
    for t, v in shown:
        expected = hour_step_ms if recent_from is not None and t < recent_from else interval_ms
        if v is None or (previous is not None and expected and t - previous > GAP * expected):
            if line:
                lines.append(line)
            line = []
        if v is not None:
            line.append("%.1f,%.1f" % (x(t), y(v)))
        previous = t
    if line:
        lines.append(line)
    for line in lines:
        if len(line) == 1:  # (one point alone: a dot, so that it shows)
            cx, cy = line[0].split(",")
            parts.append(el("circle", {"class": "dot", "cx": cx, "cy": cy, "r": "1.5"}))
        else:
            parts.append(el("polyline", {"points": " ".join(line)}))

    current = known[-1] if known else None
    span_text = "last %dm" % max(1, int(round((end - start) / 60000.0)))
    summary = "%s, %s: now %s, at most %s" % (title, span_text, value_text(current, rate),
                                              value_text(max(known) if known else None, rate))
    plot = el("svg", {"class": "plot", "viewbox": "0 0 %d %d" % (WIDTH, HEIGHT), "width": WIDTH,
                      "height": HEIGHT, "role": "img", "aria-label": summary},
              el("title", None, summary), parts)
    return el("div", {"class": "chart", "data-series": key, "data-samples": len(points)},
              el("div", {"class": "title"}, el("span", None, title),
                 el("span", {"class": "value"}, value_text(current, rate))),
              plot,
              el("div", {"class": "title"}, el("span", None, "scale to %s" % _scale_text(top, rate)),
                 el("span", None, span_text)))


def charts(doc, now_ms):
    """The three charts of a topic's or channel's samples (the document ``GET /api/charts/...`` answers)."""
    interval_ms = doc.get("interval_ms") or 0
    hour_step_ms = doc.get("hour_step_ms") or 0
    return frag([chart(key, title, rate, doc.get("time") or [], doc.get(key) or [], doc.get("recent_from"),
                       interval_ms, hour_step_ms, now_ms) for key, title, rate in SERIES])
