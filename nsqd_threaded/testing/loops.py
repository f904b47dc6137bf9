"""Event loops for the application's clients in a test, on the broker's clock.

::

    from nsqd_threaded.testing import Broker, TornadoLoop

    with Broker("--msg-timeout=60s") as nsqd, TornadoLoop(clock=nsqd, auto_skip=True) as loop:
        reader = nsq.Reader(topic="orders", channel="billing", nsqd_tcp_addresses=[nsqd.tcp_addr], ...)
        loop.run_until(lambda: handled)           # no real wait for the broker's or pynsq's timers

:class:`TornadoLoop` (tornado clients: pynsq) and :class:`AsyncioLoop` (asyncio clients: ansq,
aiohttp) each make a private asyncio event loop current in this thread, until :meth:`close` (or the
end of ``with``).  Made after it, a client runs on it.

**One clock.**  Given ``clock=`` a testing :class:`~nsqd_threaded.testing.Broker`,
:class:`~nsqd_threaded.testing.BrokerProcess`, :class:`~nsqd_threaded.testing.Lookupd` or
:class:`~nsqd_threaded.testing.Cluster`, the loop's time *is* that daemon's clock (real time plus what
was skipped): ``loop.time()``, every ``call_later``/``call_at``/``PeriodicCallback`` of the client and
``asyncio.sleep`` run on it (a tornado ``IOLoop``'s ``time()``, which a ``PeriodicCallback`` reads, is
the clock's wall time).  ``nsqd.advance(s)`` and ``loop.advance(s)`` move both; the client's
timers that fall due fire on the loop's next run.  pynsq also reads ``time.time()`` (its per-address
connect throttle, its stale-connection check): in ``nsq.reader``, ``nsq.client`` and ``nsq.conn`` that
name reads the clock's wall time while the loop is open (:data:`CLIENT_MODULES`; ``clients=`` names
others).  A cluster's members move together (``Cluster.advance``): move its time through the cluster
or the loop, not through one member.  A :class:`BrokerProcess`'s clock is read over HTTP when a run
starts and after each skip.

**Skipping while idle.**  With ``auto_skip=True``, while :meth:`~ClockedLoop.run_until`,
:meth:`~ClockedLoop.run_for` or :meth:`~ClockedLoop.wait_until` waits and nothing can happen until time
passes, the clock jumps to the earliest deadline of the loop (a client's reconnect, backoff or
periodic timer, the waiting method's own end) and of the daemon (a msg-timeout, a REQ or DPUB
coming due).  "Nothing can happen" means: no callback ready, no event on any of the loop's sockets,
no call of the loop's running in an executor thread (``getaddrinfo``, ``run_in_executor``), no
:class:`~nsqd_threaded.testing.FaultProxy` given in ``proxies=`` (or :meth:`~ClockedLoop.watch`)
holding delayed bytes or relaying (``FaultProxy.busy``: a connection being set up, bytes it has not
read or not yet passed on), and the daemon at rest, looked at before the loop's sockets are (what it sent
is in them by then).  A broker on the poller with no message in flight vouches for that itself
(:meth:`ClockSource.settled`): the clock jumps at once.  Otherwise (a message in flight: its handler
may wait on something real, a database, a thread, another process, which makes no event the loop can
see; a proxy watched; a daemon that cannot vouch) the grace decides: no event on the loop's sockets
for ``grace`` seconds of real time (default :data:`GRACE`) and the daemon at rest as seen from
outside (:meth:`ClockSource.busy`); raise it for slow collaborators.  A jump never passes the
waiting method's end, and the same test gives the same result every run: what runs is decided by
the order of deadlines, not by how long real work took.

Timeouts under a clock are in the clock's seconds; ``real_timeout`` (default :data:`REAL_TIMEOUT`)
bounds each wait in real seconds as well, so a test that hangs fails.
"""

import asyncio
import selectors
import sys
import time
import types

from ..server.auto_skip import broker_figures, connections_busy, daemon_threads_runnable, listeners_busy, runnable
from .broker import Broker
from .cluster import Cluster
from .lookupd import Lookupd
from .process import BrokerProcess
from .waiting import Expectation

