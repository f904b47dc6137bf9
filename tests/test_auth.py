"""AUTH with a real auth server: the request nsqd makes, its answer, and the per-command checks.

The auth server is an ``http.server`` started by each test on 127.0.0.1:0;
what it answers is decided per secret (see :data:`GRANTS`).
"""

import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

from nsqd_threaded import Options
from nsqd_threaded.wire import protocol
from nsqd_threaded.broker import auth
from nsqd_threaded.client import Consumer, NSQError, Producer
from nsqd_threaded.settings.options import OptionError

from wire import Conn, wait_for

pytestmark = pytest.mark.timeout(60)

GO_BIN = "/work/shared/reference/go-nsq-1.3.0"


def _grant(topic, channels, permissions, identity="someone", ttl=3600):
    return {
        "ttl": ttl,
        "identity": identity,
        "identity_url": "http://example.com/%s" % identity,
        "authorizations": [{"topic": topic, "channels": channels, "permissions": permissions}],
    }


# secret -> the auth server's 200 answer
GRANTS = {
    "all": _grant(".*", [".*"], ["subscribe", "publish"], identity="alice"),
    # unanchored: "ok" matches any topic containing "ok"; channel "good" any channel containing it
    "ok-topics": _grant("ok", ["good"], ["subscribe", "publish"], identity="bob"),
    "pub-only": _grant("^pub$", [".*"], ["publish"]),
    "sub-only": _grant("^sub$", [".*"], ["subscribe"]),
    "no-channels": _grant(".*", [], ["subscribe", "publish"]),
    "nothing": {"ttl": 3600, "identity": "nobody", "authorizations": []},
    "anonymous": {"ttl": 3600, "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}]},
    "short": _grant(".*", [".*"], ["publish"], ttl=1),
    "<html>&": _grant(".*", [".*"], ["publish"], identity="<x&y>"),
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

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = False  # server_close joins the request threads
        if context is not None:
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.address = "127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="test-auth-server")
        self.thread.start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


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
    assert ft == protocol.FRAME_TYPE_RESPONSE, (data, nsqd.log.stream.getvalue()[-2000:])
    return c


def fails_fatally(c, text):
    assert c.read_error() == text
    c.assert_closed()


# -- pure parts ----------------------------------------------------------------


def test_parse_a_grant():
    state = auth.parse_auth_response(json.dumps(GRANTS["ok-topics"]).encode(), now=100.0)
    assert (state.identity, state.identity_url, state.ttl, state.expires) == ("bob", "http://example.com/bob", 3600, 3700.0)
    assert not state.expired(3700.0) and state.expired(3700.5)
    assert state.response() == b'{"identity":"bob","identity_url":"http://example.com/bob","permission_count":1}'


def test_regexes_are_unanchored():
    state = auth.parse_auth_response(json.dumps(GRANTS["ok-topics"]).encode())
    assert state.is_allowed("ok", "good")
    assert state.is_allowed("not_ok_at_all", "very-good-one")
    assert not state.is_allowed("nope", "good")
    assert not state.is_allowed("ok", "bad")
    # publishing checks channel "" against the channel regexes: "good" does not match ""
    assert not state.is_allowed("ok", "")


def test_publish_and_subscribe_permissions():
    pub = auth.parse_auth_response(json.dumps(GRANTS["pub-only"]).encode())
    assert pub.is_allowed("pub", "") and not pub.is_allowed("pub", "c") and not pub.is_allowed("pubx", "")
    sub = auth.parse_auth_response(json.dumps(GRANTS["sub-only"]).encode())
    assert sub.is_allowed("sub", "c") and not sub.is_allowed("sub", "")


def test_empty_channel_list_never_grants_publish():
    state = auth.parse_auth_response(json.dumps(GRANTS["no-channels"]).encode())
    assert not state.is_allowed("t", "") and not state.is_allowed("t", "c")


def test_any_authorization_may_grant():
    doc = {"ttl": 5, "authorizations": [
        {"topic": "^a$", "channels": [".*"], "permissions": ["publish"]},
        {"topic": "^b$", "channels": ["^x$"], "permissions": ["subscribe"]},
    ]}
    state = auth.parse_auth_response(json.dumps(doc).encode())
    assert state.is_allowed("a", "") and state.is_allowed("b", "x")
    assert not state.is_allowed("b", "") and not state.is_allowed("a", "x")
    assert state.response() == b'{"identity":"","identity_url":"","permission_count":2}'


def test_go_json_decoding_rules():
    # keys match case-insensitively; null is as absent; unknown keys are ignored
    doc = b'{"TTL": 7, "Identity": null, "extra": 1, "Authorizations": [{"TOPIC": "t", "Channels": null, "permissions": null}]}'
    state = auth.parse_auth_response(doc)
    assert state.ttl == 7 and state.identity == "" and len(state.authorizations) == 1
    assert not state.is_allowed("t", "")


@pytest.mark.parametrize(
    "body, reason",
    [
        (b"<html>", "invalid JSON"),
        (b"[1]", "response: want a JSON object"),
        (b"null", "invalid TTL 0 (must be >0)"),
        (b'{"authorizations": []}', "invalid TTL 0 (must be >0)"),
        (b'{"ttl": -1}', "invalid TTL -1 (must be >0)"),
        (b'{"ttl": 3600.0}', "ttl: want an integer"),
        (b'{"ttl": "3600"}', "ttl: want an integer"),
        (b'{"ttl": 1, "identity": 5}', "identity: want a string"),
        (b'{"ttl": 1, "authorizations": {}}', "authorizations: want an array"),
        (b'{"ttl": 1, "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["read"]}]}',
         "unknown permission read"),
        (b'{"ttl": 1, "authorizations": [{"topic": "(", "channels": [], "permissions": []}]}',
         'unable to compile topic "("'),
        (b'{"ttl": 1, "authorizations": [{"topic": "", "channels": ["[a"], "permissions": []}]}',
         'unable to compile channel "[a"'),
        (b'{"ttl": 1, "authorizations": [{"topic": "", "channels": "x", "permissions": []}]}',
         "channels: want an array of strings"),
    ],
)
def test_unusable_answers(body, reason):
    with pytest.raises(auth.AuthError) as e:
        auth.parse_auth_response(body)
    assert str(e.value).startswith(reason), str(e.value)


def test_request_encoding():
    params = auth.auth_params("127.0.0.1", False, b"s e/c&r=t", "")
    assert auth.get_url("http://h:1/auth", params) == (
        "http://h:1/auth?common_name=&remote_ip=127.0.0.1&secret=s+e%2Fc%26r%3Dt&tls=false"
    )
    assert auth.post_body(auth.auth_params("::1", True, b"good", "cn")) == (
        b'{"common_name":["cn"],"remote_ip":["::1"],"secret":["good"],"tls":["true"]}'
    )
    assert auth.auth_endpoint("h:1") == "http://h:1/auth"
    assert auth.auth_endpoint("https://h/x?y=1") == "https://h/x?y=1"
    assert auth.https_endpoint("http://h:1/auth?a=b", b'{"message": "TLS_REQUIRED", "https_port": 4152}') == (
        "https://h:4152/auth?a=b"
    )


def test_request_method_is_validated():
    Options(auth_http_request_method="post").validate()
    with pytest.raises(OptionError, match="^--auth-http-request-method must be post or get$"):
        Options(auth_http_request_method="POST").validate()


@pytest.mark.parametrize("value", ["POST", "put", ""])
def test_cli_refuses_other_request_methods(value):
    from click.testing import CliRunner
    from nsqd_threaded import cli

    result = CliRunner().invoke(cli.main, ["--auth-http-request-method=" + value, "--auth-http-address=127.0.0.1:1"])
    assert result.exit_code == 1, result.output
    assert result.output.strip().endswith(
        " FATAL: failed to instantiate nsqd - --auth-http-request-method must be post or get")
    assert len(result.output.strip().splitlines()) == 1


def test_config_file_keys(tmp_path):
    from nsqd_threaded.settings import config

    path = tmp_path / "nsqd.cfg"
    path.write_text('auth_http_addresses = ["a:1", "http://b/x"]\nauth_http_request_method = "post"\n')
    values, warnings = config.read(str(path))
    assert values == {"auth_http_addresses": ["a:1", "http://b/x"], "auth_http_request_method": "post"}
    assert warnings == []


# -- over TCP (raw bytes) ----------------------------------------------------


def test_identify_says_auth_required(auth_nsqd, nsqd):
    with Conn(auth_nsqd.tcp_address) as c:
        assert json.loads(c.identify(feature_negotiation=True))["auth_required"] is True
    with Conn(nsqd.tcp_address) as c:
        assert json.loads(c.identify(feature_negotiation=True))["auth_required"] is False


def test_auth_get_request_and_answer(auth_nsqd, auth_server):
    with connect(auth_nsqd) as c:
        ft, data = do_auth(c, "all")
        assert ft == protocol.FRAME_TYPE_RESPONSE
        assert data == b'{"identity":"alice","identity_url":"http://example.com/alice","permission_count":1}'
        assert c.pub("t", b"hello") == b"OK"
    (method, path, query, headers, body), = auth_server.requests
    assert method == "GET" and body == b""
    assert path == "/auth?common_name=&remote_ip=127.0.0.1&secret=all&tls=false"
    assert headers["Accept"] == "application/vnd.nsq; version=1.0"


def test_auth_post_request(make_nsqd, auth_server):
    nsqd = make_nsqd(auth_http_addresses=["http://%s/auth" % auth_server.address], auth_http_request_method="post")
    with authed(nsqd, "all") as c:
        assert c.pub("t", b"hello") == b"OK"
    (method, path, query, headers, body), = auth_server.requests
    assert (method, path) == ("POST", "/auth")
    assert body == b'{"common_name":[""],"remote_ip":["127.0.0.1"],"secret":["all"],"tls":["false"]}'
    assert headers["Content-Type"] == "application/json"
    assert headers["Accept"] == "application/vnd.nsq; version=1.0"


def test_auth_before_identify(auth_nsqd):
    with Conn(auth_nsqd.tcp_address) as c:
        ft, data = do_auth(c, "all")
        assert ft == protocol.FRAME_TYPE_RESPONSE, (data, auth_nsqd.log.stream.getvalue()[-3000:])
        c.identify()
        c.sub("t", "c", rdy=1)
        with authed(auth_nsqd, "all") as publisher:  # on c, the message could overtake the OK
            assert publisher.pub("t", b"m") == b"OK"
        assert c.read_message()[3] == b"m"


def test_auth_twice(auth_nsqd):
    with authed(auth_nsqd, "all") as c:
        c.cmd(b"AUTH", b"all")
        fails_fatally(c, "E_INVALID AUTH already set")


def test_auth_after_sub(auth_nsqd):
    with authed(auth_nsqd, "all") as c:
        c.sub("t", "c")
        c.cmd(b"AUTH", b"all")
        fails_fatally(c, "E_INVALID cannot AUTH in current state")


def test_auth_disabled_without_auth_server(nsqd):
    with connect(nsqd) as c:
        c.cmd(b"AUTH", b"x")
        fails_fatally(c, "E_AUTH_DISABLED AUTH disabled")


@pytest.mark.parametrize(
    "line, body, cmd",
    [
        (b"PUB t", b"m", "PUB"),
        (b"DPUB t 10", b"m", "DPUB"),
        (b"MPUB t", protocol.encode_mpub_body([b"a"]), "MPUB"),
        (b"SUB t c", None, "SUB"),
    ],
)
def test_commands_before_auth(auth_nsqd, line, body, cmd):
    with connect(auth_nsqd) as c:
        c.cmd(line, body)
        fails_fatally(c, "E_AUTH_FIRST AUTH required before %s" % cmd)
    assert auth_nsqd.get_existing_topic("t") is None


def test_nop_and_identify_need_no_auth(auth_nsqd):
    with connect(auth_nsqd) as c:
        c.cmd(b"NOP")
        c.identify()
        c.assert_silent(0.05)


def test_no_authorizations_found(auth_nsqd):
    with connect(auth_nsqd) as c:
        c.cmd(b"AUTH", b"nothing")
        fails_fatally(c, "E_UNAUTHORIZED AUTH no authorizations found")


def test_unknown_secret_is_auth_failed(auth_nsqd):
    with connect(auth_nsqd) as c:
        c.cmd(b"AUTH", b"who-knows")  # the server answers 401
        fails_fatally(c, "E_AUTH_FAILED AUTH failed")


def test_allowed_topics_and_channels(auth_nsqd):
    with authed(auth_nsqd, "ok-topics") as c:
        c.sub("is_ok_1", "very_good")  # unanchored on both
    with authed(auth_nsqd, "ok-topics") as c:
        c.cmd(b"SUB is_ok_1 bad")
        fails_fatally(c, 'E_UNAUTHORIZED AUTH failed for SUB on "is_ok_1" "bad"')
    with authed(auth_nsqd, "ok-topics") as c:
        c.cmd(b"SUB nope good")
        fails_fatally(c, 'E_UNAUTHORIZED AUTH failed for SUB on "nope" "good"')
    with authed(auth_nsqd, "ok-topics") as c:
        c.cmd(b"PUB is_ok_2", b"m")  # channels ["good"] never match "": no publishing
        fails_fatally(c, 'E_UNAUTHORIZED AUTH failed for PUB on "is_ok_2" ""')


def test_publish_permission(auth_nsqd):
    with authed(auth_nsqd, "pub-only") as c:
        assert c.pub("pub", b"1") == b"OK"
        assert c.mpub("pub", [b"2", b"3"]) == b"OK"
        c.cmd(b"DPUB pub 10", b"4")
        assert c.read_response() == b"OK"
        c.cmd(b"DPUB pubx 10", b"5")
        fails_fatally(c, 'E_UNAUTHORIZED AUTH failed for DPUB on "pubx" ""')
    with authed(auth_nsqd, "pub-only") as c:
        c.cmd(b"MPUB other", protocol.encode_mpub_body([b"a"]))
        fails_fatally(c, 'E_UNAUTHORIZED AUTH failed for MPUB on "other" ""')
    with authed(auth_nsqd, "pub-only") as c:
        c.cmd(b"SUB pub c")
        fails_fatally(c, 'E_UNAUTHORIZED AUTH failed for SUB on "pub" "c"')
    assert auth_nsqd.get_existing_topic("other") is None  # MPUB is refused before the topic is made


def test_subscribe_permission(auth_nsqd):
    with authed(auth_nsqd, "sub-only") as c:
        c.sub("sub", "c")
    with authed(auth_nsqd, "sub-only") as c:
        c.cmd(b"PUB sub", b"m")
        fails_fatally(c, 'E_UNAUTHORIZED AUTH failed for PUB on "sub" ""')


def test_ttl_expiry_asks_again(auth_nsqd, auth_server):
    with authed(auth_nsqd, "short") as c:
        t0 = time.monotonic()  # (a loaded machine may already be past the TTL: hence the >=)
        for i in range(3):  # within the TTL, the cached answer serves
            assert c.pub("t", b"%d" % i) == b"OK"
        asked = len(auth_server.requests)
        assert asked >= 1
        # The answer is cached for 1 s; after that the next PUB asks again.
        wait_for(lambda: time.monotonic() > t0 + 1.2, what="the TTL to pass")
        assert c.pub("t", b"2") == b"OK"
        assert len(auth_server.requests) == asked + 1
        # The new answer takes over: once expired again, a refusal applies.
        auth_server.answers["short"] = _grant("^other$", [".*"], ["publish"], ttl=1)
        t1 = time.monotonic()
        wait_for(lambda: time.monotonic() > t1 + 1.2, what="the TTL to pass")
        c.cmd(b"PUB t", b"3")
        fails_fatally(c, 'E_UNAUTHORIZED AUTH failed for PUB on "t" ""')
    assert len(auth_server.requests) == asked + 2


def test_ttl_expiry_with_the_server_gone(make_nsqd, make_auth_server):
    server = make_auth_server()
    nsqd = make_nsqd(auth_http_addresses=[server.address], http_client_connect_timeout=1.0)
    with authed(nsqd, "short") as c:
        t0 = time.monotonic()
        assert c.pub("t", b"1") == b"OK"
        server.close()
        wait_for(lambda: time.monotonic() > t0 + 1.2, what="the TTL to pass")
        c.cmd(b"PUB t", b"2")
        fails_fatally(c, "E_AUTH_FAILED AUTH failed")


def test_server_down(make_nsqd):
    nsqd = make_nsqd(auth_http_addresses=["127.0.0.1:%d" % closed_port()])
    with connect(nsqd) as c:
        c.cmd(b"AUTH", b"all")
        fails_fatally(c, "E_AUTH_FAILED AUTH failed")
    assert "failed auth against 127.0.0.1:" in nsqd.log.stream.getvalue()  # the reason is logged, not sent


def test_unusable_addresses(make_nsqd):
    nsqd = make_nsqd(auth_http_addresses=["ftp://127.0.0.1/auth", "http:///auth", "127.0.0.1:port"])
    with connect(nsqd) as c:
        c.cmd(b"AUTH", b"all")
        fails_fatally(c, "E_AUTH_FAILED AUTH failed")
    assert nsqd.log.stream.getvalue().count("failed auth against") == 3


@pytest.mark.parametrize("mode", ["garbage", "500"])
def test_server_answers_badly(make_nsqd, make_auth_server, mode):
    server = make_auth_server(mode)
    nsqd = make_nsqd(auth_http_addresses=[server.address])
    with connect(nsqd) as c:
        c.cmd(b"AUTH", b"all")
        fails_fatally(c, "E_AUTH_FAILED AUTH failed")
    assert len(server.requests) == 1


def test_slow_server_is_bounded(make_nsqd, make_auth_server):
    server = make_auth_server("slow")
    nsqd = make_nsqd(auth_http_addresses=[server.address], http_client_request_timeout=0.3)
    with connect(nsqd) as c:
        c.cmd(b"AUTH", b"all")
        fails_fatally(c, "E_AUTH_FAILED AUTH failed")  # well before the server's 30 s


def test_trickling_server_is_bounded(make_nsqd):
    """A server that sends its answer a byte at a time cannot stretch the request timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000:
                if stop.wait(0.05):
                    return
                try:
                    conn.sendall(bytes([b]))
                except OSError:
                    return

    t = threading.Thread(target=serve, name="trickling-auth-server")
    t.start()
    try:
        nsqd = make_nsqd(
            auth_http_addresses=["127.0.0.1:%d" % listener.getsockname()[1]], http_client_request_timeout=0.5
        )
        with connect(nsqd) as c:
            c.cmd(b"AUTH", b"all")
            fails_fatally(c, "E_AUTH_FAILED AUTH failed")
    finally:
        stop.set()
        listener.close()
        t.join()


@pytest.mark.skipif(not shutil.which("openssl"), reason="no openssl command")
def test_403_is_retried_over_https(make_nsqd, make_auth_server, tmp_path):
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    https = make_auth_server(context=context)
    plain = make_auth_server("403")
    plain.https_port = int(https.address.rpartition(":")[2])
    nsqd = make_nsqd(auth_http_addresses=[plain.address], tls_root_ca_file=cert)
    with authed(nsqd, "all") as c:
        assert c.pub("t", b"m") == b"OK"
    assert [r[1] for r in plain.requests] == [r[1] for r in https.requests] == [
        "/auth?common_name=&remote_ip=127.0.0.1&secret=all&tls=false"]


def test_servers_tried_until_one_answers(make_nsqd, auth_server):
    down = "127.0.0.1:%d" % closed_port()
    nsqd = make_nsqd(auth_http_addresses=[down, auth_server.address, down])
    for _ in range(6):  # whatever the random start, the live one answers
        with authed(nsqd, "all") as c:
            assert c.pub("t", b"m") == b"OK"
    assert len(auth_server.requests) == 6


def test_html_in_identity_is_escaped_as_go(auth_nsqd):
    with connect(auth_nsqd) as c:
        ft, data = do_auth(c, "<html>&")
        assert data == (
            b'{"identity":"\\u003cx\\u0026y\\u003e","identity_url":"http://example.com/\\u003cx\\u0026y\\u003e",'
            b'"permission_count":1}'
        )


def _stats_clients(nsqd):
    host, port = nsqd.http_address
    with urllib.request.urlopen("http://%s:%d/stats?format=json" % (host, port), timeout=10) as r:
        doc = json.loads(r.read())
    clients = list(doc["producers"] or [])
    for t in doc["topics"]:
        for ch in t["channels"]:
            clients.extend(ch["clients"])
    return clients


def test_stats_show_auth_fields(auth_nsqd):
    with authed(auth_nsqd, "all") as pub, authed(auth_nsqd, "all") as sub:
        sub.sub("t", "c")
        assert pub.pub("t", b"m") == b"OK"
        with connect(auth_nsqd) as unauthed:
            unauthed.cmd(b"NOP")
            clients = _stats_clients(auth_nsqd)
            assert len(clients) == 2
            for cl in clients:
                keys = list(cl)
                assert keys[keys.index("user_agent") + 1 : keys.index("user_agent") + 4] == [
                    "authed", "auth_identity", "auth_identity_url"]
                assert (cl["authed"], cl["auth_identity"], cl["auth_identity_url"]) == (
                    True, "alice", "http://example.com/alice")
    with authed(auth_nsqd, "anonymous") as pub:  # no identity: those keys are left out
        assert pub.pub("t", b"m") == b"OK"
        (cl,) = _stats_clients(auth_nsqd)
        assert cl["authed"] is True and "auth_identity" not in cl and "auth_identity_url" not in cl


# -- clients ------------------------------------------------------------------


def test_our_client_with_auth_secret(auth_nsqd):
    received = []
    got = threading.Event()

    def handler(m):
        received.append(m.body)
        got.set()

    with Consumer(auth_nsqd.tcp_address, "t", "c", handler, auth_secret="all"):
        with Producer(auth_nsqd.tcp_address, auth_secret="all") as producer:
            producer.pub("t", b"hello")
        assert got.wait(10)
    assert received == [b"hello"]


def test_our_client_without_auth_secret(auth_nsqd):
    with Producer(auth_nsqd.tcp_address) as producer:
        with pytest.raises(NSQError) as e:
            producer.pub("t", b"hello")
    assert e.value.code == "E_AUTH_FIRST"


def test_our_client_with_a_refused_secret(auth_nsqd):
    with pytest.raises(NSQError) as e:
        with Producer(auth_nsqd.tcp_address, auth_secret="nothing") as producer:
            producer.pub("t", b"hello")
    assert e.value.code == "E_UNAUTHORIZED"


def test_pynsq_with_auth_secret(auth_nsqd):
    import nsq
    from pynsq_util import Loop

    loop = Loop()
    try:
        address = "%s:%d" % auth_nsqd.tcp_address
        seen = []
        loop.reader(address, "t", "c", lambda m: seen.append(m.body) or True, auth_secret="all")
        w = nsq.Writer([address], auth_secret="all")
        loop.writers.append(w)  # closed by loop.close()
        loop.wait_writers_connected()
        state = loop.publish(w, "t", [b"a", b"b"], batch=1)
        loop.run_until(lambda: len(seen) == 2, 30, "2 messages")
        assert not state["errors"] and sorted(seen) == [b"a", b"b"]
    finally:
        loop.close()


# -- go-nsq's tools (run when the reference binaries are there) -----------------


@pytest.mark.skipif(not os.path.exists(os.path.join(GO_BIN, "to_nsq")), reason="Go reference binaries absent")
def test_go_nsq_tools_with_auth_secret(auth_nsqd, auth_server):
    address = "%s:%d" % auth_nsqd.tcp_address
    tail = subprocess.Popen(
        [os.path.join(GO_BIN, "nsq_tail"), "--nsqd-tcp-address", address, "--topic", "gt", "-n", "2",
         "--consumer-opt", "auth_secret,all"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: auth_nsqd.get_existing_topic("gt") is not None
                 and auth_nsqd.get_existing_topic("gt").channels(), what="nsq_tail to subscribe")
        pub = subprocess.run(
            [os.path.join(GO_BIN, "to_nsq"), "--nsqd-tcp-address", address, "--topic", "gt",
             "--producer-opt", "auth_secret,all"],
            input=b"one\ntwo\n", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30,
        )
        assert pub.returncode == 0, pub.stderr
        out, _ = tail.communicate(timeout=30)
        assert out.split() == [b"one", b"two"]
    finally:
        if tail.poll() is None:
            tail.kill()
        tail.wait(timeout=15)
        if tail.stdout:
            tail.stdout.close()
    secrets = [q["secret"] for _, _, q, _, _ in auth_server.requests]
    assert secrets == [["all"], ["all"]]
