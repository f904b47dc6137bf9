"""TLS: the IDENTIFY upgrade, client certificates, --tls-required, --tls-min-version, HTTPS, /stats."""

import json
import socket
import ssl
import threading
import urllib.error
import urllib.request

import pytest

from nsqd_threaded import Options
from nsqd_threaded.client.consumer import Consumer
from nsqd_threaded.client.producer import Producer
from nsqd_threaded.settings.options import OptionError
from nsqd_threaded.wire import protocol_v2

from support.transport import certs, connect, identify, start_tls, tls_options  # noqa: F401 (fixture)
from support.wire import wait_for

pytestmark = pytest.mark.timeout(60)


def http_get(nsqd, path, context=None):
    if context is None:
        url = "http://%s:%d%s" % (nsqd.http_address + (path,))
    else:
        url = "https://%s:%d%s" % (nsqd.https_address + (path,))
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), e.read()


def producer_stats(nsqd):
    status, _, body = http_get(nsqd, "/stats?format=json")
    assert status == 200
    return json.loads(body)["producers"]


def tls_conn(nsqd, context, **fields):
    conn = connect(nsqd)
    answer = identify(conn, tls_v1=True, **fields)
    assert answer["tls_v1"] is True
    start_tls(conn, context)
    assert conn.read_response() == b"OK"  # inside TLS
    return conn


def test_identify_upgrades_to_tls_and_ok_comes_inside(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs))
    with connect(nsqd) as conn:
        answer = identify(conn, tls_v1=True)
        assert (answer["tls_v1"], answer["deflate"], answer["snappy"]) == (True, False, False)
        start_tls(conn, certs.client_context())
        assert conn.sock.version() == "TLSv1.3"
        assert conn.read_response() == b"OK"
        assert conn.pub("t", b"secret") == b"OK"
        (client,) = producer_stats(nsqd)
        assert client["tls"] is True
        assert client["tls_version"] == "TLS1.3"
        # Go names only a fixed list of TLS 1.2 suites; TLS 1.3 suites are "Unknown <code>".
        code = {"TLS_AES_128_GCM_SHA256": 4865, "TLS_AES_256_GCM_SHA384": 4866,
                "TLS_CHACHA20_POLY1305_SHA256": 4867}[conn.sock.cipher()[0]]
        assert client["tls_cipher_suite"] == "Unknown %d" % code
        assert client["tls_negotiated_protocol"] == ""
        assert client["tls_negotiated_protocol_is_mutual"] is True
        conn.sub("t", "c", rdy=1)
        assert conn.read_message()[3] == b"secret"


def test_tls12_stats_name_the_cipher_suite_as_go(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs))
    context = certs.client_context(maximum_version=ssl.TLSVersion.TLSv1_2)
    with tls_conn(nsqd, context) as conn:
        assert conn.pub("t", b"x") == b"OK"
        (client,) = producer_stats(nsqd)
        assert client["tls_version"] == "TLS1.2"
        assert client["tls_cipher_suite"] == "TLS_ECDHE_RSA_WITH_" + conn.sock.cipher()[0].split("ECDHE-RSA-")[1].replace(
            "-", "_").replace("AES128", "AES_128").replace("AES256", "AES_256")


def test_plain_connection_stats_and_no_tls_without_cert(make_nsqd, certs):
    nsqd = make_nsqd()
    with connect(nsqd) as conn:
        answer = identify(conn, tls_v1=True)
        assert answer["tls_v1"] is False  # no cert: not negotiated, no upgrade
        assert conn.pub("t", b"x") == b"OK"
        (client,) = producer_stats(nsqd)
        assert (client["tls"], client["tls_version"], client["tls_cipher_suite"]) == (False, "", "")


def test_wrong_ca_fails_the_handshake_and_only_that_connection(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs))
    with connect(nsqd) as conn:
        identify(conn, tls_v1=True)
        with pytest.raises(ssl.SSLCertVerificationError):
            start_tls(conn, certs.client_context(ca=certs.other_ca))
    with tls_conn(nsqd, certs.client_context()) as good:
        assert good.pub("t", b"still served") == b"OK"


def test_handshake_failure_is_identify_failed_in_the_clear(make_nsqd, certs):
    """A client that is no TLS client at all gets nsqd's E_IDENTIFY_FAILED, then the close."""
    nsqd = make_nsqd(**tls_options(certs))
    with connect(nsqd) as conn:
        identify(conn, tls_v1=True)
        conn.send(b"NOT A CLIENT HELLO" * 10)
        assert conn.read_error().startswith("E_IDENTIFY_FAILED IDENTIFY failed ")
        conn.assert_closed()


