"""Go's text formats: durations, strconv flag values and go_json (quoting is in test_identify_unit)."""

import json
import random
import sys

import pytest

from nsqd_threaded.internal import gocompat
from nsqd_threaded.internal.gocompat import (
    format_duration,
    format_duration_ns,
    go_float,
    go_json,
    go_json_slow,
    parse_duration,
    parse_duration_ns,
    parse_go_bool,
    parse_go_int,
)
from nsqd_threaded.settings.options import parse_log_level, parse_tls_required

# -- durations ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text, ns",
    [
        ("0", 0),
        ("-0", 0),
        ("+0", 0),
        ("0s", 0),
        ("5s", 5 * 10**9),
        ("+5s", 5 * 10**9),
        ("-5s", -5 * 10**9),
        ("1.5s", 1500 * 10**6),
        (".5s", 500 * 10**6),
        ("1.s", 10**9),
        ("1h30m", 5400 * 10**9),
        ("1h30m15.5s", 5415500 * 10**6),
        ("2m3s", 123 * 10**9),
        ("250ms", 250 * 10**6),
        ("100us", 100000),
        ("100\u00b5s", 100000),  # micro sign
        ("100\u03bcs", 100000),  # Greek mu
        ("7ns", 7),
        ("1.0000000005s", 10**9),  # below a nanosecond is truncated
        ("0.1ms", 100000),
        ("1h1h", 7200 * 10**9),
        ("9223372036854775807ns", (1 << 63) - 1),
        ("-9223372036854775808ns", -(1 << 63)),
    ],
)
def test_parse_duration(text, ns):
    assert parse_duration_ns(text) == ns
    assert parse_duration(text) == ns / 1e9


@pytest.mark.parametrize(
    "text, message",
    [
        ("", 'time: invalid duration ""'),
        ("1", 'time: missing unit in duration "1"'),
        ("1.", 'time: missing unit in duration "1."'),
        ("s", 'time: invalid duration "s"'),
        (".s", 'time: invalid duration ".s"'),
        ("-", 'time: invalid duration "-"'),
        ("1x", 'time: unknown unit "x" in duration "1x"'),
        ("1sec", 'time: unknown unit "sec" in duration "1sec"'),
        ("1S", 'time: unknown unit "S" in duration "1S"'),
        ("1h 30m", 'time: unknown unit "h " in duration "1h 30m"'),
        (" 1s", 'time: invalid duration " 1s"'),
        ("1e3s", 'time: unknown unit "e" in duration "1e3s"'),
        ("1.s.", 'time: invalid duration "1.s."'),
        ("--1s", 'time: invalid duration "--1s"'),
        ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
        ("3000000h", 'time: invalid duration "3000000h"'),
    ],
)
def test_parse_duration_rejects(text, message):
    with pytest.raises(ValueError) as e:
        parse_duration(text)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (0.0, "0s"),
        (60, "1m0s"),
        (60.0, "1m0s"),
        (900, "15m0s"),
        (3600, "1h0m0s"),
        (5400.5, "1h30m0.5s"),
        (2, "2s"),
        (1.5, "1.5s"),
        (0.25, "250ms"),
        (0.025, "25ms"),
        (0.0015, "1.5ms"),
        (0.0001, "100\u00b5s"),
        (1e-9, "1ns"),
        (-1.5, "-1.5s"),
        (-0.25, "-250ms"),
        (90061, "25h1m1s"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_duration_extremes():
    assert format_duration_ns((1 << 63) - 1) == "2562047h47m16.854775807s"
    assert format_duration_ns(-(1 << 63)) == "-2562047h47m16.854775808s"
    assert format_duration_ns(1001) == "1.001\u00b5s"


@pytest.mark.parametrize("text", ["1h30m0.5s", "250ms", "1m0s", "0s", "-2m0s", "1.5\u00b5s", "7ns"])
def test_format_parse_round_trip(text):
    assert format_duration_ns(parse_duration_ns(text)) == text


# -- Go flag values -----------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("0", 0),
        ("42", 42),
        ("-42", -42),
        ("+42", 42),
        ("0x1f", 31),
        ("0X1F", 31),
        ("010", 8),  # leading zero is octal in Go
        ("0o10", 8),
        ("0b101", 5),
        ("1_000", 1000),
        ("0_7", 7),
        ("9223372036854775807", (1 << 63) - 1),
        ("-9223372036854775808", -(1 << 63)),
    ],
)
def test_parse_go_int(text, value):
    assert parse_go_int(text) == value


@pytest.mark.parametrize("text", ["", "-", "abc", "1.5", "08", " 1", "1 ", "1__0", "10_", "\u0661", "1e3"])
def test_parse_go_int_rejects(text):
    with pytest.raises(ValueError, match="invalid integer"):
        parse_go_int(text)


def test_parse_go_int_range():
    with pytest.raises(ValueError, match="out of range"):
        parse_go_int("9223372036854775808")


def test_parse_go_bool():
    for text in ("1", "t", "T", "TRUE", "true", "True"):
        assert parse_go_bool(text) is True
    for text in ("0", "f", "F", "FALSE", "false", "False"):
        assert parse_go_bool(text) is False
    for text in ("", "yes", "tRUE", "2"):
        with pytest.raises(ValueError, match="invalid boolean"):
            parse_go_bool(text)


