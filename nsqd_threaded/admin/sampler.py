"""nsqadmin's own samples of the cluster: what the topic and channel pages chart.

Go nsqadmin draws its rate graphs from graphite, which the brokers feed
through statsd.  Graphite is not built here (``--graphite-url`` is refused),
so nsqadmin samples the cluster itself: one thread, ``nsqadmin-sampler``
(owned by :class:`Sampler`, started and joined with the app), asks every
node's ``/stats`` (without clients) every ``--chart-sample-interval`` and keeps, per
topic and per channel, a ring of the last :data:`SAMPLES` samples, and an hour's
history at a coarser step (:data:`HOUR_POINTS` points, one per :data:`HOUR_STEP`
seconds: the mean message rate since the last one, the depth and the messages in
flight as the sample found them), so that a chart spans an hour in bounded memory.  A sample
is totalled over the nodes that answered: the message rate (messages per
second since the previous sample, summed over the nodes that were in both),
the depth and the messages in flight.  A node that does not answer leaves
its share out of that sample; a sample nobody answered is not taken (the
chart shows a gap).

The rings are read by ``GET /api/charts/<topic>[/<channel>]``
(:meth:`Sampler.series`) and drawn by the pages themselves (:mod:`.charts`).  Nothing is kept on
disk: the history starts when nsqadmin does.
"""

import collections
import threading
import time

SAMPLES = 150  # per topic and per channel: five minutes at the default interval
HOUR_STEP = 30.0  # seconds between two points of the hour's history
HOUR_POINTS = 121  # the hour's history, per topic and per channel (both ends of the hour)


class _Rings:
    """One topic's or channel's samples: the recent ones (``recent``), the hour's history (``hour``), and
    the message rates since the last point of the hour (``rate_sum``, ``rate_count``) that its next one
    averages.  Guarded by the Sampler's ``_lock``."""

    __slots__ = ("recent", "hour", "rate_sum", "rate_count")

    def __init__(self):
        self.recent = collections.deque(maxlen=SAMPLES)
        self.hour = collections.deque(maxlen=HOUR_POINTS)
        self.rate_sum = 0.0
        self.rate_count = 0

    def add(self, sample, step_ms):
        """Add a sample ``(time ms, rate or None, depth, in flight)``; a point of the hour every ``step_ms``."""
        self.recent.append(sample)
        stamp, rate, depth, in_flight = sample
        if rate is not None:
            self.rate_sum += rate
            self.rate_count += 1
        if not self.hour or stamp - self.hour[-1][0] >= step_ms:
            mean = round(self.rate_sum / self.rate_count, 3) if self.rate_count else None
            self.hour.append((stamp, mean, depth, in_flight))
            self.rate_sum, self.rate_count = 0.0, 0
MAX_SERIES = 2000  # topics and channels followed at once; more are not sampled (a bound on memory)


class Sampler:
    """Samples ``cluster`` (a :class:`~.cluster.ClusterInfo`) every ``interval`` seconds on its own thread."""

    def __init__(self, cluster, interval, log, wall_clock=time.time):
        self.cluster = cluster
        self.interval = interval
        self.log = log
        self._wall_clock = wall_clock
        self._lock = threading.Lock()  # guards _series (the sampler writes, HTTP threads read)
        self._series = {}  # (topic, channel or "") -> _Rings of (time ms, message rate or None, depth, in flight)
        self._counts = {}  # (node, topic, channel or "") -> (time s, message_count) of the last sample (sampler only)
        self._stopping = threading.Event()  # set by stop(): the thread leaves at its next wait
        self._thread = threading.Thread(target=self._run, name="nsqadmin-sampler")

    def start(self):
        self._thread.start()

    def stop(self):
        """Tell the thread to leave and join it (a sample under way finishes first: bounded by the client timeouts)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self):
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self.sample()
            except Exception as e:  # a bug here must not end the charts for good; the next tick tries again
                self.log.error("chart sampler: %s: %s", type(e).__name__, e)
            self._stopping.wait(max(0.0, self.interval - (time.monotonic() - started)))

    # -- one sample

    def sample(self):
        """Ask every node once and add one sample to each topic's and channel's ring."""
        producers, _ = self.cluster.producers()
        per_node, gathered = self.cluster.nsqd_stats(producers, clients=False)
        if not gathered.results:
            return
        now = self._wall_clock()
        counts = {}
        totals = {}  # series key -> [rate or None, depth, in flight]

        def add(key, node, message_count, depth, in_flight):
            total = totals.setdefault(key, [None, 0, 0])
            rate = self._rate(counts, (node,) + key, now, message_count)
            if rate is not None:
                total[0] = (total[0] or 0.0) + rate
            total[1] += depth
            total[2] += in_flight

        for t in per_node:
            name = t["topic_name"]
            add((name, ""), t["node"], t["message_count"], t["depth"], sum(c["in_flight_count"] for c in t["channels"]))
            for c in t["channels"]:
                add((name, c["channel_name"]), c["node"], c["message_count"], c["depth"], c["in_flight_count"])
        self._counts = counts
        stamp = int(now * 1000)
        step_ms = int(max(HOUR_STEP, self.interval) * 1000)
        horizon = stamp - HOUR_POINTS * step_ms
        with self._lock:
            for key, (rate, depth, in_flight) in totals.items():
                rings = self._series.get(key)
                if rings is None:
                    if len(self._series) >= MAX_SERIES:
                        continue
                    rings = self._series[key] = _Rings()
                rings.add((stamp, None if rate is None else round(rate, 3), depth, in_flight), step_ms)
            for key in [k for k, rings in self._series.items() if rings.recent[-1][0] < horizon]:
                del self._series[key]  # gone from every node for longer than a chart spans

    def _rate(self, counts, key, now, message_count):
        """Messages per second at one node since the last sample (None: no earlier figure, or the count went back)."""
        counts[key] = (now, message_count)
        before = self._counts.get(key)
        if before is None or now <= before[0] or message_count < before[1]:
            return None
        return (message_count - before[1]) / (now - before[0])

    # -- reading

    def series(self, topic, channel=""):
        """A topic's (or a channel's) samples as columns, oldest first: the hour's points older than the
        recent samples, then those.  ``time`` (ms since the epoch), ``message_rate`` (per second; None for a
        sample without an earlier one to compare), ``depth``, ``in_flight``; ``recent_from``: the time of
        the first recent sample (None: none yet), before which the points are :data:`HOUR_STEP` apart."""
        with self._lock:
            rings = self._series.get((topic, channel))
            recent = list(rings.recent) if rings is not None else []
            first = recent[0][0] if recent else None
            samples = [s for s in rings.hour if s[0] < first] + recent if recent else []
        return {
            "time": [s[0] for s in samples],
            "message_rate": [s[1] for s in samples],
            "depth": [s[2] for s in samples],
            "in_flight": [s[3] for s in samples],
            "recent_from": first,
        }
