"""Pure tests of nsqd_threaded.wire.protocol_v2's IDENTIFY: decoding, negotiation, the response, durations."""

import json

import pytest

from nsqd_threaded.internal import gocompat
from nsqd_threaded.settings.options import Options
from nsqd_threaded.wire import protocol_v2

from support.v2 import protocol_error

# -- IDENTIFY decoding -----------------------------------------------------

DECODE_ERROR = "E_BAD_BODY IDENTIFY failed to decode JSON body"


def decode(doc):
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return protocol_v2.decode_identify(body)


def decode_error(body):
    return protocol_error(protocol_v2.decode_identify, body)


def test_decode_identify_all_fields():
    doc = {
        "client_id": "c",
        "hostname": "h",
        "user_agent": "ua",
        "topology_region": "r",
        "topology_zone": "z",
        "heartbeat_interval": 1000,
        "output_buffer_size": 64,
        "output_buffer_timeout": 25,
        "sample_rate": 5,
        "msg_timeout": 1000,
        "deflate_level": 3,
        "feature_negotiation": True,
        "tls_v1": False,
        "deflate": True,
        "snappy": False,
    }
    assert decode(doc) == doc


def test_decode_identify_keys_are_case_insensitive():
    assert decode({"HEARTBEAT_INTERVAL": 1000}) == {"heartbeat_interval": 1000}
    assert decode({"Feature_Negotiation": True, "Client_ID": "x"}) == {"feature_negotiation": True, "client_id": "x"}


def test_decode_identify_key_folding_follows_go():
    # Go's case folding maps U+017F (long s) to "s".
    assert decode(b'{"\xc5\xbfnappy": true}') == {"snappy": True}


def test_decode_identify_null_leaves_default():
    assert decode({"heartbeat_interval": None, "client_id": None, "snappy": None}) == {}


def test_decode_identify_ignores_unknown_keys():
    assert decode({"short_id": "s", "long_id": "l", "foo": [1, {"a": None}], "bar": 1.5}) == {}
    assert decode({}) == {}


def test_decode_identify_last_duplicate_wins_but_null_keeps_earlier():
    assert decode(b'{"heartbeat_interval": 1000, "HEARTBEAT_INTERVAL": 2000}') == {"heartbeat_interval": 2000}
    assert decode(b'{"heartbeat_interval": 2000, "heartbeat_interval": null}') == {"heartbeat_interval": 2000}


def test_decode_identify_null_document_is_no_op():
    # json.Unmarshal of `null` into a struct changes nothing and is not an error.
    assert decode(b"null") == {}
    assert decode(b" null ") == {}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b" ",
        b"{",
        b"{}}",
        b"{} x",
        b"[1]",
        b"[]",
        b"1",
        b'"x"',
        b"true",
        b"{'a': 1}",
        b'{"a": NaN}',  # Python's json would take these; Go's does not
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'{"heartbeat_interval": 1000.0}',
        b'{"heartbeat_interval": 1e3}',
        b'{"heartbeat_interval": "1000"}',
        b'{"heartbeat_interval": true}',
        b'{"heartbeat_interval": [1000]}',
        b'{"msg_timeout": -0.0}',
        b'{"sample_rate": 2147483648}',  # int32 overflow
        b'{"sample_rate": -2147483649}',
        b'{"heartbeat_interval": 9223372036854775808}',  # int64 overflow
        b'{"feature_negotiation": 1}',
        b'{"feature_negotiation": "true"}',
        b'{"client_id": 1}',
        b'{"client_id": {}}',
        b'{"sample_rate": "x", "sample_rate": 1}',  # a type error is kept even if a later key is fine
        b'{"a": "\x01"}',  # control character in a string
        b'\xef\xbb\xbf{}',  # BOM
    ],
)
def test_decode_identify_errors(body):
    assert decode_error(body) == DECODE_ERROR


def test_decode_identify_deep_nesting_is_a_decode_error_not_a_crash():
    body = b'{"x": ' + b"[" * 20000 + b"]" * 20000 + b"}"  # deeper than Go's 10000 limit
    assert decode_error(body) == DECODE_ERROR