def test_parse_log_level_and_tls_required():
    assert parse_log_level("DEBUG") == "debug"
    with pytest.raises(ValueError, match="invalid log level"):
        parse_log_level("loud")
    assert parse_tls_required("tcp-https") == 1  # nsqd's TLSRequired numbers
    assert parse_tls_required("T") == 2
    assert parse_tls_required("0") == 0
    with pytest.raises(ValueError):
        parse_tls_required("maybe")




def test_go_json_is_compact_ordered_and_go_formatted():
    doc = {"b": 1, "a": [0.5, 1e21, 0.0, None, True], "<k>": {"s": "\u2028&\udcff"}}
    assert go_json(doc) == '{"b":1,"a":[0.5,1e+21,0,null,true],"\\u003ck\\u003e":{"s":"\\u2028\\u0026\\ufffd"}}'


def test_go_json_of_a_flat_object_escapes_as_go():
    """Flat objects (a /stats client) take the C encoder; its output is rewritten to Go's escapes."""
    doc = {"a<b>&": '\b\f\n\\b\\f\u2028\u2029\ud800\x01é"', "n": -3, "t": True, "z": None}
    expected = (
        '{"a\\u003cb\\u003e\\u0026":"\\u0008\\u000c\\n\\\\b\\\\f\\u2028\\u2029\\ufffd\\u0001é\\"",'
        '"n":-3,"t":true,"z":null}'
    )
    assert go_json(doc) == expected
    assert go_json({"x": [doc]}) == '{"x":[' + expected + "]}"


# -- go_json: the stdlib encoder's fast path equals the value-by-value slow path ----------

# Floats at every magnitude and on every boundary of repr's and Go's formats.
FLOATS = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 5.0, 0.99, 0.1 + 0.2, 1e-7, -1e-7, 1e-6, 9.99e-7, 1.5e-6, 1e-5,
          -2.5e-5, 9.999999999999999e-05, 1e-4, 0.00012, 123456.789, 2.0**52 + 0.5, 2.0**53, 9007199254740993.0,
          1e15, 1e16, -1e16, 1.2345678901234567e17, 1e20, 9.99e20, 1e21, -1e21, 1.5e21, 1e22, 1.7976931348623157e308,
          5e-324, 1e-300, 2.2250738585072014e-308]
# Characters the two paths escape differently, JSON's own, and text that looks like a float token.
PIECES = ["\b", "\f", "\n", "\r", "\t", "\\", "\\b", "\\\\f", '"', "<", ">", "&", "\u2028", "\u2029",
          "\ud800", "\udfff", "\udc80", "\ud83d\ude00", "\x00", "\x1f", "\x7f", "é", "\u00e9", "\U0001f600",
          "a", "b", "f", "u0008", ":", ",", "[", "]", "}", "{", ".", "-", "e-", "e+", "0", "1", "5", "9",
          ":1.0,", "[-0.0]", ",1e-05}", ":1.5e+16]", ",2.5,", ":1e+21}", "[NaN]", "Infinity", "e-07"]


def _random_string(rng):
    return "".join(rng.choice(PIECES) for _ in range(rng.randrange(6)))


def _random_value(rng, depth):
    kind = rng.randrange(10 if depth < 5 else 7)
    if kind == 0:
        return _random_string(rng)
    if kind == 1:
        return rng.choice([0, -1, 7, 2**63 - 1, -(2**63), 10**30, rng.randrange(-10**6, 10**6)])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4):
        return rng.choice(FLOATS) if rng.random() < 0.7 else rng.uniform(-1e6, 1e6) * 10.0 ** rng.randrange(-12, 24)
    if kind in (5, 6):
        return float(rng.randrange(-10**6, 10**6))
    if kind == 7:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 8:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    return {_random_string(rng): _random_value(rng, depth + 1) for _ in range(rng.randrange(6))}


def test_go_json_fast_path_equals_slow_path_over_generated_documents():
    rng = random.Random(20261125)
    fast = 0
    for _ in range(3000):
        doc = {_random_string(rng): _random_value(rng, 0) for _ in range(rng.randrange(6))}
        assert go_json(doc) == go_json_slow(doc), doc
        fast += gocompat._fast_encode(doc) is not None
        assert gocompat._float_count_by_level(doc) == gocompat._float_count_by_value(doc)  # one per runtime
        listed = [_random_value(rng, 0) for _ in range(rng.randrange(4))]
        assert go_json(listed) == go_json_slow(listed), listed
    assert fast > 1000  # the rest hold float-like text in a string, or NaN


@pytest.mark.parametrize("f", FLOATS + [-f for f in FLOATS])
def test_go_json_writes_floats_as_go_float(f):
    assert go_json(f) == go_float(f)
    assert go_json([f]) == "[" + go_float(f) + "]"
    assert go_json({"v": f, "w": [f, {"x": f}]}) == '{"v":%s,"w":[%s,{"x":%s}]}' % ((go_float(f),) * 3)


