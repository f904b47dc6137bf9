"""What the TCP and HTTP listeners share: address parsing, a prompt accept
loop, the registry of open connections, and the error-logging policy."""

import errno
import itertools
import os
import queue
import selectors
import socket
import socketserver
import stat
import sys
import threading
import time
import traceback

from ..internal.gocompat import is_abstract_socket, is_socket_path, join_host_port, split_host_port, unix_sockaddr


def split_address(address):
    """``"host:port"`` -> ``(host, port)``; an empty host means all interfaces."""
    try:
        host, port = split_host_port(address)
    except ValueError:
        raise ValueError("invalid address %r (want host:port)" % address) from None
    return host or "0.0.0.0", port


def address_family(host):
    """The socket family a listener on ``host`` needs."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# The client address a unix-socket peer is known by: the kernel gives an unnamed
# peer no address (Go prints "@"), so each gets "@" and its listener's accept
# sequence number, which keeps two peers apart in logs, /stats and lookupd.
UNIX_PEER_HOST = "@"
STALE_PROBE_TIMEOUT = 1.0  # seconds a live listener has to accept the probe of an existing socket file


def clear_stale_socket(path):
    """Make way for a unix-socket listener at ``path``; True when a stale socket file was removed.

    A socket file nobody listens on (left by a killed process) refuses the
    probe's connect: it is removed.  A live one (the probe connects, or its
    queue is full) and anything that is not a socket are left alone, and
    OSError(EADDRINUSE) says why.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EADDRINUSE, "%s exists and is not a socket" % path)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(STALE_PROBE_TIMEOUT)
        probe.connect(path)
    except ConnectionRefusedError:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return True
    except FileNotFoundError:
        return False
    except socket.timeout:
        raise OSError(errno.EADDRINUSE, "another process is listening on %s (its queue is full)" % path) from None
    except OSError:
        return False  # cannot tell (e.g. no permission): bind says what is wrong
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, "another process is listening on %s" % path)


def shutdown_socket(sock):
    """Wake whatever thread is blocked on ``sock``; it sees EOF and ends."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def client_left(exc):
    """True for the errors a peer causes by going away or stalling (not our bugs)."""
    return isinstance(exc, (ConnectionError, socket.timeout))


# accept() errors that mean the host is out of a resource (files, buffers),
# not that one client misbehaved: the listen queue stays readable, so
# retrying at once would spin.
RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_BURST = 64  # connections one readiness wake-up of the listener accepts at most
ACCEPT_BACKOFF_MIN = 0.005  # seconds before the first retry of a failed accept
ACCEPT_BACKOFF_MAX = 0.1  # the backoff doubles up to this (a file freed is used within it)
LIMIT_REPORT_INTERVAL = 1.0  # seconds between two log lines about the same host limit


class LimitReporter:
    """Logs a host limit being hit at most once per :data:`LIMIT_REPORT_INTERVAL`, with a count.

    The first occurrence of a kind is logged at once; later ones within the
    interval are counted and reported with the next line, and :meth:`cleared`
    says once that the limit stopped biting.  ``_lock`` guards ``_kinds``
    (kind -> [count not yet reported, time of the last line]).
    """

    def __init__(self, log, name):
        """``log``: the daemon's Logger (None: count only)."""
        self._log = log
        self._name = name
        self._lock = threading.Lock()
        self._kinds = {}

    def hit(self, kind, what, advice):
        """One more failure of ``kind``: ``what`` happened, ``advice`` is the limit to raise."""
        now = time.monotonic()
        with self._lock:
            entry = self._kinds.get(kind)
            if entry is None:
                entry = self._kinds[kind] = [0, now - LIMIT_REPORT_INTERVAL]
            entry[0] += 1
            if now - entry[1] < LIMIT_REPORT_INTERVAL:
                return
            count, entry[0], entry[1] = entry[0], 0, now
        if self._log is None:
            return
        self._log.error("%s: %s (%d time%s since the last report) - %s",
                        self._name, what, count, "" if count == 1 else "s", advice)

    def cleared(self, kind, what):
        """The operation of ``kind`` succeeded: say so once if it had been failing."""
        if not self._kinds:
            return
        with self._lock:
            entry = self._kinds.pop(kind, None)
        if entry is not None and self._log is not None:
            self._log.info("%s: %s again (%d failure%s not yet reported)",
                           self._name, what, entry[0], "" if entry[0] == 1 else "s")