def test_decode_identify_integer_bounds():
    assert decode({"sample_rate": 2147483647}) == {"sample_rate": 2147483647}
    assert decode({"sample_rate": -2147483648}) == {"sample_rate": -2147483648}
    assert decode({"heartbeat_interval": -(2**63)}) == {"heartbeat_interval": -(2**63)}
    assert decode({"msg_timeout": 2**63 - 1}) == {"msg_timeout": 2**63 - 1}
    assert decode(b'{"msg_timeout": -0}') == {"msg_timeout": 0}


def test_decode_identify_strings_like_go():
    # Invalid UTF-8 and lone surrogate escapes become U+FFFD (per byte), as Go decodes them.
    assert decode(b'{"client_id": "a\xffb\xe2\x82"}') == {"client_id": "a\ufffdb\ufffd\ufffd"}
    assert decode(b'{"client_id": "\\ud800x"}') == {"client_id": "\ufffdx"}
    assert decode(b'{"client_id": "\\ud83d\\ude00"}') == {"client_id": "\U0001f600"}
    assert decode(b'{"hostname": "h\\u00e9"}') == {"hostname": "h\u00e9"}


def test_decode_identify_accepts_bytearray_and_memoryview():
    assert protocol_v2.decode_identify(bytearray(b'{"snappy": false}')) == {"snappy": False}
    assert protocol_v2.decode_identify(memoryview(b'{"snappy": false}')) == {"snappy": False}


# -- IDENTIFY negotiation --------------------------------------------------

DEFAULTS = {
    "heartbeat_interval_ms": 30000,
    "output_buffer_timeout_ms": 250,
    "output_buffer_size": 16384,
    "sample_rate": 0,
    "msg_timeout_ms": 60000,
}


def negotiate(opts=None, **fields):
    return protocol_v2.negotiate_identify(fields, opts or Options(node_id=1))


def negotiate_error(opts=None, **fields):
    return protocol_error(protocol_v2.negotiate_identify, fields, opts or Options(node_id=1))


def test_negotiate_defaults():
    assert negotiate() == DEFAULTS
    assert negotiate(heartbeat_interval=0, output_buffer_timeout=0, output_buffer_size=0, msg_timeout=0) == DEFAULTS


def test_negotiate_default_heartbeat_is_half_the_client_timeout():
    s = protocol_v2.negotiate_identify({}, Options(node_id=1), client_timeout_ms=10000)
    assert s["heartbeat_interval_ms"] == 5000


@pytest.mark.parametrize(
    "value, effective",
    [(-1, 0), (0, 30000), (1000, 1000), (1001, 1001), (60000, 60000)],
)
def test_negotiate_heartbeat_ok(value, effective):
    assert negotiate(heartbeat_interval=value)["heartbeat_interval_ms"] == effective


@pytest.mark.parametrize("value", [-2, 1, 999, 60001, -(2**63), 2**63 - 1])
def test_negotiate_heartbeat_invalid(value):
    assert negotiate_error(heartbeat_interval=value) == "E_BAD_BODY IDENTIFY heartbeat interval (%d) is invalid" % value


@pytest.mark.parametrize("value, effective", [(-1, 0), (0, 250), (25, 25), (30000, 30000)])
def test_negotiate_output_buffer_timeout_ok(value, effective):
    assert negotiate(output_buffer_timeout=value)["output_buffer_timeout_ms"] == effective


@pytest.mark.parametrize("value", [-2, 1, 24, 30001])
def test_negotiate_output_buffer_timeout_invalid(value):
    assert negotiate_error(output_buffer_timeout=value) == "E_BAD_BODY IDENTIFY output buffer timeout (%d) is invalid" % value


@pytest.mark.parametrize("value, effective", [(0, 16384), (64, 64), (65536, 65536)])
def test_negotiate_output_buffer_size_ok(value, effective):
    s = negotiate(output_buffer_size=value)
    assert s["output_buffer_size"] == effective
    assert s["output_buffer_timeout_ms"] == 250


def test_negotiate_output_buffer_size_minus_one_forces_unbuffered():
    s = negotiate(output_buffer_size=-1, output_buffer_timeout=100)
    assert (s["output_buffer_size"], s["output_buffer_timeout_ms"]) == (1, 0)


