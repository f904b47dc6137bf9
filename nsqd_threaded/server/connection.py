"""One TCP connection on the server side: reading commands, writing frames, upgrading, the pump.

Each nsqd connection has two goroutines, IOLoop and messagePump.  Here:

* the connection thread (owned by the TCP server) reads and executes
  commands (:class:`~nsqd_threaded.server.protocol_v2.ProtocolV2` through a
  :class:`~nsqd_threaded.server.reader.Reader`), and
* the pump thread (owned by the connection thread, which joins it) takes
  batches of messages from the channel and writes them out, and sends the
  heartbeats.  It starts when a ready consumer first has something to pump
  (:meth:`ClientConnection.wake`): a producer, a consumer not yet ready, or
  one ready on an empty channel, which publishers' threads deliver to
  directly, has nothing, and a thread costs a start-up hand-off, a stack
  and a turn at the GIL.  Until then the connection thread sends the
  heartbeats itself, between reads (:meth:`ClientConnection.tick_heartbeat`,
  called by the ``Reader``).

Frames from both threads go through :meth:`ClientConnection.send`, serialized
by ``_write_lock``.  A pump batch is written with one ``sendall``.

A publisher's thread may write messages to a consumer too (direct delivery,
see :class:`~nsqd_threaded.broker.delivery.DirectDeliveries`):
:meth:`ClientConnection.hold_output` acquires ``_write_lock`` without
waiting, and :meth:`ClientConnection.deliver_held` sends without blocking
and releases it.  What the socket did not take is kept as ``output_backlog`` and written by
the pump, which the delivery wakes: a slow consumer never holds up a
publisher.  Every write sends ``output_backlog`` first, so the order holds.
"""

import socket
import threading
import time

from ..broker.client import STATE_SUBSCRIBED, Client
from ..wire import protocol_v2

DELIVERY_BATCH = 512  # messages a pump takes from its channel per lock acquisition
# A heartbeat written more than this fraction of its interval after its tick went out late (the
# broker was busy): the client gets a whole interval from then to answer (see late_heartbeat_at).
HEARTBEAT_LATE = 0.1
HEARTBEAT_NOW_WAIT = 0.05  # seconds heartbeat_now waits for another writer to finish
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)  # (without it, no direct delivery: every write may block)