class PromptShutdownMixIn:
    """``serve_forever`` that stops at once when :meth:`shutdown` is called.

    The stock loop notices shutdown only at its next poll (0.5 s by default);
    brokers started and stopped by test suites need milliseconds, so the loop
    also watches a pipe that :meth:`shutdown` writes to.
    """

    _wake_r = _wake_w = None  # the pipe, made by server_activate (a failed bind never makes it)

    def server_activate(self):
        super().server_activate()
        # accept() never waits (serve_forever's select says when to call it: see _accept_burst).  An
        # accepted socket does not inherit this: it is blocking, as socket.accept leaves it here.
        self.socket.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        self._run_lock = threading.Lock()  # guards _stopping against _serving being set: one of them wins
        self._stopping = False
        self._serving = threading.Event()
        self._served = threading.Event()
        self._stop_event = threading.Event()  # set by shutdown: ends an accept backoff early
        # True from accept() until the connection is registered (written by the accept thread, read by
        # time skipping's precise look: before it, the connection still shows in the listen queue).
        self.accepting = False
        self.limits = LimitReporter(getattr(self, "log", None), getattr(self, "log_name", "SERVER"))

    def serve_forever(self, poll_interval=None):
        with self._run_lock:
            if self._stopping:  # shut down before this thread got here: the socket may be closed already
                return
            self._serving.set()
        backoff = 0.0
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._stopping:
                    for key, _ in selector.select():
                        if key.fileobj is self and not self._stopping:
                            self.accepting = True
                            try:
                                accepted = self._accept_burst()
                            finally:
                                self.accepting = False
                            if accepted:
                                if backoff:
                                    backoff = 0.0
                                    self.limits.cleared("accept", "accepting connections")
                            else:
                                # Out of files (or buffers): the listen queue stays
                                # readable, so wait a little, longer each time, then
                                # try again; the clients wait in the queue meanwhile.
                                backoff = min(ACCEPT_BACKOFF_MAX, max(ACCEPT_BACKOFF_MIN, 2 * backoff))
                                self._stop_event.wait(backoff)
        finally:
            self._served.set()

    def _accept_burst(self):
        """Accept and dispatch the connections waiting, up to :data:`ACCEPT_BURST` (the listening
        socket does not block: one readiness wake-up serves a burst of clients connecting at once,
        where one each cost a select and a hand-off of the interpreter lock); False when accept
        failed for lack of a resource."""
        for _ in range(ACCEPT_BURST):
            try:
                request, client_address = self.get_request()
            except BlockingIOError:
                return True  # none left (or the one selected left before we took it)
            except OSError as e:
                if e.errno in RESOURCE_ERRORS:
                    self.limits.hit("accept", "accept failed - %s" % e,
                                    "raise the open files limit (ulimit -n, systemd LimitNOFILE)")
                    return False
                continue  # the client left before we took it (ECONNABORTED...)
            self.dispatch_request(request, client_address)
            if self._stopping:
                break
        return True

    def dispatch_request(self, request, client_address):
        """Give a connection its thread; without one (the host's task limit) refuse it cleanly."""
        try:
            self.process_request(request, client_address)
        except RuntimeError as e:  # Thread.start: "can't start new thread" (the host's task limit)
            self.refuse_threadless(request, client_address, e)
        except Exception:
            self.handle_error(request, client_address)
            self.shutdown_request(request)
        except BaseException:
            self.shutdown_request(request)
            raise

    def refuse_threadless(self, request, client_address, error):
        """The host had no thread for this connection (``error``: Thread.start's): report the
        limit (at most once a while) and refuse the connection cleanly."""
        self.limits.hit("thread", "cannot start a connection thread - %s" % error,
                        "raise the task limit (ulimit -u, systemd TasksMax, pids cgroup)")
        self.refuse_request(request, client_address)

    def refuse_request(self, request, client_address):
        """Answer a connection that gets no thread with the protocol's error, then close it.

        Runs on the accept thread: the answer is written without blocking
        (a fresh socket's send buffer is empty) and whatever the client sent
        already is read first, so that the close does not reset the answer away.
        """
        try:
            request.setblocking(False)
            answer = self.refusal()
            if answer:
                try:
                    request.recv(65536)
                except OSError:
                    pass
                request.send(answer)
                request.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.shutdown_request(request)

    def refusal(self):
        """The bytes that refuse a connection for lack of a thread (subclasses: the protocol's error)."""
        return b""

    def shutdown(self):
        with self._run_lock:
            self._stopping = True
            serving = self._serving.is_set()
        self._stop_event.set()
        os.write(self._wake_w, b"x")
        if serving:
            self._served.wait()

    def server_close(self):
        super().server_close()
        for fd in (self._wake_r, self._wake_w):
            if fd is not None:
                os.close(fd)
        self._wake_r = self._wake_w = None


