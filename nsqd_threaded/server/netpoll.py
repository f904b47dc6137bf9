"""NetPoller: a connection holds a thread only while it has work.

Go nsqd gives each connection two goroutines, IOLoop (read a command,
execute it, answer) and messagePump (deliveries and heartbeats), and its
runtime parks a goroutine that waits on a socket in the network poller,
without an OS thread.  This module is that poller, mapped onto threads:

* **epoll is the network poller.**  A connection between two commands is
  registered with it and owns no thread.  The registration is made once
  as the connection is accepted, edge-triggered (``EPOLLET``), as Go's
  netpoller makes it: a connection parked after a recv that drained its
  socket costs no ``epoll_ctl``, as the next byte to arrive is an edge.
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
* **Workers** (``nsqd-worker-N``, :mod:`.workers`) run the protocol's
  synchronous code for a connection as its own thread once did, until the
  connection has nothing more to read; it then goes back to epoll.  There
  are as many as there is work that waits.
* **The message pump is a task, not a thread.**  A consumer's wake-up queues
  its pump for a worker, which takes messages from the channel and writes
  them without blocking (:mod:`.polled_connection`).  Bytes the socket does not take wait in the
  connection's output backlog for ``EPOLLOUT``, with no thread held; while
  the backlog is over :data:`BACKLOG_LIMIT` the connection's commands are
  not read either (as Go's IOLoop blocks in a write).
* **Timers are the poller's**: one heap entry per connection, for its next
  heartbeat or the read deadline of its next command (twice the heartbeat
  interval, as nsqd's), whichever comes first.

Who runs what::

    accept thread ──add──▶ epoll ◀─────── park (an edge: no syscall) ─────┐
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

import heapq
import itertools
import os
import select
import threading
import time
import traceback

from ..internal.process import malloc_trim
from ..wire import protocol_v2
from .connection import HEARTBEAT_LATE
from .polled_connection import BLOCKED, DONTWAIT, GONE, PARKED, SERVING, PolledConnection
from .protocol_v2 import ENDED, MORE, NEEDS_THREAD, WAIT_INPUT, WAIT_OUTPUT, ProtocolV2, tear_down
from .workers import WorkerPool

# Poller threads (each with its epoll; the connections dealt out among them).  One: two were measured
# to hand the interpreter lock back and forth on every wake-up (a single PUB round trip took twice the
# CPU, and 1,000 consumers at RDY 1 got 20,000 msg/s instead of 35,000: docs/performance.md).
POLLERS = 1
GREETING_RECV = 4096  # bytes a newcomer's first recv asks for: the magic and the first commands after it
INLINE_LIMIT = 64  # commands of one connection the poller runs per wake-up before the next connection's
WORKER_LIMIT = 256  # commands a worker runs for one connection before the tasks queued behind it
NEXT_COMMAND_WAIT = 0.002  # seconds a worker waits for a connection's next command before parking it
MAX_EVENTS = 1024  # the most events taken from one epoll_wait
TRIM_AFTER_CLOSED = 256  # connections closed since the last trim that make one worth it
TRIM_QUIET = 1.0  # seconds without a close before the timer poller trims
HEARTBEAT_RETRY = 0.005  # seconds before a heartbeat whose write was busy is tried again
if hasattr(select, "epoll"):
    _EPOLLRDHUP = getattr(select, "EPOLLRDHUP", 0x2000)  # (PyPy 3.9 lacks the name; Linux's value)
    _EPOLLIN = select.EPOLLIN
    _WANT_INPUT = select.EPOLLIN | _EPOLLRDHUP
    _WANT_OUTPUT = select.EPOLLOUT
    _EDGE = getattr(select, "EPOLLET", 1 << 31)
    # A connection's registration, made once as it is accepted: edge-triggered, so that greeting it
    # and parking it after a command cost no epoll_ctl (see NetPoller._greet and _serve); EPOLLOUT
    # only while it has an output backlog (a unix socket reports every read of its peer's as one).
    _SERVED_MASK = _WANT_INPUT | _EDGE
    _BACKLOG_MASK = _WANT_INPUT | _WANT_OUTPUT | _EDGE
    _INPUT_EVENTS = select.EPOLLIN | _EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
    _OUTPUT_EVENTS = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR
    _END_EVENTS = _EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR



def new_net_poller(nsqd, limits):
    """A NetPoller where the platform has epoll (Linux), else None (a thread per connection)."""
    if not hasattr(select, "epoll") or not DONTWAIT:
        return None
    return NetPoller(nsqd, limits)


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
    _reading = None  # (not a client's: never PARKED)

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
        self.ident = None  # its thread's (threading.get_ident)
        self.now = 0.0  # time.monotonic() as epoll_wait returned (the poller thread's)
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


class NetPoller:
    """The epoll loop, its timers and its workers, for one NSQD's TCP listener.

    Owned by the :class:`~nsqd_threaded.server.tcp.TCPServer`: :meth:`start`
    with the listener, :meth:`stop` once its connections are shut down
    (it tears down what is left and joins every thread it started).

    ``_lock`` guards ``_conns`` (fd -> PolledConnection or _Newcomer),
    ``_timers`` (a heap of (when, seq, a connection's ``timer_slot``)),
    ``_closed_since_trim``, ``_last_close``, ``_polls_started`` and
    ``_stopping``.  Its workers are a :class:`~.workers.WorkerPool`, with a
    lock of its own (``submit`` hands it a task).

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
        self._pool = WorkerPool(self._log, limits, self._wake)
        self.submit = self._pool.submit  # run a task on a worker (see WorkerPool.submit)
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
        self._pool.stop()
        for poll in self._polls:
            poll.wake()
        for poll in self._polls:
            if poll.thread is not None:
                poll.thread.join()
        self._pool.join()
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
        # Its registration for good: edge-triggered from the start, so that greeting it costs no
        # epoll_ctl (bytes that came before are reported by the first epoll_wait all the same).
        poll.epoll.register(fd, _SERVED_MASK)

    def busy(self):
        """True while a worker runs a task or one is queued: a command or a delivery under way
        (what time skipping waits out, as it waits out a connection thread's work)."""
        return self._pool.busy()

    def serving(self):
        """True while a poller thread serves what its epoll returned (read without a lock: a hint)."""
        return any(poll.serving for poll in self._polls)

    def settled(self):
        """True when nothing is under way here that no socket shows: no poller serving what its epoll
        returned, no worker task running or queued, no connection with an output backlog, no timer
        due and not fired.  With no unread byte on any connection besides (the caller looks), a
        command cannot be in progress: time skipping's precise look (auto_skip.settled)."""
        if self.serving():
            return False
        if self._pool.busy():
            return False
        now = time.monotonic()
        with self._lock:
            if self._timers and self._timers[0][0] <= now:
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
        """Register ``conn`` again (its ``_poll_lock`` held): for input, and for output while it
        has a backlog.  The kernel looks at the socket as it is registered, and reports what it
        holds already: an edge that came before (one the poller saw while a thread served the
        connection, or while its backlog was not yet set) is not lost."""
        if conn._reading == GONE:
            return
        conn.input_seen = False
        try:
            conn._poll.epoll.modify(conn._fd, _SERVED_MASK if conn.output_backlog is None else _BACKLOG_MASK)
        except (OSError, ValueError):
            pass  # (the socket is being torn down)

    # -- the poller thread ---------------------------------------------------------------

    def _run(self, poll):
        """A poller thread: wait in its epoll, serve what it returns (the timer poller: fire the timers)."""
        epoll = poll.epoll
        poll.ident = threading.get_ident()
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
            poll.now = time.monotonic()
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
                # (the common event first: input alone on a parked connection, such as a
                # consumer's FIN; a _Newcomer is never PARKED)
                if event == _EPOLLIN and conn._reading == PARKED:
                    self._serve_parked(conn, again)
                    continue
                if type(conn) is _Newcomer:
                    self._greet(fd, conn, event)
                else:
                    self._on_event(conn, event, again)
            except Exception:  # noqa: BLE001 - one connection's bug must not stop the poller
                self._log.error("%r: poller error\n%s", conn, traceback.format_exc())

    def _serve_again(self, batch, again):
        for conn in batch:
            if conn._reading == SERVING:
                self._serve(conn, True, again)

    def _greet(self, fd, newcomer, event):
        """Read the protocol magic; once whole, the connection becomes a client and is served.

        One recv takes the magic and what follows (a client sends its IDENTIFY with it): what
        follows is the reader's to serve at once, and a recv that took less than it asked for
        drained the socket, so the next byte is an edge again (the registration is edge-triggered
        from the start: a magic that came in pieces waits for it).  The peer's end that came with
        ``event`` is not an edge again: the connection is served (or forgotten) as it is read."""
        sock = newcomer.sock
        try:
            chunk = sock.recv(GREETING_RECV, DONTWAIT)
        except BlockingIOError:
            return  # (an edge the last recv had read past already)
        except OSError:
            chunk = b""
        if chunk == b"":
            self._forget(fd, newcomer.poll)
            self._server.shutdown_request(sock)
            return
        need = 4 - len(newcomer.magic)
        newcomer.magic += chunk[:need]
        ended = event & _END_EVENTS
        if len(newcomer.magic) < 4:
            if ended:  # (its end came with the start of the magic: no edge is left to wait for)
                self._forget(fd, newcomer.poll)
                self._server.shutdown_request(sock)
            return
        if newcomer.magic != protocol_v2.MAGIC_V2:
            try:
                sock.send(protocol_v2.BAD_PROTOCOL_FRAME, DONTWAIT)
            except OSError:
                pass
            self._forget(fd, newcomer.poll)
            self._server.shutdown_request(sock)
            return
        nsqd = self._nsqd
        poll = newcomer.poll
        conn = nsqd.add_client(lambda id: PolledConnection(id, sock, newcomer.address, nsqd, self, poll))
        conn.proto = ProtocolV2(nsqd, conn, sock, self._limits)
        if len(chunk) > need:
            conn.proto.reader.preload(chunk[need:])
        with self._lock:
            self._conns[fd] = conn
        self._schedule(conn, time.monotonic())  # (its heartbeats go on while a worker serves it)
        # (after an end, the recv asked again meets it: no edge comes for it)
        self._serve(conn, True, None, drained=len(chunk) < GREETING_RECV and not ended)

    def _on_event(self, conn, event, again):
        """An edge on ``conn``'s socket: write its backlog, serve a parked connection's commands.
        An edge on a connection a thread serves is that thread's to read: it is noted
        (``input_seen``), and the thread registers the connection again as it parks it."""
        if event & _OUTPUT_EVENTS and conn.output_backlog is not None:
            if conn.flush() or event & (select.EPOLLHUP | select.EPOLLERR):
                with conn._poll_lock:
                    resume = conn._reading == BLOCKED
                    if resume:
                        conn._reading = SERVING
                    else:
                        self._arm_locked(conn)  # (no backlog now: EPOLLOUT off)
                if resume:
                    self._serve(conn, True, again)
                    return
                conn.wake()  # (a pump that stopped at the backlog takes more now)
        if event & _INPUT_EVENTS:
            with conn._poll_lock:
                serve = conn._reading == PARKED
                if serve:
                    conn._reading = SERVING
                # (the peer's end, or an error, came with this edge: a recv that drains the bytes
                # before it does not see it, and no edge comes for it again)
                if not serve or event & _END_EVENTS:
                    conn.input_seen = True
            if serve:
                self._serve(conn, True, again)

    def _serve_parked(self, conn, again):
        """Input alone on a parked connection: :meth:`_on_event`'s commonest case, a consumer's
        lone FIN first.  If ``serve_fins`` finishes what came, the connection was served with no
        state change: it stays ``PARKED`` throughout, with no ``_poll_lock`` taken, since only the
        poller takes a connection out of ``PARKED`` (workers park or end only those they serve), so
        no other thread can begin to serve it meanwhile; and its registration stands, since what
        came was all read (``serve_fins`` answers :data:`WAIT_INPUT` only then) and the next byte
        is an edge.  Otherwise it is served as :meth:`_on_event` serves it, what was read still
        buffered.
        """
        poll = conn._poll
        conn._connection_thread = poll.ident  # (for wake: see PolledConnection.wake)
        try:
            result = conn.proto.serve_fins()
        except Exception:  # noqa: BLE001 - our bug: logged, and the connection ends
            self._log.error("%r: unhandled error\n%s", conn, traceback.format_exc())
            result = ENDED
        finally:
            conn._connection_thread = 0
        if result is None:
            with conn._poll_lock:
                conn._reading = SERVING
            self._serve(conn, True, again, fins=False)
            return
        if conn.pump_deferred:
            conn.start_deferred_pump()
        if result == ENDED:
            self._end(conn)
            return
        now = poll.now  # (the batch's time: the read deadline starts at most a batch early)
        conn._idle_since = now
        hb = conn.heartbeat_interval
        queued = conn._timer_at
        if queued is None or hb != conn._hb_every or hb <= 0 or queued > conn._hb_at:
            self._schedule(conn, now)

    def _serve(self, conn, inline, again, fins=True, drained=False):
        """Run ``conn``'s commands (``inline``: on the poller, which must not wait), then park it,
        hand it on, or tear it down, as its protocol answers (``fins``: try ``serve_fins`` first,
        unless the caller just did; ``drained``: the caller's recv drained the socket, see
        ``ProtocolV2.serve_ready``)."""
        while True:
            conn._connection_thread = threading.get_ident()
            try:
                result = conn.proto.serve_fins() if inline and fins else None
                if result is None:
                    result = conn.proto.serve_ready(inline, INLINE_LIMIT if inline else WORKER_LIMIT, drained)
                    drained = False
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
                # Edge-triggered: the registration stands, and a byte that arrives after the last
                # recv is an edge the poller sees next.  It is made again only if that recv took
                # all it could (more may be there, with no edge to come), or if an edge came while
                # this thread served (a worker: the poller saw it and left it).
                if conn.input_seen or not conn.proto.reader.drained:
                    self._arm_locked(conn)
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
        # No epoll_ctl(DEL): the close below drops the registration with the descriptor
        # (nothing else holds it), one system call less per connection at a mass close.
        # Until then an event for it finds no connection and is skipped.
        with self._lock:
            self._conns.pop(conn._fd, None)
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
        pool = self._pool
        stall = pool.check_stall(now) if pool.queued_since is not None else None  # (a hint: set under its lock)
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

    def _wind_down(self):
        """Stopping: end every connection no thread serves (once no worker runs: all of them);
        True once none is left and every worker has returned."""
        busy = self._pool.drop_queued_if_idle()  # (queued after the workers left: nothing runs them)
        with self._lock:
            conns = list(self._conns.items())
        for fd, conn in conns:
            if type(conn) is _Newcomer:
                self._forget(fd, conn.poll)
                self._server.shutdown_request(conn.sock)
            elif conn._reading != SERVING or not busy:
                self._end(conn)
        with self._lock:
            return not self._conns and not self._pool.running()
