"""nsq_to_http's ``-n`` concurrent HTTP publishers, driven by one thread over non-blocking sockets.

Go's nsq_to_http runs ``-n`` goroutines; a hundred Python threads doing the
same spend their time handing the GIL to each other.  Here one thread (the
*driver*, named ``nsq_to_http-publishers``) runs a ``selectors`` loop: up to
``n`` messages are in progress at once, each over a connection of its own,
and every socket (the TCP connect, the TLS handshake, the request, the
answer) advances when the selector says it can.  Answers are read by
:class:`~.http_conn.ResponseReader`, which knows nothing of sockets.

Messages come from the consumer's reader threads through :meth:`HTTPPublishers.submit`
(a deque and a wake-up byte on a socketpair); everything else (connections,
the upstream pool, the timer metrics) is touched by the driver thread only,
so there is no lock.

A connection is kept alive after an answer that allows it and reused, most
recent first, by the next request to the same scheme, host and port.  An idle
connection stays registered for reading: a server that closes it is noticed
and the connection dropped; one left unused for ``idle_timeout`` seconds
(90, as Go's HTTP transport for nsq_to_http) is closed.  If a reused one
fails before any answer (closed, reset), the request is made once more on a
new connection.
"""

import collections
import errno
import os
import selectors
import socket
import ssl
import threading
import time
import traceback

from .. import command
from ..client.connection import ConnectionClosed
from . import http_conn


_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE

# a connection's states
_CONNECTING, _HANDSHAKE, _SENDING, _RECEIVING, _IDLE = range(5)

# how long a host's resolved addresses are used for new connections, in seconds
RESOLVE_EVERY = 30.0

# how often in-progress requests are checked against their deadlines (a timeout fires at most this late)
TIMEOUT_CHECK = 0.05

# how long a kept-alive connection may wait unused before it is closed (Go's transport: IdleConnTimeout)
IDLE_TIMEOUT = 90.0

_RETRYABLE = (http_conn.Closed, ConnectionResetError, BrokenPipeError)


class RequestFailed(Exception):
    """A request that did not succeed: no connection, a timeout, or a status other than the one wanted."""


class _Conn:
    """One non-blocking connection to an endpoint (``key``: scheme, host, port) and the request on it."""

    __slots__ = ("key", "sock", "state", "events", "reader", "out", "job", "reused", "tls", "rest", "idle_since")

    def __init__(self, key, sock, tls):
        self.key = key
        self.sock = sock
        self.tls = tls
        self.state = _CONNECTING
        self.events = 0  # what the selector watches for (0: not registered)
        self.reader = http_conn.ResponseReader()
        self.out = None  # the request's bytes not sent yet (a memoryview)
        self.job = None
        self.reused = False
        self.rest = ()  # the host's other addresses, tried in turn while connecting
        self.idle_since = 0.0  # when it last became idle (monotonic)


class _Job:
    """One message: the addresses it goes to (one, or every one), where it is, and its clock."""

    __slots__ = ("msg", "addresses", "index", "choice", "started", "request_started", "deadline", "attempt", "conn")

    def __init__(self, msg, addresses, choice, now):
        self.msg = msg
        self.addresses = addresses
        self.index = 0
        self.choice = choice  # the pool's pick (None without a pool)
        self.started = now
        self.request_started = now
        self.deadline = 0.0
        self.attempt = 0
        self.conn = None