class ConnectionThreadsMixIn:
    """One thread per connection, kept in a set that each leaves as it ends;
    ``server_close()`` joins those left, and those that left but had not yet
    returned (a thread runs on after leaving the set: ``_ending``, pruned of
    finished threads at each accept).

    A connection's thread is made by the thread that dispatches it (the
    accept thread) and started by another, the starter (``thread_name`` +
    ``-starter``, made with the first connection).  ``Thread.start`` waits
    until the new thread has run, which under a burst of clients and a busy
    GIL takes a millisecond or more: on the accept thread that wait set the
    pace at which connections left the kernel's listen queue, and a burst of
    a few thousand clients overflowed it (the kernel then drops handshakes,
    which the clients retry 1 s, 3 s, 7 s... later: seconds, even minutes,
    added to a burst).  Now the accept thread only accepts; the connections
    wait for their thread in ``_to_start`` instead, in this process, in
    accept order.  A thread the host cannot start (its task limit) has its
    connection refused by :meth:`refuse_threadless`, which the server class
    provides (:class:`PromptShutdownMixIn`).

    socketserver's ThreadingMixIn keeps a list that it reaps with a scan of
    every thread on each accept: O(connections) per accept.  The threads are
    daemon threads because ``threading`` also scans its non-daemon threads on
    every thread start; ``server_close`` joins them all the same.  Subclasses
    set ``thread_name``; a thread is named ``thread_name[ip:port]``.
    """

    thread_name = "conn"

    def __init__(self, *args, **kwargs):
        # Guards _conn_threads, _ending, _starter and _starter_closed, and orders the puts on
        # _to_start (the closing None is the last).
        self._conn_threads_lock = threading.Lock()
        self._conn_threads = set()  # connection threads made and not yet ended (started or to start)
        self._ending = []  # threads that left _conn_threads, possibly still returning
        self._to_start = queue.SimpleQueue()  # (thread, request, client_address) for the starter; None: exit
        self._starter = None
        self._starter_closed = False
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        """Make the connection's thread and queue it for the starter (never waits for it to run)."""
        t = threading.Thread(
            target=self._connection_thread,
            args=(request, client_address),
            name="%s[%s:%s]" % ((self.thread_name,) + tuple(client_address[:2])),
            daemon=True,
        )
        with self._conn_threads_lock:
            if self._starter_closed:  # (closed: nothing starts threads any more)
                closed = True
            else:
                closed = False
                if self._starter is None:
                    starter = threading.Thread(target=self._start_connection_threads,
                                               name=self.thread_name + "-starter", daemon=True)
                    starter.start()  # (RuntimeError without a thread: the caller refuses the connection)
                    self._starter = starter
                self._conn_threads.add(t)
                if self._ending:  # each accept prunes the threads that finished since the last
                    self._ending = [e for e in self._ending if e.is_alive()]
                self._to_start.put((t, request, client_address))
        if closed:
            self.shutdown_request(request)

    def _start_connection_threads(self):
        """The starter thread: start each queued connection's thread, in order, until None."""
        while True:
            item = self._to_start.get()
            if item is None:
                return
            t, request, client_address = item
            try:
                t.start()
            except RuntimeError as e:  # "can't start new thread" (the host's task limit)
                self._forget_unstarted(t)
                self.refuse_threadless(request, client_address, e)
            except BaseException:
                self._forget_unstarted(t)
                self.handle_error(request, client_address)
                self.shutdown_request(request)

    def _forget_unstarted(self, t):
        """A thread that never started: nothing joins it."""
        with self._conn_threads_lock:
            self._conn_threads.discard(t)

    def _connection_thread(self, request, client_address):
        handed_off = False
        try:
            # True: the connection lives on without this thread (a parked keep-alive connection).
            handed_off = self.finish_request(request, client_address) is True
        except Exception:
            self.handle_error(request, client_address)
        finally:
            if not handed_off:
                self.shutdown_request(request)
            me = threading.current_thread()
            with self._conn_threads_lock:
                self._conn_threads.discard(me)
                self._ending.append(me)

    def server_close(self):
        super().server_close()
        with self._conn_threads_lock:
            self._starter_closed = True
            starter = self._starter
            self._to_start.put(None)
        if starter is not None:
            starter.join()  # every queued thread is started (or refused) by then
        with self._conn_threads_lock:
            threads = list(self._conn_threads) + self._ending
        for t in threads:
            t.join()