GRACE = 0.02  # seconds of real time with no event before an auto-skip jumps
SLICE = 0.05  # the longest real wait in one select under a clock: a clock moved elsewhere is seen
REAL_TIMEOUT = 60.0  # real seconds any one wait may take under a clock
POLL_INTERVAL = 0.005  # seconds between two looks at the predicate of a loop without a clock
SETTLE_SLICE = 0.001  # real seconds between two looks at a daemon settling (see ClockSource.settled)
LAND_SHORT = 0.5  # seconds of the clock a jump to a loop's timer stops before it (see ClockedLoop._select)
CLIENT_MODULES = ("nsq.reader", "nsq.client", "nsq.conn")  # pynsq's modules that read time.time()


class ClockSource:
    """The daemon(s) a loop's clock follows: what was skipped, their next deadline, moving them.

    ``skipped()`` is read on every ``loop.time()``: for the in-process daemons it is one attribute of
    their :class:`~nsqd_threaded.internal.clock.Clock`; a :class:`BrokerProcess` is asked over HTTP
    only by :meth:`refresh` (a run's start, after each skip).
    """

    def __init__(self, target):
        self.target = target
        self._remote_skipped = 0.0
        self._figures = None  # the in-process brokers' figures at the last look (see busy)
        if isinstance(target, Broker):
            self._clock = lambda: target.nsqd.clock if target.nsqd is not None else None
        elif isinstance(target, Lookupd):
            self._clock = lambda: target.lookupd.clock if target.lookupd is not None else None
        elif isinstance(target, Cluster):
            self._clock = lambda: target.lookupd.lookupd.clock if target.lookupd.lookupd is not None else None
        elif isinstance(target, BrokerProcess):
            self._clock = None  # in another process: read over HTTP by refresh()
        else:
            raise TypeError("clock= takes a testing Broker, BrokerProcess, Lookupd or Cluster, not %r" % (target,))
        self.name = type(target).__name__  # (in messages)

    def skipped(self):
        if self._clock is None:
            return self._remote_skipped
        clock = self._clock()
        return clock.skipped if clock is not None else 0.0

    def refresh(self):
        if self._clock is None:
            from .skipping import http_time

            self._remote_skipped = http_time(self.target._http_address, repr(self.target))["total_skipped"]

    def next_deadline_in(self):
        return self.target.next_deadline_in()

    def settled(self):
        """The daemon's precise look (:func:`~nsqd_threaded.server.auto_skip.settled`): True when it
        is at rest with no message at a client's handler, False while something is under way, None
        when it cannot vouch (then the grace decides: :meth:`busy`).  Only a broker on the poller
        can vouch: an in-process :class:`Broker`, or a :class:`BrokerProcess` over HTTP."""
        target = self.target
        if isinstance(target, BrokerProcess):  # asked over HTTP (GET /debug/time)
            if not target.running:
                return None
            from .skipping import http_time

            return http_time(target._http_address, repr(target)).get("settled")
        nsqd = target.nsqd if isinstance(target, Broker) and target.running else None
        return nsqd.settled() if nsqd is not None else None

    def skip_brings_heartbeats(self, seconds):
        """Whether a skip of ``seconds`` now would bring a client of the daemon a heartbeat (True
        when it cannot tell)."""
        nsqd = self.target.nsqd if isinstance(self.target, Broker) and self.target.running else None
        return nsqd.skip_brings_heartbeats(seconds) if nsqd is not None else True

    def advance(self, seconds):
        skipped = self.target.advance(seconds)
        self.refresh()
        return skipped

    def busy(self, grace):
        """True while an in-process daemon is at work without time passing: a connection of its waits to
        be accepted, moved a byte within ``grace`` or has bytes it has not read (a command being
        handled: a FIN has no answer the loop could see), or a broker owes a topic's channels or a
        subscribed consumer a message, or its figures changed since the last look; a broker in another
        process: one of its threads runs or waits for a CPU."""
        target = self.target
        members = target.brokers if isinstance(target, Cluster) else [target]
        brokers = [b for b in members if isinstance(b, Broker)]
        processes = [b for b in members if isinstance(b, BrokerProcess)]
        lookupds = [target.lookupd] if isinstance(target, Cluster) else [target] if isinstance(target, Lookupd) else []
        figures = []
        for broker in brokers:
            nsqd = broker.nsqd if broker.running else None
            if nsqd is not None:
                if connections_busy(nsqd, grace):
                    self._figures = None
                    return True
                figures.append(broker_figures(nsqd))
        # A command read and handled since the last look (a FIN has no answer) changed the figures:
        # not idle until two looks a grace apart see the same.
        if figures != self._figures:
            self._figures = figures
            return bool(figures)
        for lookupd in lookupds:  # (a client's /lookup being answered)
            if lookupd.running and (listeners_busy(lookupd.lookupd.listeners(), grace)
                                    or daemon_threads_runnable(("nsqlookupd-",))):
                return True
        # a broker in another process: its threads, seen from outside
        return any(runnable("/proc/%d/task" % b.pid) for b in processes if b.running and b.pid)


