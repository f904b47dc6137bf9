"""What nsq_to_http and nsq_to_nsq share: picking the destination of each message and timing the requests.

``--mode`` is Go's: ``round-robin`` takes the destinations in turn;
``hostpool`` (the default) is go-hostpool's standard pool, round robin over
the destinations that are not marked failed (a failed one is retried after
30 s, then 60 s ... at most 900 s; when all are failed they are all tried
again); ``epsilon-greedy`` is go-hostpool's epsilon-greedy pool, which sends
most requests to the destinations that answered fastest over the last five
minutes and explores the others (30 % of the time at first, decaying to 1 %).

:class:`TimerMetrics` is Go's timer_metrics: every ``--status-every``
requests it logs the count, the 99th and 95th percentiles and the average.
"""

import math
import random
import threading
import time

# go-hostpool's constants
INITIAL_RETRY_DELAY = 30.0
MAX_RETRY_INTERVAL = 900.0
EPSILON_BUCKETS = 120
EPSILON_DECAY = 0.90  # the exploration rate shrinks by this at each exploration
MIN_EPSILON = 0.01
INITIAL_EPSILON = 0.3
DECAY_DURATION = 300.0  # the response times weigh over five minutes, in EPSILON_BUCKETS buckets


class _Host:
    __slots__ = ("host", "dead", "retry_delay", "next_retry", "counts", "values", "index", "value")

    def __init__(self, host):
        self.host = host
        self.dead = False
        self.retry_delay = INITIAL_RETRY_DELAY
        self.next_retry = 0.0
        self.counts = [0] * EPSILON_BUCKETS  # epsilon-greedy: responses per bucket
        self.values = [0] * EPSILON_BUCKETS  # and their total milliseconds
        self.index = 0
        self.value = 0.0

    def can_try(self, now):
        return not self.dead or self.next_retry < now

    def will_retry(self, now):
        self.retry_delay = min(self.retry_delay * 2, MAX_RETRY_INTERVAL)
        self.next_retry = now + self.retry_delay

    def weighted_response_ms(self):
        """go-hostpool's weighted average: recent buckets weigh more; an empty bucket repeats the last value."""
        value = last = 0.0
        for i in range(1, EPSILON_BUCKETS + 1):
            pos = (self.index + i) % EPSILON_BUCKETS
            weight = i / EPSILON_BUCKETS
            if self.counts[pos] > 0:
                last = self.values[pos] / self.counts[pos]
            value += last * weight
        return value


class Choice:
    """One pick of a pool: ``host``; :meth:`mark` (once) reports how the request went."""

    __slots__ = ("pool", "host", "started", "_marked")

    def __init__(self, pool, host):
        self.pool = pool
        self.host = host
        self.started = time.monotonic()
        self._marked = False

    def mark(self, error=None):
        """``error`` None: the destination answered; otherwise it failed.  Only the first call counts."""
        if self._marked:
            return
        self._marked = True
        self.pool._mark(self, error is None, time.monotonic())


class HostPool:
    """go-hostpool's standard pool.  ``_lock`` guards every host's state and ``_next``."""

    def __init__(self, hosts, clock=time.monotonic):
        if not hosts:
            raise ValueError("a host pool needs at least one host")
        self.hosts = [_Host(h) for h in hosts]
        self._by_name = {h.host: h for h in self.hosts}
        self._next = 0
        self._clock = clock
        self._lock = threading.Lock()

    def get(self):
        """The next destination (a :class:`Choice`)."""
        with self._lock:
            return Choice(self, self._round_robin(self._clock()))

    def _round_robin(self, now):
        count = len(self.hosts)
        for i in range(count):
            index = (i + self._next) % count
            h = self.hosts[index]
            if not h.dead:
                self._next = index + 1
                return h.host
            if h.next_retry < now:
                h.will_retry(now)
                self._next = index + 1
                return h.host
        for h in self.hosts:  # all failed: try them all again
            h.dead = False
        self._next = 0
        return self.hosts[0].host

    def _mark(self, choice, ok, now):
        with self._lock:
            h = self._by_name[choice.host]
            if ok:
                h.dead = False
            elif not h.dead:
                h.dead = True
                h.retry_delay = INITIAL_RETRY_DELAY
                h.next_retry = self._clock() + h.retry_delay