@pytest.mark.parametrize("value", [-2, 1, 63, 65537])
def test_negotiate_output_buffer_size_invalid(value):
    assert negotiate_error(output_buffer_size=value) == "E_BAD_BODY IDENTIFY output buffer size (%d) is invalid" % value


@pytest.mark.parametrize("value", [0, 1, 99])
def test_negotiate_sample_rate_ok(value):
    assert negotiate(sample_rate=value)["sample_rate"] == value


@pytest.mark.parametrize("value", [-1, 100, 2147483647, -2147483648])
def test_negotiate_sample_rate_invalid(value):
    assert negotiate_error(sample_rate=value) == "E_BAD_BODY IDENTIFY sample rate (%d) is invalid" % value


@pytest.mark.parametrize("value, effective", [(0, 60000), (1000, 1000), (900000, 900000)])
def test_negotiate_msg_timeout_ok(value, effective):
    assert negotiate(msg_timeout=value)["msg_timeout_ms"] == effective


@pytest.mark.parametrize("value", [-1, 1, 999, 900001])
def test_negotiate_msg_timeout_invalid(value):
    assert negotiate_error(msg_timeout=value) == "E_BAD_BODY IDENTIFY msg timeout (%d) is invalid" % value


def test_negotiate_validation_order():
    bad = dict(heartbeat_interval=1, output_buffer_timeout=1, output_buffer_size=1, sample_rate=100, msg_timeout=1)
    expected = [
        ("heartbeat_interval", "heartbeat interval (1)"),
        ("output_buffer_timeout", "output buffer timeout (1)"),
        ("output_buffer_size", "output buffer size (1)"),
        ("sample_rate", "sample rate (100)"),
        ("msg_timeout", "msg timeout (1)"),
    ]
    for key, what in expected:
        assert negotiate_error(**bad) == "E_BAD_BODY IDENTIFY %s is invalid" % what
        del bad[key]
    assert negotiate(**bad) == DEFAULTS


def test_negotiate_output_buffer_timeout_is_checked_before_size_minus_one():
    assert (
        negotiate_error(output_buffer_size=-1, output_buffer_timeout=5)
        == "E_BAD_BODY IDENTIFY output buffer timeout (5) is invalid"
    )


def test_negotiate_bounds_follow_the_options():
    opts = Options(
        node_id=1,
        max_heartbeat_interval=2.5,
        min_output_buffer_timeout=0.01,
        max_output_buffer_timeout=0.5,
        output_buffer_timeout=0.1,
        max_output_buffer_size=128,
        msg_timeout=1.5,
        max_msg_timeout=2.0,
    )
    assert negotiate(opts) == {
        "heartbeat_interval_ms": 30000,  # the default is client_timeout / 2, not bounded by the max
        "output_buffer_timeout_ms": 100,
        "output_buffer_size": 16384,
        "sample_rate": 0,
        "msg_timeout_ms": 1500,
    }
    assert negotiate(opts, heartbeat_interval=2500)["heartbeat_interval_ms"] == 2500
    assert negotiate_error(opts, heartbeat_interval=2501) == "E_BAD_BODY IDENTIFY heartbeat interval (2501) is invalid"
    assert negotiate(opts, output_buffer_timeout=10)["output_buffer_timeout_ms"] == 10
    assert negotiate_error(opts, output_buffer_timeout=9) == "E_BAD_BODY IDENTIFY output buffer timeout (9) is invalid"
    assert negotiate(opts, output_buffer_timeout=500)["output_buffer_timeout_ms"] == 500
    assert negotiate_error(opts, output_buffer_timeout=501) == "E_BAD_BODY IDENTIFY output buffer timeout (501) is invalid"
    assert negotiate(opts, output_buffer_size=128)["output_buffer_size"] == 128
    assert negotiate_error(opts, output_buffer_size=129) == "E_BAD_BODY IDENTIFY output buffer size (129) is invalid"
    assert negotiate(opts, msg_timeout=2000)["msg_timeout_ms"] == 2000
    assert negotiate_error(opts, msg_timeout=2001) == "E_BAD_BODY IDENTIFY msg timeout (2001) is invalid"


