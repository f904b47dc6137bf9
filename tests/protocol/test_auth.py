"""AUTH: the pure parts (response parsing, permission checks, requests), our client, and go-nsq's tools."""

import json
import os
import subprocess
import threading

import pytest

from nsqd_threaded import Options
from nsqd_threaded.broker import auth
from nsqd_threaded.client import Consumer, NSQError, Producer
from nsqd_threaded.settings.options import OptionError

from support.auth import GO_BIN, GRANTS, auth_nsqd, auth_server, make_auth_server  # noqa: F401 (fixtures among them)
from support.wire import wait_for

pytestmark = pytest.mark.timeout(60)


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

    from support.pynsq import Loop

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
