"""Go's text formats: durations and strconv flag values (quoting and JSON are in test_protocol_unit)."""

import pytest

from nsqd_threaded.internal.gocompat import (
    format_duration,
    format_duration_ns,
    go_json,
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