class _ClockTime(types.ModuleType):
    """The ``time`` module as a client module sees it under a clock: ``time()`` is the clock's wall time."""

    def __init__(self, driver):
        super().__init__("time")
        self._driver = driver

    def time(self):
        return time.time() + self._driver.offset()

    def __getattr__(self, name):
        return getattr(time, name)


class _ClockedSelector(selectors.BaseSelector):
    """The loop's selector: where the loop would block, it also looks at the waiting method's
    predicate, waits in short slices (a clock moved elsewhere is seen) and, auto-skipping, jumps."""

    def __init__(self, driver):
        self._real = selectors.DefaultSelector()
        self._driver = driver

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_key(self, fileobj):
        return self._real.get_key(fileobj)

    def get_map(self):
        return self._real.get_map()

    def close(self):
        self._real.close()

    def select(self, timeout=None):
        return self._driver._select(self._real, timeout)


class _Wait:
    """One waiting method's state: its predicate, its ends (clock and real), its outcome."""

    def __init__(self, predicate, real_deadline, skip=True):
        self.predicate = predicate
        self.real_deadline = real_deadline
        self.skip = skip  # run_until_idle: stop where a jump would be, instead of jumping
        self.value = None
        self.last_error = None
        self.done = False
        self.idle = False
        self.looked_at = 0.0  # real time of the last look at the predicate

    def check(self):
        if self.predicate is None:
            return False
        try:
            value = self.predicate()
        except Exception as e:  # "not yet"; reported if it never holds
            self.last_error = e
            return False
        self.last_error = None
        self.value = value
        return bool(value)


