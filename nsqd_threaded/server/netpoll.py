"""NetPoller: a connection holds a thread only while it has work.

Go nsqd gives each connection two goroutines, IOLoop (read a command,
execute it, answer) and messagePump (deliveries and heartbeats), and its
runtime parks a goroutine that waits on a socket in the network poller,
without an OS thread.  This module is that poller, mapped onto threads:

* **epoll is the network poller.**  A connection between two commands is
  registered with it (``EPOLLONESHOT``) and owns no thread.
* **The poller thread** (``nsqd-netpoll``) waits in ``epoll_wait`` and serves
  what it returns, in one batch: the commands that have arrived on each
  ready connection run right there, one connection after the other, with no
  hand-off between threads.  A FIN's refill is written by the same thread
  (the channel's direct delivery).  The poller never waits: a command that
  may (:attr:`ProtocolV2.waits <nsqd_threaded.server.protocol_v2.ProtocolV2.waits>`:
  AUTH's auth server, IDENTIFY's TLS handshake, SUB's auth server, durable
  queue or nsqlookupd query, a publish under auth or ``--durable``), or
  whose body has not all arrived, is given back
  whole (:meth:`Reader.rewind_command <nsqd_threaded.server.reader.Reader.rewind_command>`)
  and its connection handed to a worker.
* **Workers** (``nsqd-worker-N``) run the protocol's synchronous code for a
  connection as its own thread once did, until the connection has nothing
  more to read; it then goes back to epoll.  There are as many as there is
  work that waits: an idle worker takes the next task, a task that finds
  none idle starts one, and one idle for :data:`WORKER_LINGER` seconds
  ends (one always stays).
* **The message pump is a task, not a thread.**  A consumer's wake-up queues
  its pump for a worker, which takes messages from the channel and writes
  them without blocking.  Bytes the socket does not take wait in the
  connection's output backlog for ``EPOLLOUT``, with no thread held; while
  the backlog is over :data:`BACKLOG_LIMIT` the connection's commands are
  not read either (as Go's IOLoop blocks in a write).
* **Timers are the poller's**: one heap entry per connection, for its next
  heartbeat or the read deadline of its next command (twice the heartbeat
  interval, as nsqd's), whichever comes first.

Who runs what::

    accept thread ──add──▶ epoll ◀──────────── re-arm (ONESHOT) ─────────┐
                             │ ready                                     │
                             ▼                                           │
                     nsqd-netpoll-N: magic, FIN RDY REQ TOUCH NOP CLS,   │
                     IDENTIFY SUB and publishes that cannot wait, with  ─┤
                     their bodies buffered; heartbeats, deadlines,       │
                     EPOLLOUT flushes                                    │
                             │ may wait / pump due                       │
                             ▼                                           │
                     nsqd-worker-N: what may wait, bodies to come,      ─┘
                     durable publishes, message pumps

Linux only (epoll); elsewhere :func:`new_net_poller` returns None and each
connection has its own thread (:mod:`nsqd_threaded.server.connection`).
"""

import collections
import heapq
import itertools
import os
import select
import socket
import threading
import time
import traceback

from ..broker.client import STATE_SUBSCRIBED
from ..internal.process import malloc_trim
from ..wire import protocol_v2
from .connection import DELIVERY_BATCH, HEARTBEAT_LATE, ClientConnection
from .protocol_v2 import ENDED, MORE, NEEDS_THREAD, WAIT_INPUT, WAIT_OUTPUT, ProtocolV2, tear_down

