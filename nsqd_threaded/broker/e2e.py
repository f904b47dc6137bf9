"""End-to-end processing latency: a sliding-window percentile estimator per channel.

nsqd keeps two half-window CKMS streams per channel and merges them on query.
Here each half-window is a uniform reservoir of at most RESERVOIR samples
(Vitter's algorithm R) plus the exact count: bounded memory at any rate, and
percentiles within a few percent, which is what the spec asks of a port.
"""

import random
import threading
import time

RESERVOIR = 1024


class _Bucket:
    __slots__ = ("samples", "count")

    def __init__(self):
        self.samples = []
        self.count = 0

    def add(self, value):
        self.count += 1
        if len(self.samples) < RESERVOIR:
            self.samples.append(value)
        else:
            i = random.randrange(self.count)
            if i < RESERVOIR:
                self.samples[i] = value


class E2ELatency:
    """``_lock`` guards both buckets and the rotation time (FINs come from many threads).

    ``clock``: monotonic seconds, the broker's (:class:`~nsqd_threaded.internal.clock.Clock`)."""

    def __init__(self, quantiles, window_seconds, clock=time.monotonic):
        self.quantiles = list(quantiles)
        self.enabled = bool(self.quantiles)  # (an attribute: read on every FIN)
        self._half = window_seconds / 2.0
        self._clock = clock
        self._lock = threading.Lock()  # guards both buckets and the rotation time
        self._current = _Bucket()
        self._previous = _Bucket()
        self._rotate_at = clock() + self._half

    def _rotate_locked(self):
        now = self._clock()
        if now >= self._rotate_at + self._half:
            # Two half-windows or more went by (a skipped clock may jump a year): both are empty.
            self._previous, self._current = _Bucket(), _Bucket()
            self._rotate_at += ((now - self._rotate_at) // self._half) * self._half
        while now >= self._rotate_at:
            self._previous, self._current = self._current, _Bucket()
            self._rotate_at += self._half

    def add(self, value_ns):
        if not self.quantiles:
            return
        with self._lock:
            self._rotate_locked()
            self._current.add(value_ns)

    def _buckets(self):
        with self._lock:
            self._rotate_locked()
            return [self._current, self._previous]

    def query(self):
        """``(count, [value per quantile])``."""
        return self.merged_query([self])

    def merged_query(self, estimators):
        buckets = [b for e in estimators for b in e._buckets()]
        count = sum(b.count for b in buckets)
        # Weight each bucket's reservoir by how many samples it stands for.
        weighted = []
        for b in buckets:
            if b.samples:
                w = b.count / len(b.samples)
                weighted.extend((v, w) for v in b.samples)
        weighted.sort()
        values = []
        total = sum(w for _, w in weighted)
        for q in self.quantiles:
            if not weighted:
                values.append(0.0)
                continue
            target = q * total
            acc = 0.0
            chosen = weighted[-1][0]
            for v, w in weighted:
                acc += w
                if acc >= target:
                    chosen = v
                    break
            values.append(float(chosen))
        return count, values