class ClockedLoop:
    """What :class:`TornadoLoop` and :class:`AsyncioLoop` share (see the module's docstring).

    Only the thread that made the loop uses it, as an asyncio loop; ``_wait`` (the waiting method in
    progress) and ``_offset`` (the largest skip seen: the loop's time never goes back, even when a
    restarted broker's clock starts again from real time) belong to that thread.
    """

    def __init__(self, clock=None, auto_skip=False, grace=GRACE, real_timeout=REAL_TIMEOUT, proxies=(),
                 clients=CLIENT_MODULES):
        if auto_skip and clock is None:
            raise ValueError("auto_skip=True needs clock= (a Broker, BrokerProcess, Lookupd or Cluster)")
        self.source = ClockSource(clock) if clock is not None else None
        self.auto_skip = bool(auto_skip)
        self.grace = float(grace)
        self.real_timeout = float(real_timeout)
        self.proxies = list(proxies)
        self.skips = 0  # jumps made by auto-skip
        self._offset = 0.0
        self.in_executor = 0  # calls the loop runs in an executor thread, not done yet: real work, no jump
        self._landing = False  # a jump stopped LAND_SHORT before a loop timer: the rest follows once read
        self._wait = None
        self._active_at = time.monotonic()
        self._patched = []
        if self.source is not None:
            self.source.refresh()
            self._patch_clients(clients)
        self.asyncio_loop = _ClockedEventLoop(self)
        asyncio.set_event_loop(self.asyncio_loop)

    # -- the clock -------------------------------------------------------------

    def offset(self):
        """Seconds the loop's clock is ahead of real time (what its daemon skipped)."""
        if self.source is not None:
            skipped = self.source.skipped()
            if skipped > self._offset:
                self._offset = skipped
        return self._offset

    def time(self):
        """The loop's time (``loop.time()``): the daemon's monotonic clock under ``clock=``."""
        return self.asyncio_loop.time()

    def _patch_clients(self, names):
        shim = _ClockTime(self)
        for name in names:
            module = sys.modules.get(name)
            if module is None:
                try:
                    __import__(name)
                except ImportError:
                    continue
                module = sys.modules[name]
            if getattr(module, "time", None) is time:
                module.time = shim
                self._patched.append(module)

    def executor_done(self, future):
        self.in_executor -= 1

    def watch(self, proxy):
        """Count ``proxy`` (a :class:`~nsqd_threaded.testing.FaultProxy`) in: no jump while it holds bytes."""
        self.proxies.append(proxy)
        return proxy

    # -- where the loop blocks -------------------------------------------------

    def _select(self, real, timeout):
        wait = self._wait
        busy = timeout is not None and timeout <= 0  # a callback is ready
        if wait is not None and (not busy or time.monotonic() - wait.looked_at >= POLL_INTERVAL):
            wait.looked_at = time.monotonic()
            if wait.check() or wait.looked_at >= wait.real_deadline:
                wait.done = True
                self.asyncio_loop.stop()
                return real.select(0)
        if busy:
            self._active_at = time.monotonic()
            return real.select(0)
        if self.source is None:  # no clock: the predicate is looked at every POLL_INTERVAL
            if wait is not None:
                timeout = POLL_INTERVAL if timeout is None else min(timeout, POLL_INTERVAL)
            return real.select(timeout)
        step = SLICE if timeout is None else min(timeout, SLICE)
        if not (self.auto_skip and wait is not None):
            events = real.select(step)
            if events:
                self._active_at = time.monotonic()
            return events
        started = time.monotonic()
        events = real.select(0)
        if events:
            self._active_at = started
            return events
        # Can the daemon vouch that it is at rest, with no message at a handler (settled)?  Then no
        # grace: what the loop sees is all there is.  Else the grace decides (the daemon's busy()).
        outside = self.in_executor or any(p.holding() or p.busy() for p in self.proxies)
        # (a FaultProxy's thread relays out of both sides' sight: with one watched, the grace decides)
        look = None if outside or self.proxies else self.source.settled()
        if look is False:  # under way: look again in a moment
            events = real.select(min(step, SETTLE_SLICE))
            if events:
                self._active_at = time.monotonic()
            return events
        if look is None:
            if self._landing and wait.skip:
                # Landed short of a timer: once what the jump brought is read (no callback ready,
                # no event), the rest of the way, without the grace (nothing has happened but
                # reading), as careful as any jump otherwise: nothing in an executor or a proxy,
                # the daemon at rest.
                if outside or self.source.busy(self.grace):
                    return real.select(min(step, self.grace))
            else:
                events = real.select(min(step, self.grace))
                now = time.monotonic()
                if events:
                    self._active_at = now
                    return events
                if now - self._active_at < self.grace or outside or self.source.busy(self.grace):
                    return events
        # The daemon is at rest now: what it sent before is in the loop's sockets by now (loopback),
        # so a last look at them, after the daemon's, decides.
        events = real.select(0)
        if events:
            self._active_at = time.monotonic()
            return events
        if self._landing and wait.skip:
            self._landing = False
            daemon_due = self.source.next_deadline_in()
            if timeout is not None and timeout > 0 and (daemon_due is None or daemon_due > timeout):
                self.source.advance(timeout)
                self._active_at = time.monotonic()
                return events
        if wait.check():  # what the broker did meanwhile (a FIN has no answer) may be what was awaited
            wait.done = True
            self.asyncio_loop.stop()
            return events
        # Idle: nothing can happen until time passes.  Jump to the earliest deadline.
        if not wait.skip:  # run_until_idle: this is the moment it waits for
            wait.idle = True
            wait.done = True
            self.asyncio_loop.stop()
            return events
        daemon_due = self.source.next_deadline_in()
        loop_due = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        dues = [d for d in (daemon_due, loop_due) if d is not None]
        if not dues:
            return real.select(step)  # nothing is scheduled anywhere: only something real can happen
        jump = min(dues)
        if (jump == loop_due and jump > LAND_SHORT and (daemon_due is None or daemon_due > jump)
                and self.source.skip_brings_heartbeats(jump)):
            # A timer of the loop's is what falls due, and the skip brings the broker's heartbeats
            # (sent before advance() returns): land LAND_SHORT before the timer, so that they are
            # read before it runs (pynsq's check for a silent connection reads them); then the rest.
            jump -= LAND_SHORT
            self._landing = True
        if jump > 0:
            self.source.advance(jump)
            self.skips += 1
        self._active_at = time.monotonic()
        return events

    # -- waiting with the loop running -------------------------------------------

    def _run(self, predicate, timeout, skip=True):
        """Run the loop until ``predicate()`` holds or ``timeout`` seconds of the loop's clock pass."""
        loop = self.asyncio_loop
        if self.source is not None:  # the timeout is in the clock's seconds; a real-time guard besides
            self.source.refresh()
            real = time.monotonic() + self.real_timeout
        else:
            real = time.monotonic() + (timeout if timeout is not None else self.real_timeout)
        wait = _Wait(predicate, real, skip)
        self._landing = False
        if wait.check():
            return wait
        self._wait = wait
        self._active_at = time.monotonic()
        end = None
        if timeout is not None:
            end = loop.call_at(loop.time() + timeout, self._timed_out, wait)
        try:
            while not wait.done:
                loop.run_forever()
        finally:
            self._wait = None
            if end is not None:
                end.cancel()
        return wait

    def _timed_out(self, wait):
        wait.check()
        wait.done = True
        self.asyncio_loop.stop()

    def run_until(self, predicate, timeout=10.0):
        """Run the loop until ``predicate()`` is true; return its value.

        A predicate that raises is "not yet" (a stats dict without the channel yet, a client not
        connected yet).  After ``timeout`` seconds (of the loop's clock) raises :class:`TimeoutError`,
        chained to the predicate's last exception if it raised."""
        wait = self._run(predicate, timeout)
        if not wait.value:
            error = TimeoutError("not true after %gs%s: %r" % (timeout, self._how_long(), predicate))
            if wait.last_error is not None:
                raise error from wait.last_error
            raise error
        return wait.value

    def run_for(self, seconds):
        """Run the loop for ``seconds`` of its clock (auto-skipping: at once, jumping from deadline to
        deadline, never past the end); returns the seconds of the clock that passed."""
        start = self.time()
        self._run(None, seconds)
        return self.time() - start

    def run_until_idle(self, timeout=10.0):
        """Run the loop until nothing can happen without time passing (as an auto-skip would find it),
        without moving the clock; returns True (False: ``timeout`` passed first)."""
        if self.source is None or not self.auto_skip:
            raise RuntimeError("run_until_idle needs a loop made with clock= and auto_skip=True")
        wait = self._run(None, timeout, skip=False)
        return wait.idle

    def wait_until(self, broker, topic, channel=None, timeout=10.0, **expected):
        """:meth:`Broker.wait_until <nsqd_threaded.testing.Broker.wait_until>` with this loop running:
        until the channel's (or, without ``channel``, the topic's) /stats dict has every ``expected``
        field's value; returns that dict.  TimeoutError names each field's last value."""
        expectation = Expectation(topic, channel, expected)
        if isinstance(broker, Broker):
            from ..broker import stats

            def look():
                if not broker.running:
                    return None
                return expectation.check(stats.collect(broker.nsqd, topic_name=topic, channel_name=channel,
                                                       include_mem=False))
        else:
            params = {"topic": topic} if channel is None else {"topic": topic, "channel": channel}

            def look():
                return expectation.check(broker.stats(**params))
        wait = self._run(look, timeout)
        if not wait.value:
            raise expectation.timeout_error(timeout)
        return wait.value

    def advance(self, seconds=None):
        """Move the clock (the daemon's and so the loop's) forward by ``seconds``; None: to the next
        deadline of the loop or the daemon.  The client timers that fall due fire on the loop's next
        run.  Returns the seconds skipped (0.0 when nothing is pending)."""
        if self.source is None:
            raise RuntimeError("advance needs a loop made with clock=")
        if seconds is None:
            loop = self.asyncio_loop
            dues = [self.source.next_deadline_in()]
            scheduled = [h for h in getattr(loop, "_scheduled", ()) if not h.cancelled()]
            if scheduled:
                dues.append(max(0.0, min(h.when() for h in scheduled) - loop.time()))
            dues = [d for d in dues if d is not None]
            if not dues:
                return 0.0
            seconds = min(dues)
        if seconds < 0:
            raise ValueError("a clock only moves forward (asked to skip %gs)" % seconds)
        self.source.advance(seconds)
        return float(seconds)

    def _how_long(self):
        if self.source is None:
            return ""
        return " of the %s's clock (%d auto-skips)" % (self.source.name, self.skips)

    # -- lifecycle -----------------------------------------------------------------

    def close(self):
        """Close the loop and every file descriptor registered with it; no loop is current afterwards."""
        for module in self._patched:
            module.time = time
        self._patched = []
        self._close_loop()
        if not self.asyncio_loop.is_closed():
            self.asyncio_loop.close()
        asyncio.set_event_loop(None)

    def _close_loop(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _ClockedEventLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose time is its driver's clock and whose selector is the driver's; it counts
    the calls it runs in an executor (``getaddrinfo`` among them), which are real work the loop waits on."""

    def __init__(self, driver):
        self._driver = driver
        super().__init__(_ClockedSelector(driver))

    def time(self):
        return time.monotonic() + self._driver.offset()

    def run_in_executor(self, executor, func, *args):
        future = super().run_in_executor(executor, func, *args)
        self._driver.in_executor += 1
        future.add_done_callback(self._driver.executor_done)
        return future


class AsyncioLoop(ClockedLoop):
    """A private asyncio event loop, current in this thread (``asyncio.get_event_loop()`` answers it),
    for asyncio clients (ansq, aiohttp); :attr:`asyncio_loop` is the loop.  See the module's docstring.

    ``AsyncioLoop(clock=None, auto_skip=False, grace=GRACE, real_timeout=REAL_TIMEOUT, proxies=())``.
    :meth:`run` runs a coroutine to its end on it.
    """

    def __init__(self, clock=None, auto_skip=False, grace=GRACE, real_timeout=REAL_TIMEOUT, proxies=()):
        super().__init__(clock, auto_skip, grace, real_timeout, proxies, clients=())

    def run(self, coroutine, timeout=10.0):
        """Run ``coroutine`` to its end (auto-skipping while it waits on the clock); returns its result.
        TimeoutError after ``timeout`` seconds of the loop's clock (the coroutine is cancelled)."""
        task = self.asyncio_loop.create_task(coroutine)
        try:
            self.run_until(task.done, timeout)
        except TimeoutError:
            task.cancel()
            self.run_until(task.done, 5.0)
            raise
        return task.result()

    def _close_loop(self):
        loop = self.asyncio_loop
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())


