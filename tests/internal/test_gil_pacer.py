"""GILPacer: a long walk sleeps (hands the GIL over) once per PACE_INTERVAL of walking, not at every tick."""

import types

from nsqd_threaded.internal import gil


def test_the_pacer_sleeps_once_per_interval_of_walking(monkeypatch):
    """On a clock the test moves (real time would make it depend on how the machine schedules it)."""
    now = [1000.0]
    sleeps = []
    monkeypatch.setattr(gil, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=sleeps.append))
    pacer = gil.GILPacer()
    for _ in range(1000):
        pacer.tick()  # a quick walk: no time passes
    assert sleeps == []
    for _ in range(100):  # ten intervals of walking, a tenth of one per tick
        now[0] += gil.PACE_INTERVAL / 10
        pacer.tick()
    assert sleeps and all(s == 0 for s in sleeps)
    assert 9 <= len(sleeps) <= 10  # one per interval, not one per tick