class ConnectionRegistryMixIn(PromptShutdownMixIn):
    """A listener of one daemon (nsqd or nsqlookupd): tracks its open connections and logs errors.

    Connections are registered by the accept thread before their handler
    thread starts, so :meth:`close_connections` after :meth:`shutdown` misses
    none.  Subclasses set ``log`` (the daemon's Logger) and ``log_name``.
    """

    log_name = "SERVER"

    def server_activate(self):
        super().server_activate()
        self._conns_lock = threading.Lock()  # guards _conns and _closing
        self._conns = set()
        self._closing = False

    def process_request(self, request, client_address):
        if self.register_connection(request):
            super().process_request(request, client_address)

    def register_connection(self, request):
        """Track an accepted connection; False (and it is closed) once the listener is closing."""
        with self._conns_lock:
            closing = self._closing
            if not closing:
                self._conns.add(request)
        if closing:
            self.shutdown_request(request)
        return not closing

    def shutdown_request(self, request):
        self._unregister(request)
        super().shutdown_request(request)

    def close_request_alone(self, request):
        """:meth:`shutdown_request` without the ``shutdown()``: the close alone, as Go closes a
        connection.  For a socket no other thread reads or writes (the poller's, at its teardown):
        the shutdown is there to wake such a thread, and costs a syscall per connection at a mass
        close."""
        self._unregister(request)
        self.close_request(request)

    def _unregister(self, request):
        with self._conns_lock:
            self._conns.discard(request)

    def close_connections(self):
        """Shut down every open connection (after :meth:`shutdown`); their threads then end."""
        with self._conns_lock:
            self._closing = True
            conns = list(self._conns)
        for sock in conns:
            shutdown_socket(sock)

    def connection_count(self):
        with self._conns_lock:
            return len(self._conns)

    def open_connections(self):
        """The sockets of every open connection, those not handled yet included (a snapshot)."""
        with self._conns_lock:
            return list(self._conns)

    def handle_error(self, request, client_address):
        """A peer leaving or stalling is routine (debug); anything else is our bug (error + traceback)."""
        exc = sys.exc_info()[1]
        host, port = client_address[:2]
        if client_left(exc):
            self.log.debug("%s: client %s:%s left - %s", self.log_name, host, port, exc)
        else:
            self.log.error("%s: unhandled error on %s:%s\n%s", self.log_name, host, port, traceback.format_exc())