class EpsilonGreedyHostPool(HostPool):
    """go-hostpool's epsilon-greedy pool (with its linear value: 1 / the weighted response time).

    go-hostpool moves the buckets on with a ticker every ``DECAY_DURATION / 120``
    seconds; here they move on when the pool is used, by as many buckets as
    ticks have passed (no thread), which is the same for every pick.
    """

    def __init__(self, hosts, clock=time.monotonic, rng=None):
        super().__init__(hosts, clock)
        self.epsilon = INITIAL_EPSILON
        self._random = rng or random.Random()
        self._tick = DECAY_DURATION / EPSILON_BUCKETS
        self._last_decay = clock()

    def _decay(self, now):
        ticks = int((now - self._last_decay) / self._tick)
        if ticks <= 0:
            return
        self._last_decay += ticks * self._tick
        for h in self.hosts:
            for _ in range(min(ticks, EPSILON_BUCKETS)):
                h.index = (h.index + 1) % EPSILON_BUCKETS
                h.counts[h.index] = 0
                h.values[h.index] = 0

    def get(self):
        with self._lock:
            now = self._clock()
            self._decay(now)
            return Choice(self, self._epsilon_greedy(now))

    def _epsilon_greedy(self, now):
        if self._random.random() < self.epsilon:
            self.epsilon = max(self.epsilon * EPSILON_DECAY, MIN_EPSILON)
            return self._round_robin(now)
        possible, total = [], 0.0
        for h in self.hosts:
            if h.can_try(now):
                v = h.weighted_response_ms()
                if v > 0:
                    h.value = 1.0 / v
                    total += h.value
                    possible.append(h)
        chosen = None
        pick, ceiling = self._random.random(), 0.0
        for h in possible:
            ceiling += h.value / total
            if pick <= ceiling:
                chosen = h
                break
        if chosen is None:
            return self._round_robin(now)
        if chosen.dead:
            chosen.will_retry(now)
        return chosen.host

    def _mark(self, choice, ok, now):
        super()._mark(choice, ok, now)
        if ok:
            with self._lock:
                self._decay(now)
                h = self._by_name[choice.host]
                h.counts[h.index] += 1
                h.values[h.index] += int((now - choice.started) * 1000)


class RoundRobin:
    """``--mode=round-robin``: the destinations in turn (Go starts at the second).  ``_lock`` guards ``_counter``."""

    def __init__(self, hosts):
        self.hosts = list(hosts)
        self._counter = 0
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            self._counter += 1
            return Choice(self, self.hosts[self._counter % len(self.hosts)])

    def _mark(self, choice, ok, now):
        pass


def pool_for(mode, hosts):
    """The pool ``--mode`` asks for (None for a mode Go does not name: the tool's own fallback)."""
    if mode == "round-robin":
        return RoundRobin(hosts)
    if mode == "hostpool":
        return HostPool(hosts)
    if mode == "epsilon-greedy":
        return EpsilonGreedyHostPool(hosts)
    return None


class TimerMetrics:
    """Go's timer_metrics: every ``status_every`` durations, log ``PREFIX finished N - 99th: ... - avg: ...``.

    The window is the last ``status_every`` durations; the line is logged when
    the next one arrives past a full window.  ``status_every`` 0 disables it.
    ``_lock`` guards ``_timings`` and ``_position``.
    """

    def __init__(self, status_every, prefix, log):
        self.status_every = status_every
        self.prefix = prefix
        self.log = log
        self._timings = []
        self._position = 0
        self._lock = threading.Lock()
        if 0 < status_every < 100:
            log.warn("Warning: use more than 100 status values for accurate percentiles (configured with %d)",
                     status_every)

    def status(self, started):
        """Record the time since ``started`` (a ``time.monotonic()``)."""
        if self.status_every == 0:
            return
        duration = time.monotonic() - started
        with self._lock:
            self._position += 1
            looped = self._position > self.status_every
            if looped:
                self._position = 1
            if self._position > len(self._timings):
                self._timings.append(duration)
            else:
                self._timings[self._position - 1] = duration
            if not looped:
                return
            timings = sorted(self._timings)
        self.log.info("%s", stats_line(self.prefix, timings))


def _percentile(percent, timings):
    if not timings:
        return 0.0
    index = int(math.ceil(percent / 100.0 * len(timings) + 0.5))
    return timings[min(index, len(timings) - 1)]


def stats_line(prefix, timings):
    """timer_metrics' line for sorted durations (seconds)."""
    avg = sum(timings) / len(timings) if timings else 0.0
    return "%s finished %d - 99th: %.2fms - 95th: %.2fms - avg: %.2fms" % (
        prefix, len(timings), _percentile(99.0, timings) * 1000, _percentile(95.0, timings) * 1000, avg * 1000)
