"""A real HTTP endpoint on 127.0.0.1:0 that records every request (for nsq_to_http's tests and benchmark)."""

import http.server
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