@pytest.mark.parametrize("policy", ["require", "require-verify"])
def test_client_certificate_required(make_nsqd, certs, policy):
    nsqd = make_nsqd(**tls_options(certs, tls_client_auth_policy=policy, tls_root_ca_file=certs.ca))
    assert nsqd.options.tls_required == 2  # a client auth policy implies --tls-required
    with connect(nsqd) as conn:
        identify(conn, tls_v1=True)
        start_tls(conn, certs.client_context())  # TLS 1.3: the client's side completes first
        # ...then nsqd refuses the session: an alert, never the OK.
        with pytest.raises((ssl.SSLError, EOFError, ConnectionError)):
            conn.read_frame()
    with tls_conn(nsqd, certs.client_context(client_cert=True)) as conn:
        assert conn.pub("t", b"x") == b"OK"


@pytest.mark.parametrize("required", [1, 2])
def test_tls_required_refuses_plain_commands(make_nsqd, certs, required):
    nsqd = make_nsqd(**tls_options(certs, tls_required=required))
    for cmd in (b"PUB t", b"NOP", b"SUB t c", b"BOGUS"):
        with connect(nsqd) as conn:
            conn.cmd(cmd)
            name = cmd.split()[0].decode()
            assert conn.read_error() == "E_INVALID cannot %s in current state (TLS required)" % name
            conn.assert_closed()
    with connect(nsqd) as conn:  # IDENTIFY is allowed, and then TLS lifts the gate
        identify(conn, tls_v1=True)
        start_tls(conn, certs.client_context())
        assert conn.read_response() == b"OK"
        assert conn.pub("t", b"x") == b"OK"


def test_tls_required_plain_http_answers_tls_required(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs, tls_required=2))
    for path in ("/ping", "/stats", "/nope"):
        status, headers, body = http_get(nsqd, path)
        assert status == 403
        assert headers["Content-Type"] == "application/json; charset=utf-8"
        assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
        assert body == b'{"message": "TLS_REQUIRED", "https_port": %d}' % nsqd.https_address[1]
    assert http_get(nsqd, "/ping", certs.client_context())[::2] == (200, b"OK")


def test_tls_required_tcp_https_keeps_plain_http(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs, tls_required=1))
    assert http_get(nsqd, "/ping")[::2] == (200, b"OK")


def test_tls_min_version_refuses_an_older_client(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs, tls_min_version=0x0304))
    with connect(nsqd) as conn:
        identify(conn, tls_v1=True)
        with pytest.raises(ssl.SSLError):
            start_tls(conn, certs.client_context(maximum_version=ssl.TLSVersion.TLSv1_2))
    with tls_conn(nsqd, certs.client_context()) as conn:
        assert conn.pub("t", b"x") == b"OK"


def test_https_ping_pub_stats(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs))
    context = certs.client_context()
    assert http_get(nsqd, "/ping", context)[::2] == (200, b"OK")
    req = urllib.request.Request("https://%s:%d/pub?topic=t" % nsqd.https_address, data=b"over https")
    with urllib.request.urlopen(req, timeout=10, context=context) as r:
        assert (r.status, r.read()) == (200, b"OK")
    status, _, body = http_get(nsqd, "/stats?format=json", context)
    assert status == 200
    (topic,) = json.loads(body)["topics"]
    assert (topic["topic_name"], topic["message_count"]) == ("t", 1)
    # A plain-HTTP client on the HTTPS port is dropped, and HTTPS goes on.
    with socket.create_connection(nsqd.https_address, timeout=10) as s:
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(65536)
    assert http_get(nsqd, "/ping", context)[::2] == (200, b"OK")


def test_buffered_tls_records_are_served_without_more_input(make_nsqd, certs):
    """Two commands in two TLS records arriving in one segment: both answered (none left above the socket)."""
    nsqd = make_nsqd(**tls_options(certs))
    context = certs.client_context()
    with connect(nsqd) as conn:
        identify(conn, tls_v1=True)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
        sock = conn.sock
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                data = sock.recv(65536)
                assert data, "closed during the handshake"
                incoming.write(data)
        sock.sendall(outgoing.read())
        tls.write(b"PUB t\n" + protocol_v2.encode_size(1) + b"a")
        tls.write(b"PUB t\n" + protocol_v2.encode_size(1) + b"b")
        sock.sendall(outgoing.read())  # two records, one send
        answers = []
        while len(answers) < 3:  # the upgrade's OK and the two PUBs'
            data = sock.recv(65536)
            assert data, "closed"
            incoming.write(data)
            try:
                while True:
                    answers.append(tls.read(65536))
            except ssl.SSLWantReadError:
                pass
            answers = [b"".join(answers)]
            answers = [answers[0][i : i + 10] for i in range(0, len(answers[0]), 10)]
        assert answers == [b"\x00\x00\x00\x06\x00\x00\x00\x00OK"] * 3


def test_own_client_tls_with_client_cert(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs, tls_client_auth_policy="require-verify", tls_root_ca_file=certs.ca))
    tls = {"ca_certs": certs.ca, "certfile": certs.client_cert, "keyfile": certs.client_key}
    bodies = [b"m%d" % i for i in range(200)]
    with Producer(nsqd.tcp_address, tls_v1=True, tls_options=tls) as producer:
        producer.mpub("t", bodies)
    with Consumer(nsqd.tcp_address, "t", "c", max_in_flight=50, tls_v1=True, tls_options=tls) as consumer:
        got = []
        for _ in bodies:
            m = consumer.get(timeout=10)
            got.append(m.body)
            m.fin()
        assert sorted(got) == sorted(bodies)
        assert all(conn.tls for conn in consumer._conns)