def test_negotiate_millisecond_bounds_are_exact():
    # Durations are float seconds here but integer nanoseconds in Go:
    # 1.001 s must allow exactly 1001 ms (1.001 * 1000 == 1000.9999999999999).
    opts = Options(node_id=1, msg_timeout=1.0, max_msg_timeout=1.001, max_heartbeat_interval=2.002)
    assert negotiate(opts, msg_timeout=1001)["msg_timeout_ms"] == 1001
    assert negotiate_error(opts, msg_timeout=1002) == "E_BAD_BODY IDENTIFY msg timeout (1002) is invalid"
    assert negotiate(opts, heartbeat_interval=2002)["heartbeat_interval_ms"] == 2002
    assert negotiate(Options(node_id=1, msg_timeout=1.001), msg_timeout=0)["msg_timeout_ms"] == 1001
    settings = negotiate(opts)
    assert json.loads(protocol_v2.identify_response(settings, opts))["max_msg_timeout"] == 1001


# -- IDENTIFY response -----------------------------------------------------

SPEC_RESPONSE = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
    b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
    b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,"output_buffer_timeout":250,'
    b'"topology_region":"","topology_zone":""}'
)


def test_identify_response_matches_the_verified_example():
    opts = Options(node_id=1)
    assert protocol_v2.identify_response(protocol_v2.negotiate_identify({}, opts), opts) == SPEC_RESPONSE


def test_identify_response_reflects_client_settings_and_options():
    opts = Options(node_id=1, max_rdy_count=5, max_msg_timeout=120.0, topology_region="r1", topology_zone="z1")
    settings = protocol_v2.negotiate_identify(
        {"output_buffer_size": -1, "sample_rate": 7, "msg_timeout": 2000}, opts
    )
    doc = json.loads(protocol_v2.identify_response(settings, opts))
    assert list(doc) == list(json.loads(SPEC_RESPONSE))
    assert doc["max_rdy_count"] == 5
    assert doc["max_msg_timeout"] == 120000
    assert doc["msg_timeout"] == 2000
    assert doc["sample_rate"] == 7
    assert doc["output_buffer_size"] == 1
    assert doc["output_buffer_timeout"] == 0
    assert (doc["topology_region"], doc["topology_zone"]) == ("r1", "z1")


@pytest.mark.parametrize(
    "deflate, requested, max_level, level",
    [
        (False, 0, 6, 6),
        (False, 3, 6, 6),  # a requested level only counts when deflate was negotiated
        (False, 9, 9, 6),
        (False, -5, 6, 6),
        (False, 0, 4, 4),  # clamped even when deflate is false
        (True, 0, 6, 6),
        (True, -1, 6, 6),
        (True, 3, 6, 3),
        (True, 9, 6, 6),
        (True, 9, 9, 9),
    ],
)
def test_deflate_level_negotiation(deflate, requested, max_level, level):
    assert protocol_v2.deflate_level(deflate, requested, max_level) == level


def test_identify_response_deflate_level_field():
    opts = Options(node_id=1, max_deflate_level=4)
    settings = protocol_v2.negotiate_identify({}, opts)
    doc = json.loads(protocol_v2.identify_response(settings, opts, deflate_level=4))
    assert (doc["deflate_level"], doc["max_deflate_level"]) == (4, 4)


def test_identify_response_strings_are_encoded_like_go():
    # encoding/json escapes <, >, & (HTML-safe) and U+2028/9, writes other
    # non-ASCII as UTF-8, and has no \b or \f short forms (Go 1.19).
    opts = Options(node_id=1, topology_region="a<b>&c\u2028\u2029", topology_zone="\u00e9\x08\x0c\x01\x7f\"\\/")
    out = protocol_v2.identify_response(protocol_v2.negotiate_identify({}, opts), opts)
    assert out.endswith(
        b'"topology_region":"a\\u003cb\\u003e\\u0026c\\u2028\\u2029",'
        b'"topology_zone":"\xc3\xa9\\u0008\\u000c\\u0001\x7f\\"\\\\/"}'
    )
    assert json.loads(out)["topology_zone"] == "\u00e9\x08\x0c\x01\x7f\"\\/"


