"""PolledConnection: a client connection that a NetPoller serves, with no thread of its own.

The connection's side of :mod:`.netpoll`: its writes never block (what the
socket does not take waits in the output backlog for ``EPOLLOUT``), its
heartbeats are written by the poller's timers, and its message pump is a
task a wake-up queues for a worker (:class:`.workers.WorkerPool`), not a
thread.  What it waits for between commands is ``_reading``: one of the
states below, kept under its ``_poll_lock``.
"""

import socket
import threading
import time

from ..broker.client import STATE_SUBSCRIBED
from ..wire import protocol_v2
from .connection import DELIVERY_BATCH, ClientConnection

BACKLOG_LIMIT = 1 << 20  # output bytes waiting for EPOLLOUT over which a connection's commands are not read
DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)  # (0 where the platform lacks it: no poller there)
_PEEK = socket.MSG_PEEK | DONTWAIT

# What a connection's reading waits for (PolledConnection._reading).
PARKED = 0  # the next command: registered for input, no thread
SERVING = 1  # a thread (the poller or a worker) is running its commands
BLOCKED = 2  # its output backlog: registered for output, commands not read
GONE = 3  # torn down


class PolledConnection(ClientConnection):
    """A :class:`ClientConnection` served by a :class:`~.netpoll.NetPoller`: no thread of its own.

    Writes never block: what the socket does not take joins the output
    backlog (``output_backlog``, a bytearray here), written on ``EPOLLOUT``.  The
    pump is a task (:meth:`run_pump`) a wake-up queues for a worker.

    Locks (beside the Client's ``_lock`` and the ``_write_lock``):
    * ``_poll_lock`` guards ``_reading``, ``input_seen`` and the socket's
      epoll registration (every change is computed and made under it).  Order: ``_write_lock``
      -> ``_poll_lock`` (a write that leaves a backlog arms ``EPOLLOUT``).  One exception: only
      the poller thread takes a connection out of ``PARKED`` (a worker parks, blocks or ends only
      a connection it serves), so the poller may find it ``PARKED`` without the lock and serve a
      lone FIN with no change at all (``NetPoller._serve_parked``).
    * the Client's ``_lock`` also guards ``_pump_queued`` (the pump task is
      queued or running; ``_woken`` asks it to look again).
    * ``_hb_every``, ``_hb_at``, ``_idle_since`` and ``_timer_at`` are the
      serving thread's and the poller's: each is written by whichever holds
      the connection (its serving thread, or the poller while it is parked).
    """

    __slots__ = (  # (see Client.__slots__)
        "_poller", "_poll", "_fd", "_poll_lock", "_reading", "input_seen", "_pump_queued", "_sock_closed",
        "proto", "_hb_every", "_hb_at", "_idle_since", "_timer_at", "timer_slot",
    )

    polled = True
    pump_thread = False  # (run_pump is a task: no Condition to sleep on)

    def __init__(self, id, sock, address, nsqd, poller, poll):
        super().__init__(id, sock, address, nsqd)
        self._poller = poller
        self._poll = poll  # the poller thread's epoll it is registered with
        self._connection_thread = 0  # the thread serving its commands now (0: none)
        self._fd = sock.fileno()
        self._poll_lock = threading.Lock()  # guards _reading and the epoll registration
        self._reading = SERVING  # (the poller holds it as it is made)
        # An input edge the poller saw while a thread served the connection (under _poll_lock): the
        # thread registers it again as it parks it, so that the bytes behind the edge are read.
        self.input_seen = False
        self._pump_queued = False
        self._sock_closed = False  # (under _write_lock: torn down, nothing more is written)
        self.proto = None  # its ProtocolV2 (set by the poller once made)
        self._hb_every = None  # the heartbeat interval the ticker runs at (None: not started)
        self._hb_at = None  # the next heartbeat (None: none)
        self._idle_since = time.monotonic()  # when its last command was answered (the read deadline's start)
        self._timer_at = None  # the time of its entry in the poller's heap (None: none)
        # What its heap entries refer to (not the connection itself: an entry left behind by an
        # earlier one, or by the teardown, must not keep an ended connection alive); emptied at teardown.
        self.timer_slot = [self]

    # -- output: never blocks ------------------------------------------------

    def send(self, data):
        """Write now what the socket takes; the rest waits for ``EPOLLOUT``.  False if the connection failed."""
        with self._write_lock:
            if self._sock_closed:
                return False
            encode = self._encode
            if encode is not None:
                data = encode(data)
            return self._write_locked(data)

    def _write_locked(self, data):
        pending = self.output_backlog
        if pending is not None:
            pending += data
            return True
        sent = self._send_nowait_locked(data)
        if sent is None:
            return False
        if sent < len(data):
            self.output_backlog = bytearray(memoryview(data)[sent:])
            self._poller.want_output(self)
        return True

    def _send_nowait_locked(self, data):
        """One send that never blocks: the bytes taken (0 when the socket is full); None when the
        connection failed (it is closing: the backlog is dropped, nothing more can be written)."""
        try:
            return self._sock.send(data, DONTWAIT)
        except BlockingIOError:
            return 0
        except OSError:
            self.output_backlog = None
            self.close_connection()
            return None

    def deliver_held(self, msgs):
        """Write a batch taken while the output was held (a direct delivery), release the output.

        (:meth:`_write_locked` and :meth:`_send_nowait_locked` inline: a consumer at RDY 1 gets
        each message this way, one per FIN.)
        """
        try:
            if msgs and not self._sock_closed:
                data = protocol_v2.joined_message_frames(msgs)
                backlog = self.output_backlog
                if backlog is not None:
                    backlog += data
                    return
                try:
                    sent = self._sock.send(data, DONTWAIT)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    self.output_backlog = None
                    self.close_connection()
                    return
                if sent < len(data):
                    self.output_backlog = bytearray(memoryview(data)[sent:])
                    self._poller.want_output(self)
        finally:
            self._write_lock.release()

    def output_backlogged(self):
        """True while more than :data:`BACKLOG_LIMIT` bytes wait for the socket (a hint, no lock)."""
        pending = self.output_backlog
        return pending is not None and len(pending) > BACKLOG_LIMIT

    def flush(self):
        """``EPOLLOUT``: write the backlog; True once it is all written or never can be (the
        connection failed: it is closing), False while it waits on."""
        with self._write_lock:
            pending = self.output_backlog
            if pending is None or self._sock_closed:
                return pending is None
            sent = self._send_nowait_locked(pending)
            if sent is None:
                return True
            del pending[:sent]
            if pending:
                return False
            self.output_backlog = None
            return True

    def input_waiting(self):
        """Whether the socket holds unread bytes (or its end): a parked connection's readiness
        event is then pending."""
        try:
            self._sock.recv(1, _PEEK)  # (b"": its end)
        except (BlockingIOError, ValueError):
            return False
        except OSError:
            pass  # (its error ends it when served)
        return True

    def _next_heartbeat_at(self):
        return self._hb_at  # (the poller's timer)

    def heartbeat_now(self):
        """A heartbeat at once (see :meth:`ClientConnection.clock_skipped`)."""
        if self.heartbeat_interval > 0 and not self.disconnected:
            with self._write_lock:  # (held only for a write that never blocks)
                self._heartbeat_locked()

    def _heartbeat_locked(self):
        """Write a heartbeat (``_write_lock`` held; never blocks: what waits joins the backlog)."""
        if not self._sock_closed:
            encode = self._encode
            self._write_locked(encode(protocol_v2.HEARTBEAT_FRAME) if encode is not None
                               else protocol_v2.HEARTBEAT_FRAME)

    def try_heartbeat(self):
        """Send a heartbeat unless the output is busy this instant (False: try again soon)."""
        if not self._write_lock.acquire(False):
            return False
        try:
            self._heartbeat_locked()
        finally:
            self._write_lock.release()
        return True

    def close_socket(self, server):
        """The teardown's last step: ``server`` (the listener) closes the socket; no write follows."""
        with self._write_lock:
            self._sock_closed = True
            self.output_backlog = None
            server.close_request_alone(self._sock)

    # -- the pump as a task ----------------------------------------------------

    def _wake(self, may_defer):
        with self._lock:
            if self._closing:
                return
            if self._pump_queued:  # (queued or running: it looks again before it ends)
                self._woken = True
                return
            if may_defer and threading.get_ident() == self._connection_thread:
                self.pump_deferred = True  # (its answer first: see ClientConnection.wake)
                return
            self.pump_deferred = False
            if not (self.ready_count > 0 and self.state == STATE_SUBSCRIBED):
                return
            self._pump_queued = True
            self._pump_asleep = False
            self._woken = False
        self._poller.submit(self.run_pump)

    def run_pump(self):
        """The pump task (a worker): take messages from the channel and write them, until the
        channel has none for this consumer or its output backlog waits for the socket."""
        while True:
            channel = self.channel
            if channel is not None and self.state == STATE_SUBSCRIBED:
                while self.output_backlog is None:
                    msgs = channel.take(self, DELIVERY_BATCH)
                    if not msgs:
                        break
                    if not self._send_messages(msgs):
                        break
            with self._lock:
                if self._woken and not self._closing:
                    self._woken = False
                    continue
                self._pump_queued = False
                self._pump_asleep = True
                return

    def has_pump(self):
        return False  # (no thread to join)

    def stop_pump(self, wake=True):
        with self._lock:
            self._closing = True
