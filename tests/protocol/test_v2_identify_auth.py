"""IDENTIFY and AUTH over TCP, without an auth server (tcp.md §7.2, §7.3)."""

import json
import time

import pytest

from support.v2 import conn, fatal, half_close, size, usize  # noqa: F401 (fixtures among them)
from support.wire import Conn

# -- §7.2 IDENTIFY -----------------------------------------------------------


def test_identify_without_feature_negotiation_answers_ok(conn):
    conn.cmd(b"IDENTIFY", json.dumps({"client_id": "x", "tls_v1": True, "snappy": True}).encode())
    assert conn.read_response() == b"OK"
    conn.assert_silent()
    assert conn.pub("identify_ok", b"x") == b"OK"  # no upgrade happened


def test_identify_params_after_the_name_are_ignored(conn):
    conn.cmd(b"IDENTIFY foo bar", b"{}")
    assert conn.read_response() == b"OK"


def test_identify_feature_negotiation_response_is_the_verified_json(conn):
    conn.cmd(b"IDENTIFY", b'{"feature_negotiation":true}')
    assert conn.read_response() == (
        b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
        b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
        b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,"output_buffer_timeout":250,'
        b'"topology_region":"","topology_zone":""}'
    )
    conn.assert_silent()  # IDENTIFY adds nothing after the JSON
    assert conn.pub("negotiated", b"x") == b"OK"


def test_identify_requested_upgrades_are_not_negotiated(make_nsqd):
    """Without a certificate and with --deflate=false --snappy=false nothing is upgraded."""
    nsqd = make_nsqd(deflate=False, snappy=False)
    conn = Conn(nsqd.tcp_address)
    body = {
        "feature_negotiation": True,
        "tls_v1": True,
        "deflate": True,
        "deflate_level": 3,
        "snappy": True,  # both requested but neither enabled: no error
        "msg_timeout": 5000,
        "sample_rate": 10,
        "output_buffer_size": -1,
    }
    conn.cmd(b"IDENTIFY", json.dumps(body).encode())
    doc = json.loads(conn.read_response())
    assert (doc["tls_v1"], doc["deflate"], doc["snappy"]) == (False, False, False)
    assert doc["deflate_level"] == 6  # the requested level counts only when deflate is negotiated
    assert (doc["msg_timeout"], doc["sample_rate"]) == (5000, 10)
    assert (doc["output_buffer_size"], doc["output_buffer_timeout"]) == (1, 0)
    conn.assert_silent()  # no upgrade OK frame follows
    assert conn.pub("no_upgrade", b"x") == b"OK"
    conn.close()


def test_identify_response_follows_options(make_nsqd):
    nsqd = make_nsqd(max_rdy_count=7, max_deflate_level=3, topology_zone="z")
    with Conn(nsqd.tcp_address) as c:
        c.cmd(b"IDENTIFY", b'{"feature_negotiation":true}')
        doc = json.loads(c.read_response())
        assert (doc["max_rdy_count"], doc["deflate_level"], doc["max_deflate_level"]) == (7, 3, 3)
        assert doc["topology_zone"] == "z"


def test_identify_keys_are_case_insensitive_on_the_wire(conn):
    conn.cmd(b"IDENTIFY", b'{"HEARTBEAT_INTERVAL": 1000}')
    assert conn.read_response() == b"OK"
    start = time.monotonic()
    assert conn.read_frame(skip_heartbeats=False) == (0, b"_heartbeat_")
    assert time.monotonic() - start < 2.0  # the default would be 30 s


def test_identify_null_body_is_accepted(conn):
    conn.cmd(b"IDENTIFY", b"null")
    assert conn.read_response() == b"OK"


@pytest.mark.parametrize(
    "body_size, text",
    [
        (0, "E_BAD_BODY IDENTIFY invalid body size 0"),
        (-1, "E_BAD_BODY IDENTIFY invalid body size -1"),
        (-2147483648, "E_BAD_BODY IDENTIFY invalid body size -2147483648"),
        (101, "E_BAD_BODY IDENTIFY body too big 101 > 100"),
        (2147483647, "E_BAD_BODY IDENTIFY body too big 2147483647 > 100"),
    ],
)
def test_identify_body_size_errors(make_nsqd, body_size, text):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        c.send(b"IDENTIFY\n" + size(body_size))
        fatal(c, text)


def test_identify_body_size_0x80000000_is_negative(conn):
    conn.send(b"IDENTIFY\n" + usize(0x80000000))
    fatal(conn, "E_BAD_BODY IDENTIFY invalid body size -2147483648")