WORKER_LINGER = 5.0  # seconds an idle worker waits for a task before it ends (one always stays)
MIN_WORKERS = 1  # workers kept however idle: a task never waits for a thread to start
POOL_SIZE = 4  # workers started as tasks come; more only for a queue that stalls
STALL_AFTER = 0.01  # seconds the oldest queued task may wait before the poller adds a worker
# Poller threads (each with its epoll; the connections dealt out among them).  One: two were measured
# to hand the interpreter lock back and forth on every wake-up (a single PUB round trip took twice the
# CPU, and 1,000 consumers at RDY 1 got 20,000 msg/s instead of 35,000: docs/performance.md).
POLLERS = 1
INLINE_LIMIT = 64  # commands of one connection the poller runs per wake-up before the next connection's
WORKER_LIMIT = 256  # commands a worker runs for one connection before the tasks queued behind it
NEXT_COMMAND_WAIT = 0.002  # seconds a worker waits for a connection's next command before parking it
MAX_EVENTS = 1024  # the most events taken from one epoll_wait
BACKLOG_LIMIT = 1 << 20  # output bytes waiting for EPOLLOUT over which a connection's commands are not read
TRIM_AFTER_CLOSED = 256  # connections closed since the last trim that make one worth it
TRIM_QUIET = 1.0  # seconds without a close before the timer poller trims
HEARTBEAT_RETRY = 0.005  # seconds before a heartbeat whose write was busy is tried again
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_PEEK = socket.MSG_PEEK | _DONTWAIT
if hasattr(select, "epoll"):
    _EPOLLRDHUP = getattr(select, "EPOLLRDHUP", 0x2000)  # (PyPy 3.9 lacks the name; Linux's value)
    _WANT_INPUT = select.EPOLLIN | _EPOLLRDHUP
    _WANT_OUTPUT = select.EPOLLOUT
    _ONESHOT = select.EPOLLONESHOT
    _PARKED_MASK = _WANT_INPUT | _ONESHOT
    _INPUT_EVENTS = select.EPOLLIN | _EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
    _OUTPUT_EVENTS = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR

# What a connection's reading waits for (PolledConnection._reading).
PARKED = 0  # the next command: registered for input, no thread
SERVING = 1  # a thread (the poller or a worker) is running its commands
BLOCKED = 2  # its output backlog: registered for output, commands not read
GONE = 3  # torn down


def new_net_poller(nsqd, limits):
    """A NetPoller where the platform has epoll (Linux), else None (a thread per connection)."""
    if not hasattr(select, "epoll") or not _DONTWAIT:
        return None
    return NetPoller(nsqd, limits)


class PolledConnection(ClientConnection):
    """A :class:`ClientConnection` served by a :class:`NetPoller`: no thread of its own.

    Writes never block: what the socket does not take joins the output
    backlog (``output_backlog``, a bytearray here), written on ``EPOLLOUT``.  The
    pump is a task (:meth:`run_pump`) a wake-up queues for a worker.

    Locks (beside the Client's ``_lock`` and the ``_write_lock``):
    * ``_poll_lock`` guards ``_reading`` and the socket's epoll registration
      (every re-arm is computed and made under it).  Order: ``_write_lock``
      -> ``_poll_lock`` (a write that leaves a backlog arms ``EPOLLOUT``).
    * the Client's ``_lock`` also guards ``_pump_queued`` (the pump task is
      queued or running; ``_woken`` asks it to look again).
    * ``_hb_every``, ``_hb_at``, ``_idle_since`` and ``_timer_at`` are the
      serving thread's and the poller's: each is written by whichever holds
      the connection (its serving thread, or the poller while it is parked).
    """

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
            return self._sock.send(data, _DONTWAIT)
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
                    sent = self._sock.send(data, _DONTWAIT)
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
            server.shutdown_request(self._sock)

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



def _read_deadline(conn, hb):
    """When ``conn`` must have sent its next command: nsqd's two heartbeat intervals after it went
    idle, or one after a heartbeat that went out late (see ``late_heartbeat_at``), whichever is later."""
    deadline = conn._idle_since + 2 * hb
    late = conn.late_heartbeat_at
    if late is not None and late + hb > deadline:
        return late + hb
    return deadline


class _Newcomer:
    """An accepted connection whose protocol magic has not all arrived yet (its poller's)."""

    __slots__ = ("sock", "address", "magic", "poll")

    def __init__(self, sock, address, poll):
        self.sock = sock
        self.address = address
        self.magic = b""
        self.poll = poll


