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


def test_the_pacer_waits_while_the_thread_it_yields_to_serves(monkeypatch):
    """At a hand-off, while ``yield_to()`` is true, up to YIELD_LIMIT; not at all while it is false."""
    now = [1000.0]
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(gil, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))
    serving = [True]
    pacer = gil.GILPacer(yield_to=lambda: serving[0])
    for _ in range(1000):
        pacer.tick()  # a quick walk: no hand-off, no wait
    assert sleeps == []
    now[0] += gil.PACE_INTERVAL
    started = now[0]
    pacer.tick()  # the poller serves throughout: the hand-off waits YIELD_LIMIT, no longer
    assert sleeps[0] == 0 and set(sleeps[1:]) == {gil.YIELD_STEP}
    assert gil.YIELD_LIMIT <= now[0] - started < gil.YIELD_LIMIT + 2 * gil.YIELD_STEP
    del sleeps[:]
    now[0] += gil.PACE_INTERVAL
    serving[0] = False
    pacer.tick()  # the poller is waiting for events: the plain hand-off
    assert sleeps == [0]
    del sleeps[:]
    now[0] += gil.PACE_INTERVAL
    serving[0] = True

    def sleep_then_done(seconds):
        sleep(seconds)
        if len(sleeps) == 3:
            serving[0] = False  # the poller's batch ends

    monkeypatch.setattr(gil.time, "sleep", sleep_then_done)
    pacer.tick()
    assert sleeps == [0, gil.YIELD_STEP, gil.YIELD_STEP]  # no longer than the batch
