"""Helpers for the unit tests of the concurrent core (Topic, Channel).

The owner is a real NSQD with a temp data dir that is never started (no
listeners; topics start only when a test says so), the consumers real
Clients (the broker's state of a client, without a connection or a pump):
the test thread calls ``Channel.take`` / ``finish_many`` itself.
"""

from nsqd_threaded import NSQD, Options
from nsqd_threaded.broker.client import Client

from support.logs import LogCapture
from support.wire import wait_for


def make_owner(path, **options):
    """An unstarted NSQD on data dir ``path`` (created if needed); stop() it when done."""
    path.mkdir(exist_ok=True)
    options.setdefault("tcp_address", "127.0.0.1:0")
    options.setdefault("http_address", "")
    options.setdefault("node_id", 1)
    return NSQD(Options(data_path=str(path), **options), log_stream=LogCapture())


class DrivenSubscriber:
    """A subscribed client driven by the test: take() and fin() instead of a pump."""

    _next_id = iter(range(1000, 10**9))

    def __init__(self, nsqd, channel, ready=10**6):
        self.client = Client(next(DrivenSubscriber._next_id), ("127.0.0.1", 0), nsqd.options)
        self.client.set_ready(ready)
        self.channel = channel
        channel.add_client(self.client)

    def take(self, n=10**6):
        return self.channel.take(self.client, n)

    def fin(self, msgs):
        self.channel.finish_many(self.client, [m.id for m in msgs])  # (FinishError if one is not in flight)

    def take_all(self, expect, timeout=10.0):
        """take() until ``expect`` messages arrived (polling with a deadline)."""
        out = []

        def all_taken():
            out.extend(self.take(expect - len(out)))
            return len(out) >= expect

        wait_for(all_taken, timeout, interval=0.005, what=lambda: "%d of %d messages" % (len(out), expect))
        return out

    def close(self):
        self.channel.remove_client(self.client)


def wait_until(predicate, timeout=10.0, what="condition"):
    """:func:`support.wire.wait_for` polling every 5 ms (the core's unit tests wait for threads of this process)."""
    return wait_for(predicate, timeout, interval=0.005, what=what)


class OutputClient(Client):
    """A Client whose output the test controls, standing in for the server's connection.

    ``output_free``: what :meth:`hold_output` answers (a held output must be
    released by :meth:`deliver_held` before it is free again).  ``delivered``
    records each held delivery's messages, ``wakes`` counts the wake-ups.
    """

    def __init__(self, id, address, options):
        super().__init__(id, address, options)
        self.output_free = True
        self.held = False
        self.delivered = []
        self.wakes = 0

    def hold_output(self, own=False):
        if not self.output_free or self.held:
            return False
        self.held = True
        return True

    def deliver_held(self, msgs):
        assert self.held, "deliver_held without hold_output"
        self.delivered.append(list(msgs))
        self.held = False

    def wake(self):
        self.wakes += 1
        super().wake()


class HoldingSubscriber(DrivenSubscriber):
    """A DrivenSubscriber whose client takes direct deliveries (see :class:`OutputClient`)."""

    def __init__(self, nsqd, channel, ready=10**6, output_free=True):
        self.client = OutputClient(next(DrivenSubscriber._next_id), ("127.0.0.1", 0), nsqd.options)
        self.client.set_ready(ready)
        self.client.output_free = output_free
        self.client.wakes = 0  # (RDY wakes the pump)
        self.channel = channel
        channel.add_client(self.client)

    def wait(self):
        """Take from an empty channel: the consumer becomes a waiting one."""
        assert self.take() == []


def unreachable_after(rounds, one_round, settled, what):
    """What the cyclic gc finds after ``rounds`` more calls of ``one_round`` (each waited for
    until ``settled()``), with the collector off meanwhile: reference cycles the rounds left.

    A first round runs before the count, to make what is made once (topics, caches)."""
    import gc

    one_round()
    wait_until(settled, what="the first round's %s" % what)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            one_round()
        wait_until(settled, what="every round's %s" % what)
        return gc.collect()
    finally:
        if enabled:
            gc.enable()