def test_go_float_forms():
    """encoding/json's floatEncoder: 'f' format from 1e-6 to 1e21, else 'e' with a negative
    two-digit exponent's leading zero cleaned up (e-09 -> e-9); positive exponents keep their sign."""
    assert [go_float(f) for f in (0.0, -0.0, 5.0, 1e-5, 1e-7, -2.5e-9, 1e-10, 1e-100, 1e16, 1e21, 0.99)] == [
        "0", "0", "5", "0.00001", "1e-7", "-2.5e-9", "1e-10", "1e-100", "10000000000000000", "1e+21", "0.99"]


@pytest.mark.parametrize(
    "text",
    [":1.0,", "x:1.0]", "[-0.0]", ",1e-05}", "a,5e+16]", ",1.5e-07}", "1-2.5e-05]", ":-1.0}", ":7.0,"],
)
def test_go_json_strings_that_look_like_float_tokens(text):
    """Text in a string that the float rewrite would match: the count tells, the slow path writes it."""
    for doc in ({"s": text, "f": 1.0}, {"s": text, "f": 1e-05}, [text, 2.0, 1e16, [text]], {text: 0.5}):
        assert gocompat._fast_encode(doc) is None
        assert go_json(doc) == go_json_slow(doc)
        assert json.loads(go_json(doc))  # still valid JSON
    assert go_json({"s": text, "f": 2.0}) == '{"s":"%s","f":2}' % text


def test_go_json_of_a_stats_like_document_takes_the_fast_path():
    """Dotted strings (addresses, versions, host names) are not taken for floats."""
    client = {"remote_address": "127.0.0.1:4150", "user_agent": "pynsq/0.9.1", "hostname": "h1.example", "ts": 17}
    e2e = {"count": 3, "percentiles": [{"quantile": 0.99, "value": 1500.0}, {"quantile": 1.0, "value": -0.0}]}
    doc = {"version": "1.3.0", "topics": [{"channels": [{"clients": [client], "e2e_processing_latency": e2e}]}]}
    expected = (
        '{"version":"1.3.0","topics":[{"channels":[{"clients":[{"remote_address":"127.0.0.1:4150",'
        '"user_agent":"pynsq/0.9.1","hostname":"h1.example","ts":17}],"e2e_processing_latency":'
        '{"count":3,"percentiles":[{"quantile":0.99,"value":1500},{"quantile":1,"value":0}]}}]}]}'
    )
    assert gocompat._fast_encode(doc) == expected
    assert go_json_slow(doc) == expected


def test_go_json_escapes_strings_as_go_in_nested_documents():
    doc = {"a": [{"k\b": "\\b\b\f<>&\u2028\ud800é"}], "n": {"m": ["\x01", 1.0]}}
    assert go_json(doc) == (
        '{"a":[{"k\\u0008":"\\\\b\\u0008\\u000c\\u003c\\u003e\\u0026\\u2028\\ufffdé"}],'
        '"n":{"m":["\\u0001",1]}}'
    )


class _Int(int):
    def __str__(self):
        return "seven"


class _Float(float):
    def __repr__(self):
        return "2.5"


class _Dict(dict):
    pass


def test_go_json_takes_the_slow_path_for_what_the_encoder_would_write_differently():
    for make in (
        lambda: {"i": _Int(7)},
        lambda: {"f": [_Float(1.0)]},
        lambda: [_Dict(a=1.0)],
        lambda: {"s": {1.0}},
        lambda: {"g": (x for x in [1.0, "<"])},
        lambda: {"v": {"a": 1.0}.values()},
        lambda: {"n": float("nan"), "i": [float("inf"), -float("inf")]},
    ):
        assert go_json(make()) == go_json_slow(make())
    assert go_json({"g": (x for x in [1.0, "<"])}) == '{"g":[1,"\\u003c"]}'
    with pytest.raises(TypeError):
        go_json({"a": {1: "x"}})  # Go's maps here have string keys
    with pytest.raises(TypeError):
        go_json({"a": object()})


def test_go_json_of_a_cycle_raises_recursion_error_and_a_deep_document_fares_as_on_the_slow_path():
    cycle = {"a": []}
    cycle["a"].append(cycle)
    with pytest.raises(RecursionError):
        go_json(cycle)
    assert gocompat._float_count_by_level(cycle) is None
    assert gocompat._float_count_by_value(cycle) is None
    deep = [1.0]
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    try:
        expected = go_json_slow(deep)
    except RecursionError:  # CPython; PyPy's limit counts differently
        with pytest.raises(RecursionError):
            go_json(deep)
    else:
        assert go_json(deep) == expected


def test_go_json_writes_a_raw_message_as_it_is():
    # As Go's json.RawMessage: text written ahead goes in unquoted, the rest is encoded as ever.
    doc = {"a": [gocompat.RawMessage('{"x":1.5,"s":"<"}'), 2.0], "b": "<", "c": gocompat.RawMessage("null")}
    assert gocompat.go_json(doc) == '{"a":[{"x":1.5,"s":"<"},2],"b":"\\u003c","c":null}'
    assert gocompat.go_json(gocompat.RawMessage("[1]")) == "[1]"