class HTTPPublishers:
    """Makes the requests of nsq_to_http's messages, ``n`` at a time, on one driver thread.

    ``app`` is the :class:`~.nsq_to_http.ToHTTP` whose endpoints, request
    bytes, pool and metrics it uses.  :meth:`start` starts the driver;
    :meth:`submit` (any thread) hands it a message, which it FINs once sent
    (or sampled out) and requeues (go-nsq's delay, with backoff) on a
    failure; :meth:`stop` (the owner) finishes the requests under way,
    requeues the rest and joins the driver.
    """

    def __init__(self, app, n, connect_timeout, request_timeout, requeue_delay_ms=-1):
        self.app = app
        self.n = n
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.requeue_delay_ms = requeue_delay_ms
        # read by the driver whenever a connection turns idle: set it before the first message
        self.idle_timeout = IDLE_TIMEOUT
        # handed over by reader threads (deque appends are atomic); the driver pops them
        self._incoming = collections.deque()
        # True while a wake-up byte is on its way or the driver will look at _incoming anyway: a hint
        # without a lock, safe because the driver clears it after reading the wake-up bytes and before
        # it empties _incoming (see _loop)
        self._wake_pending = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = threading.Event()
        self._stop_deadline = None  # set by stop() before _stopping
        self._thread = None
        # driver thread only, from here on
        self._selector = selectors.DefaultSelector()
        self._waiting = collections.deque()  # messages taken, not yet started (more than n at once)
        self._jobs = set()  # in progress
        self._idle = {}  # endpoint key -> kept-alive connections, most recent last
        self._idle_check_at = None  # when the oldest idle connection expires (None: none is idle)
        self._addresses = {}  # (host, port) -> (resolved at, getaddrinfo's answers)

    def start(self):
        self._selector.register(self._wake_r, _READ, None)
        self._thread = threading.Thread(target=self._run, name="nsq_to_http-publishers", daemon=True)
        self._thread.start()
        return self

    def submit(self, msg):
        """Hand ``msg`` to the driver (from any thread)."""
        self._incoming.append(msg)
        if not self._wake_pending:
            self._wake_pending = True
            self._wake()

    def _wake(self):
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # full (the driver has bytes to read anyway) or closed (stopped)

    def stop(self, timeout):
        """Finish the requests under way (at most ``timeout`` seconds), requeue the rest, join the driver."""
        if self._thread is None:
            return
        if not self._stopping.is_set():
            self._stop_deadline = time.monotonic() + timeout
            self._stopping.set()
            self._wake()
        self._thread.join(timeout + 1.0)
        if not self._thread.is_alive():
            self._wake_w.close()

    # -- the driver thread -------------------------------------------------------------

    def _run(self):
        try:
            self._loop()
        except Exception:  # a bug: say so in the tool's log, with where it happened
            self.app.log.error("nsq_to_http publishers failed; requeueing what they hold\n%s",
                               traceback.format_exc().rstrip())
        finally:
            self._shut()

    def _loop(self):
        select = self._selector.select
        next_check = 0.0
        while True:
            if self._stopping.is_set():
                if not self._jobs or time.monotonic() >= self._stop_deadline:
                    return
            wake_at = next_check if self._jobs else None
            if self._idle_check_at is not None and (wake_at is None or self._idle_check_at < wake_at):
                wake_at = self._idle_check_at
            timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
            for key, mask in select(timeout):
                conn = key.data
                if conn is None:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                    # Only now, after the bytes are read and before _incoming is emptied: a submitter that
                    # saw it True had appended before, one that sees it False sends a byte nobody reads yet.
                    self._wake_pending = False
                else:
                    self._step(conn)
            self._take()
            if self._jobs or self._idle_check_at is not None:
                now = time.monotonic()
                if self._jobs and now >= next_check:
                    self._expire(now)
                    next_check = now + TIMEOUT_CHECK
                if self._idle_check_at is not None and now >= self._idle_check_at:
                    self._expire_idle(now)

    def _take(self):
        """Start what came in, up to ``n`` at once; the rest wait their turn."""
        incoming, waiting = self._incoming, self._waiting
        if self._stopping.is_set():  # nothing new starts: what was not started goes back to nsqd
            while waiting:
                self._answer(waiting.popleft(), requeue=0)
            while incoming:
                self._answer(incoming.popleft(), requeue=0)
            return
        while incoming:
            waiting.append(incoming.popleft())
        app = self.app
        while waiting and len(self._jobs) < self.n:
            msg = waiting.popleft()
            if app.sampled_out():
                self._answer(msg)
                continue
            now = time.monotonic()
            if app.pool is None:
                job = _Job(msg, app.addresses, None, now)
            else:
                choice = app.pool.get()
                job = _Job(msg, (choice.host,), choice, now)
            self._jobs.add(job)
            self._begin(job, now)

    def _begin(self, job, now):
        """Start the request of ``job`` to its current address: on a kept-alive connection or a new one."""
        address = job.addresses[job.index]
        app = self.app
        endpoint = app.endpoints[address]
        job.request_started = now
        try:
            request = app.request_for(address, job.msg.body)
        except RequestFailed as e:
            self._failed(job, e)
            return
        idle = self._idle.get(endpoint.key)
        if idle and job.attempt == 0:
            conn = idle.pop()
            conn.reused = True
            conn.job = job
            job.conn = conn
            job.deadline = now + self.request_timeout
            conn.reader.start()
            conn.out = memoryview(request)
            conn.state = _SENDING
            self._step(conn)
            return
        try:
            conn = self._connect(endpoint)
        except OSError as e:
            self._error(job, None, e)
            return
        conn.job = job
        job.conn = conn
        job.deadline = now + self.connect_timeout
        conn.out = memoryview(request)
        self._watch(conn, _WRITE)

    def _connect(self, endpoint):
        """A new connection to ``endpoint``, its connect started (to the first of the host's addresses)."""
        scheme, host, port = endpoint.key
        now = time.monotonic()
        resolved = self._addresses.get((host, port))
        if resolved is None or now - resolved[0] > RESOLVE_EVERY:
            # blocking, as the resolver is; new connections are rare (kept alive), and the answer is kept a while
            resolved = self._addresses[(host, port)] = (now, socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        infos = resolved[1]
        conn = _Conn(endpoint.key, None, scheme == "https")
        conn.rest = list(infos)
        self._dial(conn)
        return conn

    def _dial(self, conn):
        """Start the connect to the next of ``conn.rest`` (as create_connection, the next after a failure)."""
        while True:
            family, type_, proto, _, sockaddr = conn.rest.pop(0)
            try:
                sock = socket.socket(family, type_, proto)
            except OSError:
                if not conn.rest:
                    raise
                continue  # (an address family this host has no support for)
            try:
                sock.setblocking(False)
                err = sock.connect_ex(sockaddr)
            except BaseException:
                sock.close()
                raise
            if err in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                conn.sock = sock
                return
            sock.close()
            if not conn.rest:
                raise OSError(err, os.strerror(err))

    def _watch(self, conn, events):
        if events == conn.events:
            return
        if conn.events == 0:
            self._selector.register(conn.sock, events, conn)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _step(self, conn):
        """Advance ``conn`` as far as it goes without blocking."""
        state = conn.state
        if state is None:
            return  # closed earlier in the same round of events
        if state == _IDLE:
            self._drop_idle(conn)  # the server closed it (or sent what nobody asked for)
            return
        job = conn.job
        try:
            if state == _CONNECTING:
                err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    if not conn.rest:
                        raise OSError(err, os.strerror(err))
                    self._unwatch(conn)
                    conn.sock.close()
                    self._dial(conn)  # the next address, within the same connect timeout
                    self._watch(conn, _WRITE)
                    return
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if conn.tls:
                    self._unwatch(conn)  # the wrapped socket is another object on the same descriptor
                    conn.sock = self.app.ssl_context.wrap_socket(
                        conn.sock, server_hostname=conn.key[1], do_handshake_on_connect=False)
                    conn.state = state = _HANDSHAKE
                else:
                    conn.state = state = _SENDING
                    job.deadline = time.monotonic() + self.request_timeout
            if state == _HANDSHAKE:
                try:
                    conn.sock.do_handshake()
                except ssl.SSLWantReadError:
                    self._watch(conn, _READ)
                    return
                except ssl.SSLWantWriteError:
                    self._watch(conn, _WRITE)
                    return
                conn.state = state = _SENDING
                job.deadline = time.monotonic() + self.request_timeout
            if state == _SENDING:
                out = conn.out
                while out:
                    try:
                        sent = conn.sock.send(out)
                    except (BlockingIOError, ssl.SSLWantWriteError):
                        self._watch(conn, _WRITE)
                        return
                    except ssl.SSLWantReadError:
                        self._watch(conn, _READ)
                        return
                    out = conn.out = out[sent:]
                conn.out = None
                conn.state = _RECEIVING
                self._watch(conn, _READ)
                return  # the answer is not here yet: a recv now would only fail (a system call and an exception)
            if state == _RECEIVING:
                sock = conn.sock
                while True:
                    try:
                        data = sock.recv(http_conn.RECV_SIZE)
                    except (BlockingIOError, ssl.SSLWantReadError):
                        self._watch(conn, _READ)
                        return
                    except ssl.SSLWantWriteError:
                        self._watch(conn, _WRITE)
                        return
                    answer = conn.reader.feed(data)
                    if answer is not None:
                        self._answered(job, conn, answer)
                        return
                    if not data:
                        return  # (feed of b"" answers or raises)
        except (OSError, ValueError) as e:  # MalformedResponseError is a ValueError; ssl.SSLError an OSError
            self._error(job, conn, e)

    def _answered(self, job, conn, answer):
        status, keep_alive = answer
        job.conn = None
        conn.job = None
        if keep_alive:
            conn.state = _IDLE
            conn.reused = False
            conn.idle_since = now = time.monotonic()
            self._idle.setdefault(conn.key, []).append(conn)
            if self._idle_check_at is None:
                self._idle_check_at = now + self.idle_timeout
        else:
            self._close(conn)
        app = self.app
        address = job.addresses[job.index]
        try:
            app.check_status(status)
        except RequestFailed as e:
            self._failed(job, e)
            return
        if job.choice is None:
            app.per_address[address].status(job.request_started)
            job.index += 1
            job.attempt = 0
            if job.index < len(job.addresses):
                self._begin(job, time.monotonic())
                return
        else:
            job.choice.mark(None)
            app.per_address[address].status(job.started)
        app.aggregate.status(job.started)
        self._jobs.discard(job)
        self._answer(job.msg)

    def _error(self, job, conn, error):
        """A request's connection failed: once more on a new one if it was a kept-alive one, else the job fails."""
        retry = conn is not None and conn.reused and job.attempt == 0 and isinstance(error, _RETRYABLE)
        if conn is not None:
            conn.job = None
            self._close(conn)
        job.conn = None
        if retry:
            job.attempt = 1
            self._begin(job, time.monotonic())
            return
        endpoint = self.app.endpoints[job.addresses[job.index]]
        self._failed(job, RequestFailed("%s %s: %s" % (self.app.method, endpoint.redacted,
                                                       command.error_text(error))))

    def _failed(self, job, error):
        if job.choice is not None:
            job.choice.mark(error)
        self.app.log.warn("Handler returned error (%s) for msg %s", error, job.msg.id.decode("ascii", "replace"))
        self._jobs.discard(job)
        self._answer(job.msg, requeue=self.requeue_delay_ms, backoff=True)

    def _answer(self, msg, requeue=None, backoff=False):
        try:
            if requeue is None:
                msg.fin()
            else:
                msg.req(requeue, backoff=backoff)
        except ConnectionClosed as e:
            self.app.log.info("cannot answer msg %s - %s", msg.id.decode("ascii", "replace"), e)  # nsqd redelivers it

    def _expire(self, now):
        for job in [j for j in self._jobs if j.conn is not None and j.deadline <= now]:
            self._error(job, job.conn, socket.timeout("timed out"))

    def _expire_idle(self, now):
        """Close the connections idle for ``idle_timeout``; note when the next one expires."""
        oldest = None
        for key, conns in list(self._idle.items()):
            # most recent last: the expired ones are a prefix
            expired = 0
            while expired < len(conns) and conns[expired].idle_since + self.idle_timeout <= now:
                self._close(conns[expired])
                expired += 1
            del conns[:expired]
            if not conns:
                del self._idle[key]
            elif oldest is None or conns[0].idle_since < oldest:
                oldest = conns[0].idle_since
        self._idle_check_at = None if oldest is None else oldest + self.idle_timeout

    def _drop_idle(self, conn):
        idle = self._idle.get(conn.key)
        if idle is not None and conn in idle:
            idle.remove(conn)
        self._close(conn)

    def _unwatch(self, conn):
        if conn.events:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.events = 0

    def _close(self, conn):
        self._unwatch(conn)
        conn.state = None
        conn.sock.close()

    def _shut(self):
        """The driver's exit: requeue what was not sent, close every connection."""
        for job in list(self._jobs):
            if job.conn is not None:
                self._close(job.conn)
            self._answer(job.msg, requeue=0)
        self._jobs.clear()
        while self._waiting:
            self._answer(self._waiting.popleft(), requeue=0)
        while self._incoming:
            self._answer(self._incoming.popleft(), requeue=0)
        for conns in self._idle.values():
            for conn in conns:
                self._close(conn)
        self._idle.clear()
        self._selector.close()
        self._wake_r.close()