class ClientConnection(Client):
    """A :class:`~nsqd_threaded.broker.client.Client` with its socket: output, upgrades, the pump.

    Locks:
    * the Client's ``_lock`` also guards starting the pump: ``_pump`` is set
      under it, once (by whichever thread's wake-up first has work for it),
      and never after ``_closing``; the connection thread reads it without
      the lock once ``stop_pump`` has returned.
    * ``_write_lock`` serializes writes to the socket, and guards ``_encode``
      and ``output_backlog``.
    """

    __slots__ = (  # (see Client.__slots__)
        "_sock", "_write_lock", "_encode", "output_backlog", "_connection_thread", "_pump", "_heartbeat_at",
        "_heartbeat_every", "disconnected", "late_heartbeat_at", "skipped_since_heartbeat", "pump_refused",
        "pump_deferred",
    )

    polled = False  # served by a NetPoller (see nsqd_threaded.server.netpoll), not a thread of its own

    def __init__(self, id, sock, address, nsqd):
        super().__init__(id, address, nsqd.options)
        self._sock = sock
        self._write_lock = threading.Lock()  # serializes writes to the socket, and guards _encode and output_backlog
        self._encode = None  # output bytes -> socket bytes, None on a plain connection
        self.output_backlog = None  # bytes a direct delivery could not write without blocking: the next write's first
        self._connection_thread = threading.get_ident()  # (created by the connection thread)
        self._pump = None  # the pump thread, once a wake-up with something to pump has started it (under _lock)
        # The heartbeat ticker: when the next is due, and the interval it was
        # computed with.  The connection thread's until the pump starts, then the pump's
        # (the reading thread reads _heartbeat_at without a lock: heartbeat_overdue).
        self._heartbeat_at = None
        self._heartbeat_every = None
        self.disconnected = False  # close_connection was called: the reader stops at its next fill
        # When a heartbeat last went out late (HEARTBEAT_LATE), or None: the read deadline is then
        # no earlier than one interval after it, so that a broker which kept its clients waiting
        # (a stalled process, a starved host) does not drop those that answer as soon as they can.
        # Written by whichever thread sends the heartbeats, read by the reading one (a float: no lock).
        self.late_heartbeat_at = None
        # Time skipping: seconds the broker's clock skipped since this client's last heartbeat
        # (see clock_skipped; a float written by the skipping thread and the ticker's, no lock).
        self.skipped_since_heartbeat = 0.0
        # Told (client, error) of a pump the host had no thread for, on any thread: it reports and
        # answers the refusal; the connection is then closed.  Set by the protocol.
        self.pump_refused = None
        self._pump_asleep = True  # (no pump yet: nothing in hand)
        # A wake-up on the connection thread itself, with no pump yet: the pump starts once the
        # command being served is answered (see wake).  Set and cleared under _lock; read by the
        # connection thread's loop without it (a hint it then acts on under the lock).
        self.pump_deferred = False

    def upgrade(self, negotiate):
        """IDENTIFY's upgrades: ``negotiate(sock, send, install)`` runs holding the write lock.

        As nsqd's Upgrade* do, nothing else is written meanwhile (no
        heartbeat in the middle of a TLS handshake, or between an upgrade
        and its OK).  ``send(data)`` writes through the current layers;
        ``install(transport)`` makes them ``transport``'s.  Errors propagate
        with the layers as they were last installed.
        """
        with self._write_lock:
            negotiate(self._sock, self._send_locked, self._install)

    def _send_locked(self, data):
        encode = self._encode
        self._sock.sendall(encode(data) if encode is not None else data)

    def _install(self, transport):
        self._encode = transport.encoder()
        self.set_transport(transport)

    # -- output ------------------------------------------------------------

    def send(self, data):
        """Write bytes (one or more complete frames) now; False if the connection failed.

        With compression or TLS the bytes are encoded here, once per send:
        the encoders sit under the output batching, as nsqd's sit under its
        buffered writer.
        """
        try:
            with self._write_lock:
                if self.output_backlog is not None:
                    self._send_pending_locked()
                encode = self._encode
                if encode is not None:
                    data = encode(data)
                self._sock.sendall(data)
            return True
        except OSError:
            self.close_connection()
            return False

    def _send_pending_locked(self):
        pending = self.output_backlog
        self.output_backlog = None
        self._sock.sendall(pending)

    # -- direct delivery: a publisher's thread writes --------------------------

    def hold_output(self, own=False):
        """Reserve the output for :meth:`deliver_held` if it is free now (the channel's lock is held).

        Only a plain connection takes direct deliveries: a TLS or
        compressed stream is written by the pump alone.  Nor does a consumer
        publishing on its own connection: its ``OK`` comes first, as from nsqd
        (``own``: the connection thread asks for its FINs, which have no answer).
        """
        if self._encode is not None or not _DONTWAIT or (
                not own and self._connection_thread and threading.get_ident() == self._connection_thread):
            return False  # (a connection no thread serves now, the usual case, costs no get_ident)
        # Acquire (only a try: the channel's lock is held); released by deliver_held.
        return self._write_lock.acquire(False)

    def deliver_held(self, msgs):
        """Write a batch taken while the output was held, without blocking; release the output.

        The rest, if the socket buffer is full, is kept for the pump
        (woken here), whose writes block as usual.
        """
        # (one chunk: the put's bytes are bounded)
        self._write_held(protocol_v2.joined_message_frames(msgs) if msgs else None)

    def clock_skipped(self, seconds):
        """Time skipping: the broker's clock jumped ``seconds`` (its ``_clock_skipped``; any thread).

        Heartbeats run on real time, so a client whose own timers run on the
        skipped clock (a test's pynsq closes a connection it has heard nothing
        from for two intervals of that clock) would hear nothing through a
        skipped hour.  Once the skips since its last heartbeat carry the clock
        past its next one, it gets it at once, as the skipped time would have
        brought it, before ``advance`` returns (:meth:`heartbeat_now`).
        """
        if self.skip_brings_heartbeat(seconds):
            self.skipped_since_heartbeat = 0.0
            self.heartbeat_now()
        elif self.heartbeat_interval > 0 and not self.disconnected:
            self.skipped_since_heartbeat += seconds

    def skip_brings_heartbeat(self, seconds):
        """Whether a skip of ``seconds`` now would bring this client a heartbeat (:meth:`clock_skipped`)."""
        interval = self.heartbeat_interval
        if interval <= 0 or self.disconnected:
            return False
        due = self._next_heartbeat_at()
        return self.skipped_since_heartbeat + seconds >= (due - time.monotonic() if due is not None else interval)

    def _next_heartbeat_at(self):
        """When the ticker sends the next heartbeat (``time.monotonic()``), None before it starts."""
        return self._heartbeat_at

    def heartbeat_now(self):
        """A heartbeat at once (:meth:`clock_skipped`).  Waits for the output at most
        :data:`HEARTBEAT_NOW_WAIT` (a pump blocked on a client that reads nothing: it gets no
        heartbeat), and never for the socket: what it does not take goes to the pump."""
        if self.heartbeat_interval <= 0 or self.disconnected or not _DONTWAIT:
            return
        if not self._write_lock.acquire(timeout=HEARTBEAT_NOW_WAIT):
            return
        encode = self._encode
        self._write_held(encode(protocol_v2.HEARTBEAT_FRAME) if encode is not None else protocol_v2.HEARTBEAT_FRAME)

    def _write_held(self, data):
        """Write ``data`` (None: nothing) on the held output without blocking, and release it."""
        rest = failed = False
        try:
            if data:
                if self.output_backlog is not None:
                    self.output_backlog = bytes(self.output_backlog) + data  # the pump has not written the last rest yet
                    rest = True
                else:
                    try:
                        sent = self._sock.send(data, _DONTWAIT)
                    except BlockingIOError:
                        sent = 0
                    except OSError:
                        sent = 0
                        failed = True
                    if not failed and sent < len(data):
                        self.output_backlog = memoryview(data)[sent:]
                        rest = True
        finally:
            self._write_lock.release()
        if failed:
            self.close_connection()  # (its messages in flight are requeued once it is gone)
        elif rest:
            self.wake()

    def _send_messages(self, msgs):
        """Encode and write a batch, in sendalls of at least output_buffer_size bytes."""
        for data in protocol_v2.message_frames(msgs, self.output_buffer_size):
            if not self.send(data):
                return False
        return True

    # -- heartbeats before the pump -------------------------------------------

    def tick_heartbeat(self, now):
        """The connection thread's heartbeat ticker while no pump runs (the Reader's ``ticker``).

        Sends a heartbeat if one is due (a failed write closes the
        connection); returns when the next is due, or None once the pump
        sends them or heartbeats are off.
        """
        interval = self.heartbeat_interval
        if self._pump is not None or interval <= 0:
            return None
        if interval != self._heartbeat_every:  # the first tick, or IDENTIFY changed it: restart the ticker
            self._heartbeat_every = interval
            self._heartbeat_at = now + interval
        else:
            due = self._heartbeat_if_due(interval, self._heartbeat_at)  # the pump's ticker, the same rules
            if due is not None:  # (None: the write failed and closed the connection; the Reader stops)
                self._heartbeat_at = due
        return self._heartbeat_at

    # -- pump --------------------------------------------------------------

    def set_ready(self, count):
        """RDY (connection thread): a pump runs only when there is something to pump.

        A consumer made ready on an empty channel waits without one: a put
        delivers to it directly from the publisher's thread, or wakes it,
        which starts the pump then (:meth:`wake`, the one place a pump starts).
        """
        self.ready_count = count
        if self._pump is not None or (
                count > 0 and self.state == STATE_SUBSCRIBED and not self.channel.await_messages(self)):
            self.wake()

    def wake(self):
        """Make the pump look again; without one, start it if it has something to do.

        Called from any thread (publishers', the scanner's, this connection's).
        A wake-up with no pump, of a consumer that is not ready (IDENTIFY,
        SUB, RDY 0) or is closing, has nothing for one to do.  One on this
        connection's own thread (its RDY, its FIN, a consumer's own PUB) only
        marks the pump as due: :meth:`start_deferred_pump` starts it once the
        command is answered, so that a consumer publishing on its own
        connection gets its ``OK`` before the message, as from nsqd (a thread
        started here could write first: the answer is written after this
        returns, and a forced GIL switch in between lets the pump run).  If
        the host allows no more threads, the consumer is refused as at connect
        and disconnected: the publisher that woke it never hears of it.
        """
        self._wake(True)

    def start_deferred_pump(self):
        """The connection thread, between two commands: start the pump a wake-up marked as due."""
        self._wake(False)

    def _wake(self, may_defer):
        with self._lock:
            if self._pump is not None:  # (the usual case, from any thread: nothing more to ask)
                self._woken = True
                self._wakeup.notify()
                return
            if may_defer and threading.get_ident() == self._connection_thread:
                self.pump_deferred = True
                return
            self.pump_deferred = False
            if self._closing or not (self.output_backlog is not None or (
                    self.ready_count > 0 and self.state == STATE_SUBSCRIBED)):
                return
            self._woken = True
            try:
                self._start_pump_locked()
                return
            except RuntimeError as e:
                refused = e
        if self.pump_refused is not None:
            self.pump_refused(self, refused)
        self.close_connection()

    def _start_pump_locked(self):
        """Start the pump thread (``_lock`` held, none started yet; RuntimeError when the host allows no more threads).

        Its owner is the connection thread, which joins it (:meth:`join_pump`).
        """
        pump = threading.Thread(
            target=self._pump_loop, name="nsqd-client-pump[%d %s]" % (self.id, self.remote_address), daemon=True
        )
        pump.start()
        self._pump = pump  # only a started pump is joined; from now on it sends the heartbeats

    def _pump_loop(self):
        hb_interval = self.heartbeat_interval
        next_heartbeat = self._heartbeat_at  # the connection thread's ticker goes on here
        if hb_interval != self._heartbeat_every or next_heartbeat is None:
            next_heartbeat = self._heartbeat_at = time.monotonic() + hb_interval
        while True:
            with self._lock:
                if not self._woken and not self._closing:
                    timeout = next_heartbeat - time.monotonic() if hb_interval > 0 else None
                    if timeout is None or timeout > 0:
                        self._pump_asleep = True  # (between batches: nothing in hand)
                        self._wakeup.wait(timeout)
                self._pump_asleep = False
                self._woken = False
                if self._closing:
                    return
            if self.heartbeat_interval != hb_interval:
                # IDENTIFY changed the interval: restart the ticker.
                hb_interval = self.heartbeat_interval
                next_heartbeat = self._heartbeat_at = time.monotonic() + hb_interval
            # A direct delivery's rest (read without the write lock: a hint; send() re-reads it under the lock).
            if self.output_backlog is not None and not self.send(b""):
                return
            next_heartbeat = self._heartbeat_if_due(hb_interval, next_heartbeat)
            if next_heartbeat is None:
                return
            channel = self.channel
            if channel is not None and self.state == STATE_SUBSCRIBED:
                while True:
                    msgs = channel.take(self, DELIVERY_BATCH)
                    if not msgs:
                        break
                    if not self._send_messages(msgs):
                        return
                    # A steady stream never lets the pump wait: keep the ticker going.
                    next_heartbeat = self._heartbeat_if_due(hb_interval, next_heartbeat)
                    if next_heartbeat is None:
                        return

    def _heartbeat_if_due(self, interval, next_heartbeat):
        """Send a heartbeat if the ticker fired; returns the next tick, None if the write failed."""
        if interval <= 0:
            return next_heartbeat
        now = time.monotonic()
        if now < next_heartbeat:
            return next_heartbeat
        if not self.send(protocol_v2.HEARTBEAT_FRAME):
            return None
        if now - next_heartbeat > interval * HEARTBEAT_LATE:
            self.late_heartbeat_at = now
        self.skipped_since_heartbeat = 0.0
        # A fixed ticker: missed ticks are skipped, not sent in a burst.
        self._heartbeat_at = next_heartbeat + interval * (1 + int((now - next_heartbeat) // interval))
        return self._heartbeat_at

    def heartbeat_overdue(self, now):
        """Whether the next heartbeat is late at ``now`` and not sent yet (its thread is behind):
        the reading thread, which may get to a deadline first, then counts it as sent late now."""
        due = self._heartbeat_at
        interval = self.heartbeat_interval
        return due is not None and interval > 0 and now - due > interval * HEARTBEAT_LATE

    # -- shutdown ----------------------------------------------------------

    def close_connection(self):
        """Make the connection thread's next read fail so it cleans up (any thread)."""
        self.disconnected = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stop_pump(self, wake=True):
        """Tell the pump to stop (it ends at its next wake-up); see :meth:`join_pump`.

        ``wake=False`` leaves a sleeping pump asleep until its next heartbeat or
        a later stop_pump(): the idle watcher's hang-ups after a mass disconnect
        would otherwise wake thousands of pumps at once."""
        with self._lock:
            self._closing = True
            if wake:
                self._wakeup.notify()

    def has_pump(self):
        """True once the pump thread has started (the connection thread's question)."""
        return self._pump is not None

    def join_pump(self):
        """Wait for the stopped pump to end (connection thread only)."""
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join()
