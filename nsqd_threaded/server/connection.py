"""One TCP connection on the server side: reading commands, writing frames, upgrading, the pump.

Each nsqd connection has two goroutines, IOLoop and messagePump.  Here:

* the connection thread (owned by the TCP server) reads and executes
  commands (:class:`~nsqd_threaded.server.protocol_v2.ProtocolV2` through a
  :class:`Reader`), and
* the pump thread (owned by the connection thread, which joins it) takes
  batches of messages from the channel and writes them out, and sends the
  heartbeats.  It starts with the client's first ``RDY`` above zero: a
  producer, or a consumer not yet ready, never has anything to pump, and a
  thread costs a start-up hand-off, a stack and a turn at the GIL.  Until
  then the connection thread sends the heartbeats itself, between reads
  (:meth:`ClientConnection.tick_heartbeat`, called by the :class:`Reader`).

Frames from both threads go through :meth:`ClientConnection.send`, serialized
by ``_write_lock``.  A pump batch is written with one ``sendall``.

A publisher's thread may write messages to a consumer too (direct delivery,
see :class:`~nsqd_threaded.broker.channel.DirectDeliveries`):
:meth:`ClientConnection.hold_output` acquires ``_write_lock`` without
waiting, and :meth:`ClientConnection.deliver_held` sends without blocking
and releases it.  What the socket did not take is kept as ``_pending`` and written by
the pump, which the delivery wakes: a slow consumer never holds up a
publisher.  Every write sends ``_pending`` first, so the order holds.
"""

import socket
import struct
import sys
import threading
import time

from ..broker.client_v2 import STATE_SUBSCRIBED, Client
from ..wire import protocol
from ..wire.transport import TransportError
from .idle import IDLE_AFTER, TIMED_OUT, WOKEN, WOKEN_UNCOUNTED

DELIVERY_BATCH = 512  # messages a pump takes from its channel per lock acquisition
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)  # (without it, no direct delivery: every write may block)


class ConnectionEnded(Exception):
    """EOF, a read error or timeout, or an over-long line: close without an error frame."""


# The receive chunk: small while a connection is idle (thousands of consumers
# each hold one), doubled while recvs come back full (a publisher streaming
# commands), sized up to a large body's length while reading it, and shrunk
# back once recvs come back small again.
MIN_CHUNK = 4096
MAX_LINE = protocol.MAX_LINE
_monotonic = time.monotonic
MAX_CHUNK = 262144