class _Poll:
    """One poller thread's epoll and the pipe that wakes it."""

    def __init__(self, index):
        self.index = index
        self.epoll = select.epoll()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.epoll.register(self.wake_r, select.EPOLLIN)
        self.thread = None
        # True from the moment epoll_wait returns until what it returned is served (written by the
        # poller thread only, read by time skipping: see NetPoller.settled).  Before it is set, what
        # woke the poller is still visible from outside: unread bytes, an output backlog, a due timer.
        self.serving = False

    def wake(self):
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:
            pass  # (already woken)

    def close(self):
        self.epoll.close()
        os.close(self.wake_r)
        os.close(self.wake_w)


class _Worker:
    """One worker thread's hand-off slot: the task given to it while idle, and the Event that signals it."""

    __slots__ = ("thread", "task", "given")

    def __init__(self):
        self.thread = None
        self.task = None
        self.given = threading.Event()  # signals: a task was handed to this idle worker (or stop)


class NetPoller:
    """The epoll loop, its timers and its workers, for one NSQD's TCP listener.

    Owned by the :class:`~nsqd_threaded.server.tcp.TCPServer`: :meth:`start`
    with the listener, :meth:`stop` once its connections are shut down
    (it tears down what is left and joins every thread it started).

    ``_lock`` guards ``_conns`` (fd -> PolledConnection or _Newcomer),
    ``_timers`` (a heap of (when, seq, a connection's ``timer_slot``)), ``_tasks`` (queued when
    no worker is idle), ``_idle`` (idle workers, the last to idle first),
    ``_workers``, ``_ended`` (workers that left, to join), ``_busy`` (workers
    not idle), ``_queued_since``, ``_closed_since_trim``, ``_last_close``,
    ``_polls_started`` and ``_stopping``.

    After a mass close (:data:`TRIM_AFTER_CLOSED` connections, then
    :data:`TRIM_QUIET` seconds without one) the timer poller calls glibc's
    ``malloc_trim(0)``: buffers freed in the middle of an arena's heap go
    back to the kernel only when a trim walks it.
    """

    def __init__(self, nsqd, limits):
        self._nsqd = nsqd
        self._log = nsqd.log
        self._limits = limits
        self._server = None
        # POLLERS pollers, each its own epoll and thread, the connections dealt out in turn (one by
        # default: see POLLERS.  Go's one epoll is polled by whichever processor is idle).
        self._polls = [_Poll(i) for i in range(POLLERS)]
        self._timer_poll = self._polls[0]  # the one that fires the timers and watches the queue
        self._next_poll = itertools.count()
        self._lock = threading.Lock()
        self._conns = {}
        self._timers = []
        self._seq = itertools.count()
        self._tasks = collections.deque()
        self._idle = []
        self._workers = set()
        self._ended = []
        self._worker_names = itertools.count(1)
        self._busy = 0
        self._queued_since = None  # when a task last queued with no worker idle (None: no queue)
        # Memory back after a mass close: closes since the last trim, and when the last was.
        self._trim = malloc_trim()
        self._closed_since_trim = 0
        self._last_close = 0.0
        self._stopping = False
        self._polls_started = False

    # -- lifecycle ---------------------------------------------------------------

    def start(self, server):
        """Serve ``server``'s connections (it calls :meth:`add` for each accepted one).  The poller
        threads start with the first connection, the workers with the first task: a broker that
        never has a TCP client (a test's, driven over HTTP) never pays for them."""
        self._server = server

    def _start_polls_locked(self):
        self._polls_started = True
        for poll in self._polls:
            poll.thread = threading.Thread(target=self._run, args=(poll,), name="nsqd-netpoll-%d" % poll.index,
                                           daemon=True)
            poll.thread.start()

    def stop(self):
        """After the listener shut its connections down: tear down what is left, join every thread."""
        with self._lock:
            self._stopping = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.given.set()
        for poll in self._polls:
            poll.wake()
        for poll in self._polls:
            if poll.thread is not None:
                poll.thread.join()
        with self._lock:
            workers = list(self._workers) + self._ended
        for worker in workers:
            worker.given.set()
            worker.thread.join()
        for poll in self._polls:
            poll.close()

    def _wake(self):
        self._timer_poll.wake()

    # -- connections -----------------------------------------------------------------

    def add(self, sock, address):
        """A connection the listener accepted (its accept thread): wait for its magic."""
        fd = sock.fileno()
        poll = self._polls[next(self._next_poll) % len(self._polls)]
        with self._lock:
            if not self._polls_started:
                self._start_polls_locked()
            self._conns[fd] = _Newcomer(sock, address, poll)
        poll.epoll.register(fd, _WANT_INPUT | _ONESHOT)

    def busy(self):
        """True while a worker runs a task or one is queued: a command or a delivery under way
        (what time skipping waits out, as it waits out a connection thread's work)."""
        with self._lock:
            return self._busy > 0 or bool(self._tasks)

    def settled(self):
        """True when nothing is under way here that no socket shows: no poller serving what its epoll
        returned, no worker task running or queued, no connection with an output backlog, no timer
        due and not fired.  With no unread byte on any connection besides (the caller looks), a
        command cannot be in progress: time skipping's precise look (auto_skip.settled)."""
        if any(poll.serving for poll in self._polls):
            return False
        now = time.monotonic()
        with self._lock:
            if self._busy > 0 or self._tasks or (self._timers and self._timers[0][0] <= now):
                return False
            conns = list(self._conns.values())
        return not any(getattr(conn, "output_backlog", None) is not None for conn in conns)

    def connection_count(self):
        with self._lock:
            return len(self._conns)

    def want_output(self, conn):
        """``conn`` has an output backlog (its ``_write_lock`` held): arm ``EPOLLOUT``."""
        with conn._poll_lock:
            self._arm_locked(conn)

    def _arm_locked(self, conn):
        """Register what ``conn`` waits for now (its ``_poll_lock`` held)."""
        reading = conn._reading
        if reading == GONE:
            return
        mask = _WANT_INPUT if reading == PARKED else 0
        if conn.output_backlog is not None:
            mask |= _WANT_OUTPUT
        if mask:
            try:
                conn._poll.epoll.modify(conn._fd, mask | _ONESHOT)
            except (OSError, ValueError):
                pass  # (the socket is being torn down)

    # -- the poller thread ---------------------------------------------------------------

    def _run(self, poll):
        """A poller thread: wait in its epoll, serve what it returns (the timer poller: fire the timers)."""
        epoll = poll.epoll
        timers = poll is self._timer_poll
        again = []  # connections whose commands outran INLINE_LIMIT: served again after the batch
        while True:
            timeout = 0 if again else self._next_timeout(timers)
            poll.serving = False
            try:
                events = epoll.poll(timeout, MAX_EVENTS)
            except InterruptedError:
                continue
            poll.serving = True
            self._dispatch(poll, events, again)
            if again:
                batch, again = again, []
                self._serve_again(batch, again)
            if timers:
                self._fire_timers()
            if self._stopping and self._wind_down():
                return

    def _dispatch(self, poll, events, again):
        """Serve one epoll_wait's events (a method of its own: no connection stays referenced by
        the poller's frame while it sleeps, so an ended one is freed at once)."""
        wake_r = poll.wake_r
        conns = self._conns
        for fd, event in events:
            if fd == wake_r:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                continue
            conn = conns.get(fd)
            if conn is None:
                continue
            try:
                if type(conn) is _Newcomer:
                    self._greet(fd, conn)
                else:
                    self._on_event(conn, event, again)
            except Exception:  # noqa: BLE001 - one connection's bug must not stop the poller
                self._log.error("%r: poller error\n%s", conn, traceback.format_exc())

    def _serve_again(self, batch, again):
        for conn in batch:
            if conn._reading == SERVING:
                self._serve(conn, True, again)

    def _greet(self, fd, newcomer):
        """Read the protocol magic; once whole, the connection becomes a client and is served."""
        sock = newcomer.sock
        try:
            chunk = sock.recv(4 - len(newcomer.magic), _DONTWAIT)
        except BlockingIOError:
            chunk = None
        except OSError:
            chunk = b""
        if chunk == b"":
            self._forget(fd, newcomer.poll)
            self._server.shutdown_request(sock)
            return
        if chunk:
            newcomer.magic += chunk
        if len(newcomer.magic) < 4:
            newcomer.poll.epoll.modify(fd, _WANT_INPUT | _ONESHOT)
            return
        if newcomer.magic != protocol_v2.MAGIC_V2:
            try:
                sock.send(protocol_v2.BAD_PROTOCOL_FRAME, _DONTWAIT)
            except OSError:
                pass
            self._forget(fd, newcomer.poll)
            self._server.shutdown_request(sock)
            return
        nsqd = self._nsqd
        poll = newcomer.poll
        conn = nsqd.add_client(lambda id: PolledConnection(id, sock, newcomer.address, nsqd, self, poll))
        conn.proto = ProtocolV2(nsqd, conn, sock, self._limits)
        with self._lock:
            self._conns[fd] = conn
        self._schedule(conn, time.monotonic())  # (its heartbeats go on while a worker serves it)
        self._serve(conn, True, None)

    def _on_event(self, conn, event, again):
        if event & _OUTPUT_EVENTS and conn.output_backlog is not None:
            if conn.flush() or event & (select.EPOLLHUP | select.EPOLLERR):
                with conn._poll_lock:
                    resume = conn._reading == BLOCKED
                    if resume:
                        conn._reading = SERVING
                if resume:
                    self._serve(conn, True, again)
                    return
                conn.wake()  # (a pump that stopped at the backlog takes more now)
        if event & _INPUT_EVENTS:
            with conn._poll_lock:
                serve = conn._reading == PARKED
                if serve:
                    conn._reading = SERVING
            if serve:
                self._serve(conn, True, again)
                return
        with conn._poll_lock:
            self._arm_locked(conn)

    def _serve(self, conn, inline, again):
        """Run ``conn``'s commands (``inline``: on the poller, which must not wait), then park it,
        hand it on, or tear it down, as its protocol answers."""
        while True:
            conn._connection_thread = threading.get_ident()
            try:
                result = conn.proto.serve_fins() if inline else None
                if result is None:
                    result = conn.proto.serve_ready(inline, INLINE_LIMIT if inline else WORKER_LIMIT)
            except Exception:  # noqa: BLE001 - our bug: logged, and the connection ends
                self._log.error("%r: unhandled error\n%s", conn, traceback.format_exc())
                result = ENDED
            finally:
                conn._connection_thread = 0
            if conn.pump_deferred:
                conn.start_deferred_pump()
            if inline or result != WAIT_INPUT or not self._next_command_soon(conn):
                break
        if result == ENDED:
            self._end(conn)
            return
        if result == NEEDS_THREAD or (result == MORE and not inline):
            self.submit(lambda: self._serve(conn, False, None))
            return
        if result == MORE:
            if again is None:
                self.submit(lambda: self._serve(conn, False, None))
            else:
                again.append(conn)
            return
        now = time.monotonic()
        if not conn.proto.reader.has_partial():  # (a line begun keeps its deadline: trickling never extends it)
            conn._idle_since = now
        with conn._poll_lock:
            if result == WAIT_OUTPUT:
                if conn.output_backlogged():
                    conn._reading = BLOCKED
                else:  # (written meanwhile: read on)
                    self.submit(lambda: self._serve(conn, False, None))
                    return
                self._arm_locked(conn)
            else:
                conn._reading = PARKED
                # (_arm_locked for a parked connection, inline: once per command served)
                try:
                    conn._poll.epoll.modify(conn._fd, _PARKED_MASK if conn.output_backlog is None
                                            else _PARKED_MASK | _WANT_OUTPUT)
                except (OSError, ValueError):
                    pass  # (the socket is being torn down)
        # (_schedule's usual answer, inline: the entry for its next heartbeat is there, and comes first)
        hb = conn.heartbeat_interval
        queued = conn._timer_at
        if queued is None or hb != conn._hb_every or hb <= 0 or queued > conn._hb_at:
            self._schedule(conn, now)

    def _next_command_soon(self, conn):
        """A worker has served what arrived: whether the next command comes within
        :data:`NEXT_COMMAND_WAIT` (served here then).  A client that waits on each answer (a
        durable PUB waits for its fsync) sends the next one a round trip later: caught here, it
        skips the way back through the poller and the hand-off to a worker again."""
        if conn.disconnected or self._stopping:
            return False
        return conn.proto.reader.wait_for_command(NEXT_COMMAND_WAIT)

    def _end(self, conn):
        """Tear ``conn`` down once: leave its channel, forget its socket, close it."""
        with conn._poll_lock:
            if conn._reading == GONE:
                return
            conn._reading = GONE
        conn.stop_pump()
        self._forget(conn._fd, conn._poll)
        with self._lock:
            self._closed_since_trim += 1
            self._last_close = time.monotonic()
        try:
            tear_down(self._nsqd, conn, conn.proto)
        finally:
            conn.close_socket(self._server)
            conn.proto = None  # (the protocol refers to its client: no cycle left for the collector)
            conn.timer_slot[0] = None  # (nor the slot: its heap entries go stale)

    def _forget(self, fd, poll):
        with self._lock:
            self._conns.pop(fd, None)
        try:
            poll.epoll.unregister(fd)
        except (OSError, ValueError):
            pass

    # -- timers: heartbeats and read deadlines -------------------------------------------

    def _schedule(self, conn, now):
        """Put ``conn``'s next timer in the heap unless an entry as early is there."""
        hb = conn.heartbeat_interval
        queued = conn._timer_at
        if queued is not None and hb == conn._hb_every and hb > 0 and queued <= conn._hb_at:
            return  # (the usual case: the entry for its next heartbeat is there, and comes first)
        if hb != conn._hb_every:  # the first time, or IDENTIFY changed it: the ticker restarts
            conn._hb_every = hb
            conn._hb_at = now + hb if hb > 0 else None
        when = conn._hb_at
        if hb > 0:
            deadline = _read_deadline(conn, hb)
            if when is None or deadline < when:
                when = deadline
        if when is None:
            return
        if queued is not None and queued <= when:
            return
        conn._timer_at = when
        with self._lock:
            timers = self._timers
            earliest = not timers or when < timers[0][0]
            heapq.heappush(timers, (when, next(self._seq), conn.timer_slot))
        if earliest and threading.get_ident() != self._timer_poll.thread.ident:
            self._wake()  # (the poller sleeps until the earliest it knew of)

    def _next_timeout(self, timers):
        """Seconds until the next timer or stall check (0 when one is overdue), -1 when there is none;
        ``timers``: the timer poller's."""
        if not timers:
            return 0.05 if self._stopping else -1
        now = time.monotonic()
        stall = self._check_stall(now) if self._queued_since is not None else None  # (a hint: set under _lock)
        waits = [] if stall is None else [stall]
        with self._lock:
            if self._timers:
                waits.append(self._timers[0][0] - now)
            if self._closed_since_trim >= TRIM_AFTER_CLOSED and self._trim is not None:
                waits.append(self._last_close + TRIM_QUIET - now)
            if self._stopping:
                waits.append(0.05)
        return max(0.0, min(waits)) if waits else -1

    def _fire_timers(self):
        now = time.monotonic()
        timers = self._timers
        # (a hint without the lock: a timer pushed meanwhile wakes this poller if it is the earliest)
        if (not timers or timers[0][0] > now) and self._closed_since_trim < TRIM_AFTER_CLOSED:
            return
        due = []
        with self._lock:
            trim = (self._trim is not None and self._closed_since_trim >= TRIM_AFTER_CLOSED
                    and now - self._last_close >= TRIM_QUIET)
            if trim:
                self._closed_since_trim = 0
            timers = self._timers
            while timers and timers[0][0] <= now:
                when, _, slot = heapq.heappop(timers)
                conn = slot[0]
                if conn is not None and conn._timer_at == when:
                    due.append(conn)
        if trim:
            self._trim(0)  # (ctypes releases the interpreter lock around it)
        for conn in due:
            conn._timer_at = None
            reading = conn._reading
            if reading == GONE:
                continue
            hb = conn._hb_every
            if conn._hb_at is not None and now >= conn._hb_at:
                if conn.try_heartbeat():
                    if now - conn._hb_at > hb * HEARTBEAT_LATE:
                        conn.late_heartbeat_at = now
                    conn.skipped_since_heartbeat = 0.0
                    # A fixed ticker: missed ticks are skipped, not sent in a burst.
                    conn._hb_at += hb * (1 + int((now - conn._hb_at) // hb))
                else:
                    conn._hb_at = now + HEARTBEAT_RETRY
            if hb and hb > 0 and reading in (PARKED, BLOCKED) and now >= _read_deadline(conn, hb):
                if reading == PARKED and conn.input_waiting():
                    continue  # sent in time, and this poller was late to read it: its event serves it
                self._log.debug("%r: connection closed - i/o timeout", conn)
                conn.close_connection()
                if reading == BLOCKED:
                    self._end(conn)
                continue
            self._schedule(conn, now)

    # -- workers -------------------------------------------------------------------------

    def submit(self, task):
        """Run ``task`` on a worker: an idle one, else a new one while there are fewer than
        :data:`POOL_SIZE`, else the next to free up (the poller adds one if that takes longer
        than :data:`STALL_AFTER`: the busy ones may be waiting on slow clients)."""
        with self._lock:
            if self._idle:
                worker = self._idle.pop()
                worker.task = task
                self._busy += 1
                worker.given.set()
                return
            self._tasks.append(task)
            if len(self._workers) < POOL_SIZE:
                self._start_worker_locked()
                return
            if self._queued_since is not None:
                return
            self._queued_since = time.monotonic()
        self._wake()  # (the poller watches how long the queue waits)

    def _check_stall(self, now):
        """The poller: a task queued for longer than STALL_AFTER gets a worker of its own."""
        with self._lock:
            since = self._queued_since
            if since is None:
                return None
            if not self._tasks:
                self._queued_since = None
                return None
            if now - since < STALL_AFTER:
                return since + STALL_AFTER - now
            self._queued_since = now
            self._start_worker_locked()
            return STALL_AFTER

    def _start_worker_locked(self):
        worker = _Worker()
        worker.thread = threading.Thread(target=self._work, args=(worker,),
                                         name="nsqd-worker-%d" % next(self._worker_names), daemon=True)
        try:
            worker.thread.start()
        except RuntimeError as e:  # the host's task limit: the queued tasks wait for a busy worker
            if self._limits is not None:
                self._limits.hit("thread", "cannot start a worker thread - %s" % e,
                                 "raise the task limit (ulimit -u, systemd TasksMax, pids cgroup)")
            return
        self._workers.add(worker)
        self._busy += 1  # (it starts by looking at the queue)
        if self._ended:
            self._ended = [w for w in self._ended if w.thread.is_alive()]

    def _work(self, worker):
        """A worker thread: run the queued tasks, then wait idle for one handed to it."""
        task = None
        while True:
            if task is not None:
                try:
                    task()
                except Exception:  # noqa: BLE001 - logged; the worker goes on
                    self._log.error("nsqd worker: unhandled error\n%s", traceback.format_exc())
                task = None
            with self._lock:
                if self._tasks:
                    task = self._tasks.popleft()
                    continue
                self._busy -= 1
                if self._stopping:
                    return
                worker.given.clear()
                worker.task = None
                self._idle.append(worker)
            task = self._wait_for_task(worker)
            if task is None:
                return

    def _wait_for_task(self, worker):
        """Idle: the task handed to ``worker``, or None when it ends (stopping, or idle too long)."""
        while True:
            worker.given.wait(WORKER_LINGER)
            with self._lock:
                task, worker.task = worker.task, None
                if task is not None:  # (submit took it off _idle and counted it busy)
                    return task
                if self._stopping:  # (stop emptied _idle)
                    return None
                if len(self._workers) > MIN_WORKERS:
                    self._idle.remove(worker)
                    self._workers.discard(worker)
                    self._ended.append(worker)
                    return None

    def _wind_down(self):
        """Stopping: end every connection no thread serves (once no worker runs: all of them);
        True once none is left and every worker has returned."""
        with self._lock:
            conns = list(self._conns.items())
            busy = self._busy
            if not busy:
                self._tasks.clear()  # (queued after the workers left: nothing runs them)
        for fd, conn in conns:
            if type(conn) is _Newcomer:
                self._forget(fd, conn.poll)
                self._server.shutdown_request(conn.sock)
            elif conn._reading != SERVING or not busy:
                self._end(conn)
        with self._lock:
            return not self._conns and not self._busy