def test_identify_default_max_body_size(conn):
    conn.send(b"IDENTIFY\n" + size(5242881))
    fatal(conn, "E_BAD_BODY IDENTIFY body too big 5242881 > 5242880")


def test_identify_body_size_equal_to_max_is_allowed(make_nsqd):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        body = b'{"client_id":"x"}'.ljust(100)
        c.cmd(b"IDENTIFY", body)
        assert c.read_response() == b"OK"


def test_identify_failed_to_read_body_size(conn):
    conn.send(b"IDENTIFY\n\x00\x00")
    half_close(conn)
    fatal(conn, "E_BAD_BODY IDENTIFY failed to read body size")


def test_identify_failed_to_read_body(conn):
    conn.send(b"IDENTIFY\n" + size(10) + b"{}   ")
    half_close(conn)
    fatal(conn, "E_BAD_BODY IDENTIFY failed to read body")


@pytest.mark.parametrize(
    "body",
    [b"[1]", b"{", b"not json", b'{"heartbeat_interval": 1000.0}', b'{"heartbeat_interval": "1000"}', b'{"a": NaN}'],
)
def test_identify_failed_to_decode_json_body(conn, body):
    conn.cmd(b"IDENTIFY", body)
    fatal(conn, "E_BAD_BODY IDENTIFY failed to decode JSON body")


@pytest.mark.parametrize(
    "fields, text",
    [
        ({"heartbeat_interval": 999}, "E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid"),
        ({"heartbeat_interval": 60001}, "E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid"),
        ({"output_buffer_timeout": 24}, "E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid"),
        ({"output_buffer_timeout": 30001}, "E_BAD_BODY IDENTIFY output buffer timeout (30001) is invalid"),
        ({"output_buffer_size": 63}, "E_BAD_BODY IDENTIFY output buffer size (63) is invalid"),
        ({"output_buffer_size": 65537}, "E_BAD_BODY IDENTIFY output buffer size (65537) is invalid"),
        ({"sample_rate": 100}, "E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
        ({"sample_rate": -1}, "E_BAD_BODY IDENTIFY sample rate (-1) is invalid"),
        ({"msg_timeout": -1}, "E_BAD_BODY IDENTIFY msg timeout (-1) is invalid"),
        ({"msg_timeout": 900001}, "E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
        (
            {"msg_timeout": 1, "sample_rate": 100, "output_buffer_size": 1, "output_buffer_timeout": 1, "heartbeat_interval": 1},
            "E_BAD_BODY IDENTIFY heartbeat interval (1) is invalid",
        ),
    ],
)
def test_identify_field_validation(conn, fields, text):
    conn.cmd(b"IDENTIFY", json.dumps(fields).encode())
    fatal(conn, text)


# -- §7.3 AUTH (no auth server configured) --------------------------------


def test_auth_with_a_param(conn):
    conn.cmd(b"AUTH x")
    fatal(conn, "E_INVALID AUTH invalid number of parameters")


def test_auth_with_a_trailing_space(conn):
    conn.cmd(b"AUTH ", b"secret")
    fatal(conn, "E_INVALID AUTH invalid number of parameters")


def test_auth_disabled_after_reading_the_body(conn):
    conn.cmd(b"AUTH", b"secret")
    fatal(conn, "E_AUTH_DISABLED AUTH disabled")


@pytest.mark.parametrize(
    "body_size, text",
    [
        (0, "E_BAD_BODY AUTH invalid body size 0"),
        (-5, "E_BAD_BODY AUTH invalid body size -5"),
        (101, "E_BAD_BODY AUTH body too big 101 > 100"),
    ],
)
def test_auth_body_size_errors(make_nsqd, body_size, text):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        c.send(b"AUTH\n" + size(body_size))
        fatal(c, text)


def test_auth_body_size_equal_to_max(make_nsqd):
    nsqd = make_nsqd(max_body_size=100)
    with Conn(nsqd.tcp_address) as c:
        c.cmd(b"AUTH", b"s" * 100)
        fatal(c, "E_AUTH_DISABLED AUTH disabled")


def test_auth_failed_to_read_body_size(conn):
    conn.send(b"AUTH\n\x00")
    half_close(conn)
    fatal(conn, "E_BAD_BODY AUTH failed to read body size")


def test_auth_failed_to_read_body(conn):
    conn.send(b"AUTH\n" + size(6) + b"sec")
    half_close(conn)
    fatal(conn, "E_BAD_BODY AUTH failed to read body")
