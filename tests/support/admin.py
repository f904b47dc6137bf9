"""Helpers for the nsqadmin tests: an admin over a real cluster, HTTP calls, a notification sink."""

import http.server
import json
import threading
import urllib.error
import urllib.request

from nsqd_threaded.admin import NSQAdmin
from nsqd_threaded.internal.logger import Logger

from support.http_server import ThreadedHTTPServer
from support.logs import LogCapture


def start_admin(**options):
    options.setdefault("http_address", "127.0.0.1:0")
    admin = NSQAdmin(logger=Logger("[nsqadmin] ", "debug", LogCapture()), **options)
    return admin.start()


def call(url, method="GET", body=None, headers=None, timeout=20.0):
    """``(status, parsed JSON or text)`` of one request (a dict or list body is sent as JSON, and says so)."""
    headers = dict(headers or {})
    data = body
    if isinstance(body, (dict, list)):
        data = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    text = raw.decode("utf-8")
    if ctype.startswith("application/json"):
        return status, json.loads(text)
    return status, text


class NotificationSink:
    """A local HTTP endpoint that keeps every POSTed JSON document (``docs``; ``received`` is set on each)."""

    def __init__(self):
        sink = self
        self.docs = []
        self.paths = []
        self._lock = threading.Lock()  # guards docs and paths
        self.received = threading.Condition(self._lock)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with sink.received:
                    sink.docs.append(json.loads(body))
                    sink.paths.append(self.path)
                    sink.received.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadedHTTPServer(("127.0.0.1", 0), Handler, "test-notification-sink").start()
        self.url = "http://127.0.0.1:%d/notify" % self.server.server_address[1]

    def wait_for(self, n, timeout=10.0):
        with self.received:
            assert self.received.wait_for(lambda: len(self.docs) >= n, timeout), self.docs
            return list(self.docs)

    def close(self):
        self.server.close()
