"""A hostile "broker" for the nsqadmin tests: it registers with a real nsqlookupd over the lookupd TCP
protocol (IDENTIFY, REGISTER) like nsqd does, and serves its own HTTP ``/stats``, ``/info`` and
``/debug/state`` documents, whatever the test puts in them.  And a catcher: an HTTP endpoint that counts
every request, for payloads that would call home if they ran."""

import http.server
import json
import socket
import struct
import threading

from nsqd_threaded.wire.protocol_v1 import MAGIC_V1

from support.http_server import ThreadedHTTPServer


def payload(catcher_url, tag=""):
    """A string that breaks out of text, of a double- or single-quoted attribute, and of a URL, three ways."""
    return ("%s\"'><img src=\"%s/img%s\" onerror=\"window.__pwned='%s';fetch('%s/onerror%s')\">"
            "<script>window.__pwned='script%s'</script><svg onload=\"window.__pwned='svg%s'\"></svg>"
            % (tag, catcher_url, tag, tag, catcher_url, tag, tag, tag))


class HostileNode:
    """A node that says what the test wants: ``docs`` maps a path (``/stats``...) to a document or raw bytes.

    ``register(lookupd_tcp, topic, channel, **identify)`` IDENTIFYs with the given fields (the HTTP port
    defaults to this node's) and REGISTERs; the connection stays open (the lookupd keeps the registration)
    until :meth:`close`.

    ``requests`` lists each request's path (with its query), ``accepts`` its Accept header.
    ``gated``: each answer waits until the test sets ``answer`` (``arrived`` is set as a request comes in).
    """

    def __init__(self, docs=None, gated=False):
        self.docs = dict(docs or {})
        self._lock = threading.Lock()  # guards docs, requests and accepts
        self.requests = []
        self.accepts = []
        self.arrived, self.answer = threading.Event(), threading.Event()
        if not gated:
            self.answer.set()
        node = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?")[0]
                with node._lock:
                    node.requests.append(self.path)
                    node.accepts.append(self.headers.get("Accept"))
                node.arrived.set()
                node.answer.wait(30)
                with node._lock:
                    doc = node.docs.get(path)
                if doc is None:
                    body, status = b'{"message":"NOT_FOUND"}', 404
                else:
                    body, status = doc if isinstance(doc, bytes) else json.dumps(doc).encode(), 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadedHTTPServer(("127.0.0.1", 0), Handler, "test-hostile-node").start()
        self.http_port = self.server.server_address[1]
        self.conns = []

    @property
    def node(self):
        """How nsqadmin names it when it registers as 127.0.0.1 with its own HTTP port."""
        return "127.0.0.1:%d" % self.http_port

    def set(self, path, doc):
        with self._lock:
            self.docs[path] = doc

    def register(self, lookupd_tcp, topic, channel="", **identify):
        fields = {"broadcast_address": "127.0.0.1", "hostname": "hostile", "tcp_port": 1,
                  "http_port": self.http_port, "version": "1.3.0"}
        fields.update(identify)
        conn = socket.create_connection(lookupd_tcp, timeout=10)
        self.conns.append(conn)
        body = json.dumps(fields).encode()
        conn.sendall(MAGIC_V1 + b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        self._expect(conn, None)
        command = "REGISTER %s %s\n" % (topic, channel) if channel else "REGISTER %s\n" % topic
        conn.sendall(command.encode())
        self._expect(conn, b"OK")

    @staticmethod
    def _expect(conn, want):
        size = struct.unpack(">i", _read(conn, 4))[0]
        data = _read(conn, size)
        assert not data.startswith(b"E_"), data
        assert want is None or data == want, data

    def close(self):
        self.answer.set()
        for conn in self.conns:
            conn.close()
        self.server.close()


def _read(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("lookupd closed the connection")
        data += chunk
    return data


class Catcher:
    """An HTTP endpoint on 127.0.0.1 that records every request it gets (``hits``)."""

    def __init__(self):
        catcher = self
        self.hits = []
        self._lock = threading.Lock()  # guards hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                with catcher._lock:
                    catcher.hits.append((self.command, self.path))
                self.send_response(204)
                self.end_headers()

            do_GET = do_POST = do_PUT = do_DELETE = do_OPTIONS = _any

            def log_message(self, *args):
                pass

        self.server = ThreadedHTTPServer(("127.0.0.1", 0), Handler, "test-catcher").start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]

    def seen(self):
        with self._lock:
            return list(self.hits)

    def close(self):
        self.server.close()
