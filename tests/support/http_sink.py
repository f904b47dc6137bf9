"""Real HTTP endpoints on 127.0.0.1:0 for nsq_to_http's tests: a recording Sink, a ScriptedServer of raw answers."""

import http.server
import socket
import threading


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

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 256  # nsq_to_http opens up to -n (100) connections at once
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="http-sink", kwargs={"poll_interval": 0.05})

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

    def succeeded(self):
        """The requests answered 2xx, in arrival order."""
        with self._lock:
            return [r for r in self.requests if 200 <= r.status < 300]

    def wait(self, predicate, timeout=30.0, what="requests"):
        """Wait until ``predicate(requests)`` holds."""
        with self._grew:
            if not self._grew.wait_for(lambda: predicate(self.requests), timeout):
                raise AssertionError("no %s within %ss; got %r" % (what, timeout, self.requests[-10:]))


CLOSE = object()  # in a script: close the connection instead of answering


def then_close(answer):
    """In a script: send ``answer``, then close the connection."""
    return (answer,)


class ScriptedServer:
    """Answers each request (a head and its Content-Length body) with the next bytes of ``script``.

    ``connections`` counts the accepted connections, ``requests`` the requests
    read; ``_lock`` guards both and the script's position.
    """

    def __init__(self, script, context=None):
        self.script = list(script)
        self.context = context
        self.connections = 0
        self.requests = []
        self._lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self._threads = []
        self._acceptor = threading.Thread(target=self._accept, name="scripted-http-accept")

    def __enter__(self):
        self._acceptor.start()
        return self

    def __exit__(self, *exc):
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._acceptor.join(10)
        for t in self._threads:
            t.join(10)

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), name="scripted-http-conn")
            self._threads.append(t)
            t.start()

    def _serve(self, conn):
        conn.settimeout(10)
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            buf = b""
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
                    buf += conn.recv(65536)
                with self._lock:
                    self.requests.append(head + b"\r\n\r\n" + buf[:length])
                    answer = self.script.pop(0) if self.script else CLOSE
                buf = buf[length:]
                if answer is CLOSE:
                    return
                conn.sendall(answer[0] if isinstance(answer, tuple) else answer)
                if isinstance(answer, tuple):
                    return
        except OSError:
            return
        finally:
            conn.close()
