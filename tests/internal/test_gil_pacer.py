"""GILPacer: a long walk sleeps (hands the GIL over) once per PACE_INTERVAL of walking, not at every tick."""

import time
import types

from nsqd_threaded.internal import gil


def test_the_pacer_sleeps_once_per_interval_of_walking(monkeypatch):
    sleeps = []
    monkeypatch.setattr(gil, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleeps.append))
    pacer = gil.GILPacer()
    for _ in range(1000):
        pacer.tick()  # a quick walk: well under an interval
    assert len(sleeps) <= 2  # (a descheduled test may cross one or two intervals)
    walked = 0
    started = time.monotonic()
    # At least 100 ticks as well: a test descheduled for the whole span would otherwise tick none.
    while time.monotonic() - started < 10 * gil.PACE_INTERVAL or walked < 100:
        pacer.tick()
        walked += 1
    assert sleeps and all(s == 0 for s in sleeps)
    assert len(sleeps) <= 12 < walked  # about one per interval, not one per tick
