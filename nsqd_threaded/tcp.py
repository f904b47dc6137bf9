"""The TCP listener: a ``socketserver.ThreadingTCPServer``, one thread per connection."""

import os
import selectors
import socket
import socketserver
import threading
import traceback

from .protocol_v2 import handle_connection


def split_address(address):
    """``"host:port"`` -> ``(host, port)``; an empty host means all interfaces."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("invalid address %r (want host:port)" % address)
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class PromptShutdownMixIn:
    """``serve_forever`` that stops at once when :meth:`shutdown` is called.

    The stock loop notices shutdown only at its next poll (0.5 s by default);
    brokers started and stopped by test suites need milliseconds, so the loop
    also watches a pipe that :meth:`shutdown` writes to.
    """

    def server_activate(self):
        super().server_activate()
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._serving = threading.Event()
        self._served = threading.Event()

    def serve_forever(self, poll_interval=None):
        self._serving.set()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._stopping:
                    for key, _ in selector.select():
                        if key.fileobj is self and not self._stopping:
                            self._handle_request_noblock()
        finally:
            self._served.set()

    def shutdown(self):
        self._stopping = True
        os.write(self._wake_w, b"x")
        if self._serving.is_set():
            self._served.wait()

    def server_close(self):
        super().server_close()
        # A failed bind calls server_close() before server_activate() made the pipe.
        for fd in (getattr(self, "_wake_r", None), getattr(self, "_wake_w", None)):
            if fd is not None:
                os.close(fd)


class _ConnectionHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handle_connection(self.server.nsqd, sock, self.client_address)


class TCPServer(PromptShutdownMixIn, socketserver.ThreadingTCPServer):
    """Accepts protocol V2 connections for one NSQD.

    Connection threads are kept in a set each leaves as it ends, and
    ``server_close()`` joins those left; NSQD closes the sockets first so they
    end.  (The stock ThreadingMixIn list is reaped by a scan of every thread on
    each accept, O(connections), and not at all before Python 3.9's late
    releases.)

    Thread stacks keep the interpreter's default size: only touched pages are
    resident, so a smaller ``threading.stack_size`` saves address space, not
    memory, and it is process-wide, so setting it would also shrink the stacks
    of threads the embedding program starts meanwhile.
    """

    allow_reuse_address = True
    request_queue_size = 4096  # the kernel caps it at net.core.somaxconn, as Go's listen does

    def __init__(self, address, nsqd):
        host, port = split_address(address)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.nsqd = nsqd
        self._conn_threads_lock = threading.Lock()  # guards _conn_threads
        self._conn_threads = set()  # running connection threads
        super().__init__((host, port), _ConnectionHandler)

    def process_request(self, request, client_address):
        # daemon: threading scans its set of non-daemon threads on every
        # thread start (O(connections)); server_close joins these anyway.
        t = threading.Thread(
            target=self._connection_thread,
            args=(request, client_address),
            name="nsqd-conn[%s:%s]" % client_address[:2],
            daemon=True,
        )
        with self._conn_threads_lock:
            self._conn_threads.add(t)
        try:
            t.start()
        except BaseException:  # no thread (resource limits): the caller closes the request
            with self._conn_threads_lock:
                self._conn_threads.discard(t)
            raise

    def _connection_thread(self, request, client_address):
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._conn_threads_lock:
                self._conn_threads.discard(threading.current_thread())

    def server_close(self):
        super().server_close()
        with self._conn_threads_lock:
            threads = list(self._conn_threads)
        for t in threads:
            t.join()

    def handle_error(self, request, client_address):
        self.nsqd.log.error("TCP: unhandled error on %s:%s\n%s", client_address[0], client_address[1], traceback.format_exc())