class Reader:
    """A buffered reader over a socket with nsqd's 16 KiB line limit.

    Used by the connection thread only.
    """

    def __init__(self, sock, idle_watcher=None, disconnected=None, ticker=None):
        """``disconnected``: a callable, true once the connection is being closed
        (checked before each recv and each decode: a stream that inflates to
        gigabytes from what is already received must not outlive the broker).

        ``ticker(now)``: called with ``time.monotonic()`` once the time it last
        returned has come (and whenever the read deadline changes: IDENTIFY
        may change the heartbeat interval); it sends a heartbeat if one is
        due and returns when to call it next, or None for never (the pump
        sends them now, or heartbeats are off).  Without a deadline (no
        heartbeats) it is not called.
        """
        self._sock = sock
        self._disconnected = disconnected
        self._ticker = ticker
        self._tick_at = 0.0 if ticker is not None else None  # when to call the ticker next
        self._buf = bytearray()
        self._pos = 0
        self._deadline = None
        sock.settimeout(None)  # blocking: deadlines are the kernel's (see set_deadline)
        self._timeout = None
        # With a watcher, a recv also times out after IDLE_AFTER seconds and
        # the thread parks there (see nsqd_threaded.server.idle).
        self._idle = idle_watcher
        self._holds_permit = False
        if idle_watcher is not None:
            self._set_timeout(None)
        # recv_into one reused buffer: recv(n) would allocate n bytes per call.
        self._chunk = bytearray(MIN_CHUNK)
        self._last_recv = 0  # bytes the last recv returned
        # Socket bytes -> command bytes once TLS or compression is negotiated
        # (see nsqd_threaded.wire.transport); None on a plain connection.
        self._decode = None
        self._layers = None  # the Transport behind _decode

    def set_deadline(self, seconds):
        """Start reading a command: its line and body must arrive within ``seconds``.

        nsqd sets one read deadline before each command (2 x heartbeat
        interval; none when heartbeats are off), so a client trickling bytes
        cannot extend it.  The deadline is enforced by the kernel
        (SO_RCVTIMEO/SO_SNDTIMEO on a blocking socket: no poll() before every
        recv and send, unlike a Python socket timeout).  It is set only when it
        changes, and lowered only for a command that has used half its time.
        """
        if seconds == self._timeout and seconds is not None:  # the usual case: same as the last command's
            self._deadline = _monotonic() + seconds
            return
        if self._ticker is not None:
            self._tick_at = 0.0  # the heartbeat interval may have changed: ask the ticker again
        if seconds is None or seconds <= 0:
            self._deadline = None
            if self._timeout is not None:
                self._set_timeout(None)
            return
        self._deadline = time.monotonic() + seconds
        if self._timeout != seconds:
            self._set_timeout(seconds)

    def _set_timeout(self, seconds):
        tv = _timeval(seconds)
        recv_seconds = seconds
        # Parking (or, without a watcher, a heartbeat) needs the recv to come
        # back after IDLE_AFTER seconds of nothing.
        if (self._idle is not None or self._ticker is not None) and (seconds is None or seconds > IDLE_AFTER):
            recv_seconds = IDLE_AFTER
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(recv_seconds))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)  # the pump's writes too
        self._timeout = seconds

    def _fill(self, missing=0):
        """One recv; ``missing`` is how many more bytes the caller is known to need."""
        if self._disconnected is not None and self._disconnected():
            raise ConnectionEnded("closed by the broker")
        if self._deadline is not None:
            now = _monotonic()
            remaining = self._deadline - now
            if remaining <= 0:
                raise ConnectionEnded("i/o timeout")
            if remaining < self._timeout * 0.5:
                self._set_timeout(remaining)
            tick_at = self._tick_at
            if tick_at is not None and now >= tick_at:
                self._tick_at = self._ticker(now)
        layers = self._layers
        if layers is not None and layers.pending():
            # A large inflate stopped at its limit: its input is already here.
            self._append_decoded(b"", lambda _: layers.drain())
            return
        chunk = self._chunk
        size = len(chunk)
        want = 2 * size if self._last_recv == size else missing
        if want > size:
            if size < MAX_CHUNK:  # a large body, or a stream: fewer, larger recvs
                chunk = self._chunk = bytearray(min(MAX_CHUNK, want))
        elif size > MIN_CHUNK and missing <= MIN_CHUNK and self._last_recv < size // 8:
            chunk = self._chunk = bytearray(MIN_CHUNK)  # quiet again: give the memory back
        try:
            n = self._sock.recv_into(chunk)
        except BlockingIOError:  # SO_RCVTIMEO: idle, or the deadline passed
            n = self._recv_after_idle(chunk)
        except (OSError, ValueError) as e:  # reset, closed
            raise ConnectionEnded(str(e)) from None
        if not n:
            raise ConnectionEnded("EOF")
        self._last_recv = n
        if self._decode is not None:
            self._append_decoded(memoryview(chunk)[:n])
            return
        if self._pos == len(self._buf):
            # Drained: a fresh buffer rather than a resized one, so that one
            # large body's allocation is not kept for the connection's life.
            self._buf = chunk[:n] if n < len(chunk) else bytearray(chunk)
            self._pos = 0
            return
        if self._pos > 65536:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += memoryview(chunk)[:n]

    def _append_decoded(self, data, decode=None):
        """Decode ``data`` into the buffer (maybe nothing yet: a partial record or frame)."""
        try:
            data = (decode or self._decode)(data)
        except TransportError as e:
            raise ConnectionEnded(str(e)) from None
        if not data:
            return
        if self._pos > 65536 or self._pos == len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def set_decoder(self, decode, layer_decode=None, layers=None):
        """Read through ``decode`` from now on.

        ``layer_decode`` is the newly added layer alone: the bytes already
        buffered (received before the upgrade, but after the IDENTIFY that
        asked for it) are fed through it, so nothing a client sent early is
        lost and nothing decodable is left undecoded.
        """
        self._decode = decode
        self._layers = layers
        if layer_decode is not None:
            rest = bytes(self._buf[self._pos :])
            self._buf = bytearray()
            self._pos = 0
            self._append_decoded(rest, layer_decode)

    def take_buffered(self):
        """Remove and return the unread bytes (the start of a TLS handshake)."""
        rest = bytes(self._buf[self._pos :])
        self._buf = bytearray()
        self._pos = 0
        return rest

    def _recv_after_idle(self, chunk):
        """The recv timed out: park with the idle watcher (without one: recv
        again) until readable, sending heartbeats as they fall due; then recv
        (ConnectionEnded at the deadline)."""
        idle = self._idle
        while True:
            wait = None
            tick_at = None
            if self._deadline is not None:
                now = _monotonic()
                wait = self._deadline - now
                if wait <= 0:
                    raise ConnectionEnded("i/o timeout")
                tick_at = self._tick_at
                if tick_at is not None and now >= tick_at:
                    tick_at = self._tick_at = self._ticker(now)
                if self._disconnected is not None and self._disconnected():
                    raise ConnectionEnded("closed by the broker")  # the heartbeat's write failed
                if tick_at is not None and tick_at - now < wait:
                    wait = tick_at - now
                else:
                    tick_at = None
            if idle is None:
                woken = WOKEN_UNCOUNTED  # the blocking recv waits, for IDLE_AFTER seconds at most
            else:
                woken = idle.park(self._sock.fileno(), wait)
                if woken == TIMED_OUT:
                    if tick_at is not None and _monotonic() >= tick_at:
                        continue  # a heartbeat is due, not the deadline
                    raise ConnectionEnded("i/o timeout")  # (or the watcher is stopping)
            counted = woken == WOKEN
            try:
                n = self._sock.recv_into(chunk)
            except BlockingIOError:
                if counted:
                    idle.resumed()
                continue  # not readable after all (a spurious wake-up): park again
            except (OSError, ValueError) as e:
                self._holds_permit = counted
                raise ConnectionEnded(str(e)) from None
            if not n:
                # The connection ends: the permit is kept through its teardown
                # (see close), so a mass close is torn down a few at a time.
                self._holds_permit = counted
                return n
            if counted:
                idle.resumed()
            return n

    def close(self):
        """The connection is torn down: return a permit kept since its last recv."""
        if self._holds_permit:
            self._holds_permit = False
            self._idle.resumed()

    def memory(self):
        """Bytes held by this reader's buffers (for tests and diagnostics).

        CPython's ``getsizeof`` includes a bytearray's spare capacity; PyPy has
        no ``getsizeof``, and its length is the best estimate there.
        """
        try:
            held = sys.getsizeof(self._buf)
        except TypeError:  # PyPy
            held = len(self._buf)
        return len(self._chunk) + held

    def readline(self):
        """One line without its ``\\n``."""
        buf = self._buf
        pos = self._pos
        while True:
            i = buf.find(b"\n", pos, pos + MAX_LINE)
            if i >= 0:
                self._pos = i + 1
                return bytes(buf[pos:i])
            if len(buf) - pos >= MAX_LINE:
                raise ConnectionEnded("line longer than %d bytes" % MAX_LINE)
            self._fill()
            buf = self._buf
            pos = self._pos

    def has_line(self):
        """True if a complete line is already buffered (no I/O)."""
        return self._buf.find(b"\n", self._pos, self._pos + protocol.MAX_LINE) >= 0

    def read(self, n):
        while len(self._buf) - self._pos < n:
            self._fill(n - (len(self._buf) - self._pos))
        data = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return data

    def ensure(self, n):
        """Buffer at least ``n`` unread bytes; returns (buffer, position)."""
        while len(self._buf) - self._pos < n:
            self._fill(n - (len(self._buf) - self._pos))
        return self._buf, self._pos

    def buffered(self):
        return self._buf, self._pos, len(self._buf)

    def advance(self, pos):
        self._pos = pos


