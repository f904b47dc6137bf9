"""The tests' fake HTTP endpoints' server: a ThreadingHTTPServer whose threads cannot outlive a test."""

import http.server
import threading
import time


class ThreadedHTTPServer(http.server.ThreadingHTTPServer):
    """``ThreadedHTTPServer(address, Handler, name).start()``: serves from a thread named ``name``.

    Every thread is daemon (a connection a client keeps open cannot hold the
    test process at exit) and named: ``name``, and ``name + "-conn"`` per
    connection.  ``close()`` stops the loop and joins them all, for
    ``timeout`` seconds in all.  ``_lock`` guards ``_conn_threads`` (``_threads`` is ThreadingMixIn's).
    """

    daemon_threads = True
    block_on_close = False  # server_close would join the connection threads with no bound: close() does, bounded

    def __init__(self, address, handler, name, poll_interval=0.5):
        super().__init__(address, handler)
        self.name = name
        self._lock = threading.Lock()
        self._conn_threads = []
        self._thread = threading.Thread(target=self.serve_forever, name=name, daemon=True,
                                        kwargs={"poll_interval": poll_interval})

    def start(self):
        self._thread.start()
        return self

    def process_request(self, request, client_address):
        t = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                             name=self.name + "-conn", daemon=True)
        with self._lock:
            self._conn_threads.append(t)
        t.start()

    def close(self, timeout=10.0):
        if self._thread.ident is not None:  # (shutdown waits forever for a loop never started)
            self.shutdown()
        self.server_close()
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = [self._thread] + self._conn_threads
        for t in threads:
            if t.ident is not None:
                t.join(max(0.0, deadline - time.monotonic()))