class Listener(ConnectionRegistryMixIn, ConnectionThreadsMixIn, socketserver.TCPServer):
    """A daemon's stream listener: ``"host:port"`` (TCP) or a unix socket path
    (see :func:`~nsqd_threaded.internal.gocompat.is_socket_path`), one
    registered thread per connection, errors to ``log``.

    Each connection is registered (:class:`ConnectionRegistryMixIn`) before
    its thread ``thread_name[ip:port]`` starts (:class:`ConnectionThreadsMixIn`);
    the daemon's stop calls :meth:`close_connections`, which ends those
    threads, then ``server_close()``, which joins them.  A bad address raises
    ValueError, a failed bind OSError.

    On a unix socket, a stale socket file is replaced and a live one refused
    (:func:`clear_stale_socket`); the file gets the permissions the umask
    leaves (as Go's), and ``server_close()`` removes it while it is still the
    one this listener made.  An abstract socket (``@name``, Linux) has no
    file: a name in use refuses the bind.  Peers are known as ``("@", n)``
    (:data:`UNIX_PEER_HOST`, ``n`` counting from 1).
    """

    allow_reuse_address = True
    # socketserver's 5 (and even 128) drops the SYNs of a burst of clients:
    # they retry after 1 s, 3 s, 7 s...  The kernel caps it at
    # net.core.somaxconn, as Go's listen does.
    request_queue_size = 4096
    socket_path = None  # the unix socket's path (None: TCP)
    _socket_file = None  # (st_dev, st_ino) of the socket file this listener bound

    def __init__(self, address, handler_class, log):
        self.log = log
        if is_socket_path(address):
            self.address_family = socket.AF_UNIX
            self.socket_path = address
            self._unix_peers = itertools.count(1)  # next() is atomic under the GIL; only the accept thread calls it
            server_address = address
        else:
            host, port = split_address(address)
            self.address_family = address_family(host)
            server_address = (host, port)
        super().__init__(server_address, handler_class)

    def server_bind(self):
        if self.socket_path is None:
            super().server_bind()
            return
        if is_abstract_socket(self.socket_path):
            # no file to clear or remove: the name goes with the socket; a live one refuses the bind (EADDRINUSE)
            self.socket.bind(unix_sockaddr(self.socket_path))
            self.server_address = self.socket_path
            return
        if clear_stale_socket(self.socket_path):
            self.log.warn("%s: removed the stale socket file %s (no process listened on it)",
                          self.log_name, self.socket_path)
        self.socket.bind(self.socket_path)
        st = os.stat(self.socket_path)
        self._socket_file = (st.st_dev, st.st_ino)
        self.server_address = self.socket_path

    def get_request(self):
        # socket.accept, less what it looks up on each call: the listening socket's family and type
        # as enums (six Python calls: the listener knows them) and its timeout (none matters: the
        # listening socket does not block, so the accepted one gets the default timeout, as
        # socket.accept leaves it).
        listening = self.socket
        fd, address = listening._accept()
        sock = socket.socket(self.address_family, self.socket_type, listening.proto, fileno=fd)
        if self.socket_path is not None:
            address = (UNIX_PEER_HOST, next(self._unix_peers))
        return sock, address

    @property
    def bound_address(self):
        """The bound ``(host, port)`` (the real port when 0 was asked), or the socket path (a str)."""
        return self.socket_path if self.socket_path is not None else self.server_address[:2]

    @property
    def port(self):
        """The bound TCP port, or None on a unix socket."""
        return None if self.socket_path is not None else self.server_address[1]

    def describe(self):
        """``"host:port"`` or the socket path, for logs and option values."""
        return self.socket_path if self.socket_path is not None else join_host_port(*self.server_address[:2])

    def server_close(self):
        super().server_close()
        self._remove_socket_file()

    def _remove_socket_file(self):
        """Remove the socket file if it is still ours (an operator may have replaced it meanwhile)."""
        ours, self._socket_file = self._socket_file, None
        if ours is None:
            return
        try:
            st = os.lstat(self.socket_path)
            if (st.st_dev, st.st_ino) == ours:
                os.unlink(self.socket_path)
        except OSError:
            pass