def _timeval(seconds):
    """A struct timeval for SO_RCVTIMEO/SO_SNDTIMEO (zero: no timeout)."""
    if seconds is None:
        return struct.pack("@ll", 0, 0)
    sec, usec = divmod(max(1, int(seconds * 1e6)), 1000000)
    return struct.pack("@ll", sec, usec)


class ClientConnection(Client):
    """A :class:`~nsqd_threaded.broker.client_v2.Client` with its socket: output, upgrades, the pump.

    Locks (besides the Client's ``_lock``):
    * ``_write_lock`` serializes writes to the socket, and guards ``_encode``
      and ``_pending``.
    """

    def __init__(self, id, sock, address, nsqd):
        super().__init__(id, address, nsqd.options)
        self._sock = sock
        self._write_lock = threading.Lock()  # serializes writes to the socket, and guards _encode and _pending
        self._encode = None  # output bytes -> socket bytes, None on a plain connection
        self._pending = None  # bytes a direct delivery could not write without blocking: the next write's first
        self._connection_thread = threading.get_ident()  # (created by the connection thread)
        self._pump = None  # the pump thread, once the first RDY above zero has started it
        # The heartbeat ticker: when the next is due, and the interval it was
        # computed with.  The connection thread's until the pump starts, then the pump's.
        self._heartbeat_at = None
        self._heartbeat_every = None
        self.disconnected = False  # close_connection was called: the reader stops at its next fill

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
                if self._pending is not None:
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
        pending = self._pending
        self._pending = None
        self._sock.sendall(pending)

    # -- direct delivery: a publisher's thread writes --------------------------

    def hold_output(self):
        """Reserve the output for :meth:`deliver_held` if it is free now (the channel's lock is held).

        Only a plain connection takes direct deliveries: a TLS or
        compressed stream is written by the pump alone.  Nor does a consumer
        publishing on its own connection: its ``OK`` comes first, as from nsqd.
        """
        if self._encode is not None or not _DONTWAIT or threading.get_ident() == self._connection_thread:
            return False
        # Acquire (only a try: the channel's lock is held); released by deliver_held.
        return self._write_lock.acquire(False)

    def deliver_held(self, msgs):
        """Write a batch taken while the output was held, without blocking; release the output.

        The rest, if the socket buffer is full, is kept for the pump
        (woken here), whose writes block as usual.
        """
        rest = failed = False
        try:
            if msgs:
                data = next(protocol.message_frames(msgs, sys.maxsize))  # (one chunk: no limit)
                if self._pending is not None:
                    self._pending = bytes(self._pending) + data  # the pump has not written the last rest yet
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
                        self._pending = memoryview(data)[sent:]
                        rest = True
        finally:
            self._write_lock.release()
        if failed:
            self.close_connection()  # (its messages in flight are requeued once it is gone)
        elif rest:
            self.wake()

    def _send_messages(self, msgs):
        """Encode and write a batch, in sendalls of at least output_buffer_size bytes."""
        for data in protocol.message_frames(msgs, self.output_buffer_size):
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
        """RDY: the first count above zero starts the pump (RuntimeError when the host allows no more threads)."""
        super().set_ready(count)
        if count > 0 and self._pump is None:
            self.start_pump()

    def start_pump(self):
        """Start the pump thread (connection thread only; RuntimeError when the host allows no more threads)."""
        pump = threading.Thread(
            target=self._pump_loop, name="nsqd-client-pump[%d %s]" % (self.id, self.remote_address), daemon=True
        )
        pump.start()
        self._pump = pump  # only a started pump is joined; from now on it sends the heartbeats

    def _pump_loop(self):
        hb_interval = self.heartbeat_interval
        next_heartbeat = self._heartbeat_at  # the connection thread's ticker goes on here
        if hb_interval != self._heartbeat_every or next_heartbeat is None:
            next_heartbeat = time.monotonic() + hb_interval
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
                next_heartbeat = time.monotonic() + hb_interval
            # A direct delivery's rest (read without the write lock: a hint; send() re-reads it under the lock).
            if self._pending is not None and not self.send(b""):
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
        if not self.send(protocol.HEARTBEAT_FRAME):
            return None
        # A fixed ticker: missed ticks are skipped, not sent in a burst.
        return next_heartbeat + interval * (1 + int((now - next_heartbeat) // interval))

    # -- shutdown ----------------------------------------------------------

    def close_connection(self):
        """Make the connection thread's next read fail so it cleans up (any thread)."""
        self.disconnected = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def stop_pump(self):
        """Tell the pump to stop (it ends at its next wake-up); see :meth:`join_pump`."""
        with self._lock:
            self._closing = True
            self._wakeup.notify()

    def has_pump(self):
        """True once the pump thread has started (the connection thread's question)."""
        return self._pump is not None

    def join_pump(self):
        """Wait for the stopped pump to end (connection thread only)."""
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join()