def test_own_client_with_an_ssl_context(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs))
    with Producer(nsqd.tcp_address, tls_v1=certs.client_context()) as producer:
        producer.pub("t", b"x")
        (client,) = producer_stats(nsqd)
        assert client["tls"] is True


# -- startup validation ------------------------------------------------------


def test_validation_messages(certs, tmp_path):
    def problem(**kwargs):
        with pytest.raises(OptionError) as e:
            Options(**kwargs).validate()
        return str(e.value)

    assert problem(tls_required=2) == "cannot require TLS client connections without TLS key and cert"
    assert problem(tls_client_auth_policy="require") == (
        "cannot require TLS client connections without TLS key and cert")
    assert problem(tls_key=certs.server_key) == "failed to build TLS config - open : no such file or directory"
    missing = str(tmp_path / "missing.pem")
    assert problem(tls_cert=missing, tls_key=certs.server_key) == (
        "failed to build TLS config - open %s: no such file or directory" % missing)
    assert problem(tls_cert=certs.server_cert, tls_key=certs.client_key).startswith("failed to build TLS config - ")
    assert problem(max_deflate_level=10) == "--max-deflate-level must be [1,9]"
    ok = Options(tls_cert=certs.server_cert, tls_key=certs.server_key, tls_required=1).validate()
    assert ok.tls_required == 1


def test_flags_that_restate_defaults_are_accepted():
    from nsqd_threaded.testing import resolve_options

    values = resolve_options(["--snappy=true", "--deflate=true", "--tls-required=false", "--max-deflate-level=6",
                              "--tls-min-version=tls1.2", "--https-address=127.0.0.1:0"])
    opts = Options(**values).validate()
    assert (opts.snappy, opts.deflate, opts.tls_required, opts.tls_min_version) == (True, True, 0, 0x0303)
    with pytest.raises(ValueError):
        resolve_options(["--tls-min-version=ssl3.0"])


def test_no_threads_left(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs))
    with tls_conn(nsqd, certs.client_context()):
        pass
    assert http_get(nsqd, "/ping", certs.client_context())[::2] == (200, b"OK")
    nsqd.stop()
    wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("nsqd-https")],
             what="HTTPS threads to end")


def test_metrics_count_tls_and_compressed_clients(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs))
    tls = {"ca_certs": certs.ca}
    with Producer(nsqd.tcp_address, tls_v1=True, tls_options=tls, snappy=True) as p1, \
            Producer(nsqd.tcp_address, deflate=True) as p2:
        p1.pub("t", b"x")
        p2.pub("t", b"y")
        _, _, body = http_get(nsqd, "/metrics")
        lines = body.decode().splitlines()
        assert "nsq_clients 2" in lines
        assert "nsq_clients_tls 1" in lines
        assert 'nsq_clients_compressed{codec="snappy"} 1' in lines
        assert 'nsq_clients_compressed{codec="deflate"} 1' in lines


def test_parked_tls_connection_wakes_for_records_sent_together(make_nsqd, certs):
    """A TLS connection idle long enough to park on the idle watcher, then two commands in one segment."""
    nsqd = make_nsqd(connection_threads=True, **tls_options(certs))  # (the poller parks no thread)
    if nsqd.idle_watcher is None:
        pytest.skip("no idle watcher on this platform")
    context = certs.client_context()
    with tls_conn(nsqd, context) as conn:
        # The connection thread parks after IDLE_AFTER without input.
        wait_for(lambda: nsqd.idle_watcher._parked, timeout=20, what="the connection to park")
        conn.sock.sendall(b"PUB t\n" + protocol_v2.encode_size(1) + b"a" + b"PUB t\n" + protocol_v2.encode_size(1) + b"b")
        assert [conn.read_response(), conn.read_response()] == [b"OK", b"OK"]


def test_auth_server_gets_tls_and_the_client_certificate_cn(make_nsqd, certs):
    """AUTH over TLS with a client certificate: the auth server is told tls=true and the CN."""
    from support.auth import GRANTS, AuthServer

    server = AuthServer()
    try:
        nsqd = make_nsqd(auth_http_addresses=[server.address],
                         **tls_options(certs, tls_client_auth_policy="require-verify", tls_root_ca_file=certs.ca))
        with tls_conn(nsqd, certs.client_context(client_cert=True)) as conn:
            conn.cmd(b"AUTH", b"all")
            assert json.loads(conn.read_response())["identity"] == GRANTS["all"]["identity"]
            assert conn.pub("t", b"x") == b"OK"
        (_, _, query, _, _), = server.requests
        assert query["tls"] == ["true"] and query["common_name"] == ["nsqd-test-client"]
    finally:
        server.close()
