"""Helpers of the AUTH tests: a real auth server (AuthServer) and authenticated connections."""

import http.server
import json
import socket
import threading
import urllib.parse
import urllib.request

import pytest

from nsqd_threaded.wire import protocol_v2

from support.http_server import ThreadedHTTPServer
from support.wire import Conn

GO_BIN = "/work/shared/reference/go-nsq-1.3.0"


def grant(topic, channels, permissions, identity="someone", ttl=3600):
    return {
        "ttl": ttl,
        "identity": identity,
        "identity_url": "http://example.com/%s" % identity,
        "authorizations": [{"topic": topic, "channels": channels, "permissions": permissions}],
    }


GRANTS = {
    "all": grant(".*", [".*"], ["subscribe", "publish"], identity="alice"),
    # unanchored: "ok" matches any topic containing "ok"; channel "good" any channel containing it
    "ok-topics": grant("ok", ["good"], ["subscribe", "publish"], identity="bob"),
    "pub-only": grant("^pub$", [".*"], ["publish"]),
    "sub-only": grant("^sub$", [".*"], ["subscribe"]),
    "no-channels": grant(".*", [], ["subscribe", "publish"]),
    "nothing": {"ttl": 3600, "identity": "nobody", "authorizations": []},
    "anonymous": {"ttl": 3600, "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}]},
    "short": grant(".*", [".*"], ["publish"], ttl=1),
    "<html>&": grant(".*", [".*"], ["publish"], identity="<x&y>"),
}


class AuthServer:
    """A real HTTP auth server on 127.0.0.1:0, recording every request.

    ``mode``: "grant" (answer from GRANTS by secret, 403 for unknown secrets),
    "garbage" (200 and not JSON), "500", "slow" (waits until closed).
    ``answers`` overrides GRANTS per secret.
    """

    def __init__(self, mode="grant", context=None):
        self.mode = mode
        self.https_port = 0  # what mode "403" points to
        self.answers = {}
        self.requests = []  # (method, path, query, headers, body)
        self.release = threading.Event()  # ends the waits of "slow"
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._answer(b"")

            def do_POST(self):
                self._answer(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def _answer(self, body):
                parts = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
                server.requests.append((self.command, self.path, query, dict(self.headers), body))
                if server.mode == "slow":
                    server.release.wait(30)
                    status, data = 200, json.dumps(GRANTS["all"]).encode()
                elif server.mode == "garbage":
                    status, data = 200, b"<html>not json</html>"
                elif server.mode == "500":
                    status, data = 500, b'{"message":"INTERNAL_ERROR"}'
                elif server.mode == "403":  # nsqd's own TLS_REQUIRED answer
                    status, data = 403, b'{"message": "TLS_REQUIRED", "https_port": %d}' % server.https_port
                else:
                    if body:
                        secret = json.loads(body)["secret"][0]
                    else:
                        secret = query["secret"][0]
                    doc = server.answers.get(secret, GRANTS.get(secret))
                    if doc is None:
                        status, data = 401, b'{"message":"UNAUTHORIZED"}'
                    else:
                        status, data = 200, json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadedHTTPServer(("127.0.0.1", 0), Handler, "test-auth-server")
        if context is not None:
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.address = "127.0.0.1:%d" % self.httpd.server_address[1]
        self.httpd.start()

    def close(self):
        self.release.set()
        self.httpd.close()  # joins the request threads (bounded)


@pytest.fixture
def make_auth_server():
    servers = []

    def make(mode="grant", context=None):
        s = AuthServer(mode, context)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


@pytest.fixture
def auth_server(make_auth_server):
    return make_auth_server()


@pytest.fixture
def auth_nsqd(make_nsqd, auth_server):
    return make_nsqd(auth_http_addresses=[auth_server.address])


def closed_port():
    """A 127.0.0.1 port nothing listens on (bound then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def connect(nsqd, **identify):
    c = Conn(nsqd.tcp_address)
    if identify is not None:
        c.identify(**identify)
    return c


def do_auth(c, secret):
    c.cmd(b"AUTH", secret.encode() if isinstance(secret, str) else secret)
    return c.read_frame()


def authed(nsqd, secret):
    c = connect(nsqd)
    ft, data = do_auth(c, secret)
    assert ft == protocol_v2.FRAME_TYPE_RESPONSE, (data, nsqd.log.stream.getvalue()[-2000:])
    return c


def fails_fatally(c, text):
    assert c.read_error() == text
    c.assert_closed()
