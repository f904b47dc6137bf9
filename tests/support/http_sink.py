"""Real HTTP endpoints on 127.0.0.1:0 for nsq_to_http's tests: a recording Sink, a raw Endpoint, a ScriptedServer."""

import http.server
import socket
import threading
import time

from support.http_server import ThreadedHTTPServer

JOIN = 10.0  # seconds an exit waits, in all, for the threads it started (daemon: none outlives the process)


def _join_all(threads, timeout=JOIN):
    deadline = time.monotonic() + timeout
    for t in list(threads):
        t.join(max(0.0, deadline - time.monotonic()))


class Request:
    """One request as it arrived: ``method``, ``path``, ``headers`` (a dict, names as sent), ``body``, ``status``."""

    def __init__(self, method, path, headers, body, status):
        self.method, self.path, self.headers, self.body, self.status = method, path, headers, body, status

    def header(self, name):
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None

    def __repr__(self):
        return "<Request %s %s %d %r>" % (self.method, self.path, self.status, self.body[:40])


class Sink:
    """``with Sink(statuses=[500, 500]) as sink``: answers the first requests with ``statuses``, then 200.

    ``url`` is its ``http://127.0.0.1:port``.  ``_lock`` (and the ``_grew``
    condition on it) guards ``requests`` and ``_statuses``.
    """

    def __init__(self, statuses=(), record=True):
        self._lock = threading.Lock()
        self._grew = threading.Condition(self._lock)
        self.requests = []
        self.count = 0
        self._statuses = list(statuses)
        self._record = record
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real endpoint

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with sink._grew:
                    status = sink._statuses.pop(0) if sink._statuses else 200
                    sink.count += 1
                    if sink._record:
                        sink.requests.append(Request(self.command, self.path, dict(self.headers.items()), body, status))
                    sink._grew.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        class Server(ThreadedHTTPServer):
            request_queue_size = 256  # nsq_to_http opens up to -n (100) connections at once

        self.server = Server(("127.0.0.1", 0), Handler, "http-sink", poll_interval=0.05)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.close(JOIN)

    def succeeded(self):
        """The requests answered 2xx, in arrival order."""
        with self._lock:
            return [r for r in self.requests if 200 <= r.status < 300]

    def wait(self, predicate, timeout=30.0, what="requests"):
        """Wait until ``predicate(requests)`` holds."""
        with self._grew:
            if not self._grew.wait_for(lambda: predicate(self.requests), timeout):
                raise AssertionError("no %s within %ss; got %r" % (what, timeout, self.requests[-10:]))


class Endpoint:
    """A raw HTTP endpoint on 127.0.0.1 whose ``respond(number, sock)`` answers request ``number`` (0 on).

    Each request (a head and its Content-Length body) is read whole, then
    handed to ``respond``, which writes what it likes to ``sock`` (plain, or
    TLS through ``context``) and returns False to end the connection.
    ``url`` and ``port`` say where it listens.  ``_lock`` (and the
    ``_changed`` condition on it) guards ``requests`` (each whole request as
    sent, in arrival order), ``bodies`` (their bodies), ``answered`` (the
    bodies of those ``respond`` kept the connection after), ``connections``
    (accepted), ``closed`` (ended, by either side), ``held`` (requests being answered now) and ``peak`` (the
    most at once).  Every thread it starts is joined on exit (for ``JOIN``
    seconds in all): a ``respond`` that holds an answer must let go by then.
    """

    def __init__(self, respond, context=None, timeout=30.0):
        self.respond = respond
        self.context = context
        self.timeout = timeout
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.requests = []
        self.bodies = []
        self.answered = []
        self.connections = 0
        self.closed = 0
        self.held = 0
        self.peak = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(256)  # nsq_to_http opens up to -n (100) connections at once
        self.port = self.listener.getsockname()[1]
        self.url = "%s://127.0.0.1:%d" % ("http" if context is None else "https", self.port)
        self._threads = []
        self._acceptor = threading.Thread(target=self._accept, name="endpoint-accept", daemon=True)

    def __enter__(self):
        self._acceptor.start()
        return self

    def __exit__(self, *exc):
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._acceptor.join(JOIN)
        _join_all(self._threads)

    def wait(self, predicate, timeout=30.0, what="requests"):
        """Wait until ``predicate(self)`` holds (checked whenever a request arrives or is answered)."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self), timeout):
                raise AssertionError("no %s within %ss (requests %d, held %d)"
                                     % (what, timeout, len(self.requests), self.held))

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._changed:
                self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), name="endpoint-conn", daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn):
        conn.settimeout(self.timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a trickled answer goes out as written
        buf = b""
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(buf) < length:
                    data = conn.recv(65536)
                    if not data:
                        return  # closed mid-body: not a request
                    buf += data
                body, buf = buf[:length], buf[length:]
                with self._changed:
                    number = len(self.requests)
                    self.requests.append(head + b"\r\n\r\n" + body)
                    self.bodies.append(body)
                    self.held += 1
                    self.peak = max(self.peak, self.held)
                    self._changed.notify_all()
                keep = False  # a respond that raises ends the connection
                try:
                    keep = self.respond(number, conn)
                finally:
                    with self._changed:
                        self.held -= 1
                        if keep is not False:
                            self.answered.append(body)
                        self._changed.notify_all()
                if keep is False:
                    return
        except OSError:
            return
        finally:
            # a close from the client side is seen here as the end of the stream
            conn.close()
            with self._changed:
                self.closed += 1
                self._changed.notify_all()


CLOSE = object()  # in a script: close the connection instead of answering


def then_close(answer):
    """In a script: send ``answer``, then close the connection."""
    return (answer,)


class ScriptedServer(Endpoint):
    """An ``Endpoint`` that answers request ``n`` with ``script[n]``: bytes, ``then_close(bytes)`` or ``CLOSE``.

    Past the script's end it closes the connection.  ``requests`` holds the
    whole requests read, ``connections`` counts the accepted connections.
    """

    def __init__(self, script, context=None):
        self.script = list(script)
        super().__init__(self._play, context, timeout=10.0)

    def _play(self, number, sock):
        answer = self.script[number] if number < len(self.script) else CLOSE
        if answer is CLOSE:
            return False
        sock.sendall(answer[0] if isinstance(answer, tuple) else answer)
        return not isinstance(answer, tuple)