# -- durations and Go JSON strings -----------------------------------------


@pytest.mark.parametrize(
    "seconds, ns, ms",
    [
        (0.0, 0, 0),
        (0.025, 25000000, 25),
        (0.25, 250000000, 250),
        (1.001, 1001000000, 1001),
        (2.002, 2002000000, 2002),
        (60.0, 60000000000, 60000),
        (900.0, 900000000000, 900000),
        (3600.0, 3600000000000, 3600000),
        (0.0015, 1500000, 1),  # Go's d / time.Millisecond truncates
        (0.000999, 999000, 0),
    ],
)
def test_duration_conversions_are_exact(seconds, ns, ms):
    assert gocompat.ns(seconds) == ns
    assert gocompat.ms(seconds) == ms


@pytest.mark.parametrize(
    "value, encoded",
    [
        ("", '""'),
        ("1.3.0", '"1.3.0"'),
        ('a"b\\c/d', '"a\\"b\\\\c/d"'),
        ("\n\r\t", '"\\n\\r\\t"'),
        ("\x00\x08\x0c\x1f", '"\\u0000\\u0008\\u000c\\u001f"'),
        ("<>&", '"\\u003c\\u003e\\u0026"'),
        ("\u2028\u2029", '"\\u2028\\u2029"'),
        ("\x7f\u00e9\U0001f600", '"\x7f\u00e9\U0001f600"'),
        ("\udcff", '"\\ufffd"'),
    ],
)
def test_go_json_string(value, encoded):
    assert gocompat.go_json_string(value) == encoded


@pytest.mark.timeout(10)
def test_fin_run_takes_the_plain_fin_lines_buffered_at_the_position():
    a, b, c = b"0" * 16, b"1" * 16, b"2" * 16
    buf = bytearray(b"xxFIN " + a + b"\nFIN " + b + b"\nFIN " + c[:8])
    assert protocol_v2.fin_run(buf, 2) == ([a, b], 2 + 42)  # the partial third line waits
    assert protocol_v2.fin_run(buf, 0) == ([], 0)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "line",
    [
        b"FIN 0123456789abcde\r\n",  # parse_line drops a trailing \r: a 15-byte id
        b"FIN 0123456 89abcdef\n",  # two params
        b"FIN  123456789abcdef\n",
        b"RDY 100\n",
        b"FIN 0123456789abcdef0\n",  # 17 bytes
    ],
)
def test_fin_run_stops_at_a_line_that_is_not_a_plain_fin(line):
    good = b"FIN " + b"f" * 16 + b"\n"
    assert protocol_v2.fin_run(bytearray(good + line + good), 0) == ([b"f" * 16], 21)


def test_fin_run_agrees_with_the_line_by_line_rule_on_random_buffers():
    """The column check (whole runs) and the regex (mixed runs) give what a line-by-line reading would."""
    import random
    import re

    rule = re.compile(rb"FIN [^ \n]{15}[^ \n\r]\n")
    rng = random.Random(7)
    pieces = [b"FIN " + b"0123456789abcdef" + b"\n", b"FIN 0123456789abcde\r\n", b"FIN 0123 56789abcdef\n",
              b"NOP\n", b"FIN 0123456789ab\ncdef\n", b"REQ 0123456789abcdef 0\n", b"FIN 0123456789abc\rdef\n",
              b"FIN FINFINFIN\tFIN\x00FI\n"]  # (an ID that looks like the lines around it)
    for _ in range(3000):
        buf = bytearray(b"".join(rng.choice(pieces[:1] * 6 + pieces[-1:] * 3 + pieces[1:]) for _ in range(rng.randrange(0, 12))))
        buf += b"FIN 0123"[: rng.randrange(0, 9)]  # maybe a partial line
        pos = rng.randrange(0, 3)
        ids, end = [], pos
        while rule.match(buf, end):
            ids.append(bytes(buf[end + 4 : end + 20]))
            end += 21
        assert protocol_v2.fin_run(buf, pos) == (ids, end), bytes(buf)
