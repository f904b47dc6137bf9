"""AUTH over TCP against a real auth server: what each command may do, expiry, failures."""

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

from nsqd_threaded.wire import protocol_v2

from support.auth import (  # noqa: F401 (fixtures among them)
    auth_nsqd,
    auth_server,
    authed,
    closed_port,
    connect,
    do_auth,
    fails_fatally,
    grant,
    make_auth_server,
)
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(60)


# -- over TCP (raw bytes) ----------------------------------------------------


def test_identify_says_auth_required(auth_nsqd, nsqd):
    with Conn(auth_nsqd.tcp_address) as c:
        assert json.loads(c.identify(feature_negotiation=True))["auth_required"] is True
    with Conn(nsqd.tcp_address) as c:
        assert json.loads(c.identify(feature_negotiation=True))["auth_required"] is False


def test_auth_get_request_and_answer(auth_nsqd, auth_server):
    with connect(auth_nsqd) as c:
        ft, data = do_auth(c, "all")
        assert ft == protocol_v2.FRAME_TYPE_RESPONSE
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
        assert ft == protocol_v2.FRAME_TYPE_RESPONSE, (data, auth_nsqd.log.stream.getvalue()[-3000:])
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
        (b"MPUB t", protocol_v2.encode_mpub_body([b"a"]), "MPUB"),
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
        c.cmd(b"MPUB other", protocol_v2.encode_mpub_body([b"a"]))
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
        auth_server.answers["short"] = grant("^other$", [".*"], ["publish"], ttl=1)
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
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed unused (the test failed before nsqd asked)
        with conn:
            conn.recv(65536)
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000:
                if stop.wait(0.05):
                    return
                try:
                    conn.sendall(bytes([b]))
                except OSError:
                    return

    t = threading.Thread(target=serve, name="trickling-auth-server", daemon=True)
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
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes an accept() still waiting (Linux)
        except OSError:
            pass
        listener.close()
        t.join(10)


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
