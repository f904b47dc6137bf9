"""Broker: a complete nsqd in this process, for a test."""

import shutil
import tempfile

from ..server.nsqd import NSQD
from ..settings.options import Options
from .flags import resolve_with_warnings
from .served import LOCALHOST, TEMP_PREFIX, ServedBroker, address_text
from .waiting import messages_in_process, wait_in_process

__all__ = ["Broker"]


class Broker(ServedBroker):
    """A complete nsqd (:class:`~nsqd_threaded.NSQD`) in this process, for a test.

    ``Broker(*flags, log_stream=None, tmp_dir=None, **options)``: ``flags`` are nsqd
    flags, ``options`` are :class:`~nsqd_threaded.settings.options.Options` fields.  The log is
    kept in memory (:attr:`log`) and also written to ``log_stream`` if given.  The
    temporary data directory is created in ``tmp_dir`` (default: the system's).

    ``auto_skip=True`` is ``--time-skipping=auto``: the broker skips its clock to its next deadline
    by itself whenever its connections have been quiet for ``time_skipping_grace`` (docs/testing.md).

    ``_lock`` serializes start/stop/restart.
    """

    def __init__(self, *flags, log_stream=None, tmp_dir=None, auto_skip=False, **options):
        if auto_skip:
            options["time_skipping"] = "auto"
        values, self._warnings = resolve_with_warnings(flags, options)
        self._init_broker(values, log_stream, tmp_dir)
        self.nsqd = None  # the NSQD (kept after stop() for inspection)
        self.running = False

    # -- lifecycle -------------------------------------------------------------

    def start(self):
        """Start the broker; returns self.  Raises what NSQD.start raises (nothing is left behind)."""
        with self._lock:
            if self.running:
                raise RuntimeError("broker already running")
            made = False
            if self._own_data_path and self.data_path is None:
                self.data_path = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=self._tmp_dir)
                made = True
            try:
                self._start_nsqd(self._options())
            except BaseException:
                if made:
                    shutil.rmtree(self.data_path, ignore_errors=True)
                    self.data_path = None
                raise
        return self

    def _options(self, tcp_address=None, http_address=None):
        # time_skipping: advance() moves the broker's clock (real time until a test does);
        # channel_peek: messages() and GET /channel/peek.
        values = {"tcp_address": "%s:0" % LOCALHOST, "http_address": "%s:0" % LOCALHOST,
                  "time_skipping": True, "channel_peek": True}
        values.update(self._values)
        values["data_path"] = self.data_path
        if tcp_address is not None:
            values["tcp_address"] = tcp_address
        if http_address is not None:
            values["http_address"] = http_address
        return Options(**values)

    def _start_nsqd(self, options):
        nsqd = NSQD(options, log_stream=self._log)
        for warning in self._warnings:
            nsqd.log.warn("%s", warning)
        nsqd.start()
        self.nsqd = nsqd
        self._tcp_address = nsqd.tcp_address
        self._http_address = nsqd.http_address
        self.running = True

    def stop(self):
        """Stop the broker (every thread joined, every socket closed) and remove its temporary data."""
        with self._lock:
            try:
                if self.running:
                    self.running = False
                    self.nsqd.stop()
            finally:
                if self._own_data_path and self.data_path is not None:
                    shutil.rmtree(self.data_path, ignore_errors=True)
                    self.data_path = None

    def restart(self):
        """Stop and start again on the same ports with the same data directory (nsqd.dat survives)."""
        with self._lock:
            if not self.running:
                raise RuntimeError("broker is not running")
            self.running = False
            self.nsqd.stop()
            http = address_text(self._http_address) or ""
            self._start_nsqd(self._options(address_text(self._tcp_address), http))
        return self

    # -- looking inside ----------------------------------------------------------

    def wait_until(self, topic, channel=None, timeout=10.0, **expected):
        """Wait until the channel's (or, without ``channel``, the topic's) /stats dict has every
        ``expected`` field's value (``depth=0, in_flight_count=0``, any /stats key); return that dict.

        Woken by the broker's own changes (no polling).  A topic or channel that does
        not exist yet is "not yet".  Raises TimeoutError naming each field's last value.
        """
        if not self.running:
            raise RuntimeError("broker is not running")
        try:
            return wait_in_process(self.nsqd, topic, channel, timeout, expected)
        except TimeoutError as e:
            starved = _starved_loop()
            if starved is None:
                raise
            raise TimeoutError("%s; and this thread's event loop did not run meanwhile (%s): a client made on "
                               "it (a pynsq Reader, an asyncio consumer) could not connect, read or FIN. Wait with "
                               "loop.wait_until(broker, topic, channel, ...) of nsqd_threaded.testing's TornadoLoop "
                               "or AsyncioLoop, which runs the loop while it waits" % (e, starved)) from None

    def messages(self, topic, channel):
        """Every message the channel holds (memory, disk, in flight, deferred) in delivery order,
        as :class:`~nsqd_threaded.broker.peek.HeldMessage` tuples; changes nothing.  [] is an empty
        channel; a topic or channel that does not exist raises LookupError naming it."""
        if not self.running:
            raise RuntimeError("broker is not running")
        return messages_in_process(self.nsqd, topic, channel)

    # -- time skipping -----------------------------------------------------------

    def advance(self, seconds=None):
        """Move the broker's clock forward by ``seconds`` (None: to its next deadline) and return
        once what fell due is done: timed-out in-flight messages requeued, due deferred and
        REQ-delayed messages ready, and each taken by a consumer with a free RDY slot.
        Returns the seconds skipped (0.0 when nothing is pending).  See ``NSQD.advance``."""
        if not self.running:
            raise RuntimeError("broker is not running")
        return self.nsqd.advance(seconds)

    def next_deadline_in(self):
        """Seconds of the broker's clock to its next in-flight timeout or deferred due time; None if none."""
        return self.nsqd.next_deadline_in()

    def sync(self, timeout=10.0):
        """A barrier for crash tests: returns once what is stored is on disk (:meth:`NSQD.sync
        <nsqd_threaded.broker.core.BrokerCore.sync>`); with ``--durable`` that is everything
        acknowledged, so a kill right after loses and duplicates nothing."""
        if not self.running:
            raise RuntimeError("broker is not running")
        if not self.nsqd.sync(timeout):
            raise RuntimeError("an fsync failed (the broker's log says which)")

    @property
    def clock(self):
        """The broker's :class:`~nsqd_threaded.internal.clock.Clock` (what ``clock=`` of a client or loop follows)."""
        if self.nsqd is None:
            raise RuntimeError("broker was never started")
        return self.nsqd.clock

    def now(self):
        """The broker's clock: Unix seconds (real time plus what :meth:`advance` skipped), as message
        timestamps and due times (``HeldMessage.due_ns``) count."""
        if self.nsqd is None:
            raise RuntimeError("broker was never started")
        return self.nsqd.clock.time()

    def __repr__(self):
        state = "running" if self.running else "stopped"
        return "<Broker tcp=%s http=%s %s>" % (self.tcp_addr, self.http_addr, state)


def _starved_loop():
    """This thread's current asyncio loop, described, if one is set and holds work it did not run
    while a blocking wait went on (sockets or timers of a client); None otherwise."""
    import asyncio

    local = getattr(asyncio.get_event_loop_policy(), "_local", None)
    loop = getattr(local, "_loop", None)
    if loop is None or loop.is_closed() or loop.is_running():
        return None
    selector = getattr(loop, "_selector", None)
    sockets = len(selector.get_map()) - 1 if selector is not None else 0  # (less the loop's own wake-up pipe)
    timers = len(getattr(loop, "_scheduled", ()))
    if sockets <= 0 and timers == 0:
        return None
    return "%d socket(s), %d timer(s) waiting" % (sockets, timers)