class TornadoLoop(ClockedLoop):
    """A private event loop for tornado clients (pynsq) in this thread; :meth:`close` (or ``with``) ends it.

    ``TornadoLoop(clock=None, auto_skip=False, grace=GRACE, real_timeout=REAL_TIMEOUT, proxies=(),
    clients=CLIENT_MODULES)``.  :attr:`io_loop` is its tornado ``IOLoop`` and :attr:`asyncio_loop` the
    asyncio loop under it.  Make the client objects after this (pynsq binds to ``IOLoop.current()``
    when one is made).  No deprecated tornado API is used (no ``IOLoop.make_current()``, no
    ``IOLoop()`` outside a running loop): ``IOLoop.current()`` wraps this thread's current asyncio
    loop, on tornado 6.0 as on the newest.  tornado is imported when a TornadoLoop is made (it is not
    a dependency of this package).
    """

    def __init__(self, clock=None, auto_skip=False, grace=GRACE, real_timeout=REAL_TIMEOUT, proxies=(),
                 clients=CLIENT_MODULES):
        import tornado.ioloop

        super().__init__(clock, auto_skip, grace, real_timeout, proxies, clients)
        self.io_loop = tornado.ioloop.IOLoop.current()
        if self.source is not None:
            # tornado's IOLoop.time() is the wall clock's time.time(), which a skip does not move; a
            # PeriodicCallback computes its next run from it (its call_at converts to a delay on the
            # asyncio loop, which is on the clock).  On the clock's wall time, it runs once a period.
            self.io_loop.time = self._wall_time

    def _wall_time(self):
        return time.time() + self.offset()

    def close(self):
        """Close the loop and every file descriptor registered with it; no loop is current afterwards."""
        for module in self._patched:
            module.time = time
        self._patched = []
        self.io_loop.close(all_fds=True)
        super().close()
