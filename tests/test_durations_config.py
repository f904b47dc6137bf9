"""Go duration text, Go flag value syntax, the fallback TOML parser and config coercion."""

import sys

import pytest

from nsqd_threaded import config
from nsqd_threaded.config import ConfigError, SETTINGS, SUPPORTED, UNSUPPORTED, parse_toml
from nsqd_threaded.durations import format_duration, format_duration_ns, parse_duration, parse_duration_ns
from nsqd_threaded.options import Options

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
    assert config.parse_go_int(text) == value


@pytest.mark.parametrize("text", ["", "-", "abc", "1.5", "08", " 1", "1 ", "1__0", "10_", "\u0661", "1e3"])
def test_parse_go_int_rejects(text):
    with pytest.raises(ValueError, match="invalid integer"):
        config.parse_go_int(text)


def test_parse_go_int_range():
    with pytest.raises(ValueError, match="out of range"):
        config.parse_go_int("9223372036854775808")


def test_parse_go_bool():
    for text in ("1", "t", "T", "TRUE", "true", "True"):
        assert config.parse_go_bool(text) is True
    for text in ("0", "f", "F", "FALSE", "false", "False"):
        assert config.parse_go_bool(text) is False
    for text in ("", "yes", "tRUE", "2"):
        with pytest.raises(ValueError, match="invalid boolean"):
            config.parse_go_bool(text)


def test_parse_log_level_and_tls_required():
    assert config.parse_log_level("DEBUG") == "debug"
    with pytest.raises(ValueError, match="invalid log level"):
        config.parse_log_level("loud")
    assert config.parse_tls_required("tcp-https") == "tcp-https"
    assert config.parse_tls_required("T") == "true"
    assert config.parse_tls_required("0") == "false"
    with pytest.raises(ValueError):
        config.parse_tls_required("maybe")


# -- the fallback TOML parser ---------------------------------------------------

# nsqd's contrib/nsqd.cfg.example, abridged: the shapes real config files have.
EXAMPLE = """\
## log verbosity level: debug, info, warn, error, or fatal
log_level = "info"

## unique identifier (int) for this worker (will default to a hash of hostname)
# id = 5150

tcp_address = "0.0.0.0:4150"   # trailing comment
http_address = '0.0.0.0:4151'

nsqlookupd_tcp_addresses = [
    "127.0.0.1:4160",  # first
    "127.0.0.1:4162",
]

mem_queue_size = 10_000
max_msg_size = 1024768
sync_timeout = "2s"
msg_timeout = 60000
statsd_mem_stats = true
deflate = false
e2e_processing_latency_percentiles = [
    1.0,
    0.99,
    0.95
]
max_rdy_count = +2500
weights = [1, -2, 0x10, 0o17, 0b11, 1e3, -1.5e-2, 6.02E23]
nested = [[1, 2], ["a"], []]
"quoted key" = "tab\\tquote\\" backslash\\\\ \\u00b5 \\U0001F600"
literal = 'C:\\path\\no\\escapes'
empty = ""
dotted.key = 1

[section]
inner = "x"
"""

EXAMPLE_EXPECTED = {
    "log_level": "info",
    "tcp_address": "0.0.0.0:4150",
    "http_address": "0.0.0.0:4151",
    "nsqlookupd_tcp_addresses": ["127.0.0.1:4160", "127.0.0.1:4162"],
    "mem_queue_size": 10000,
    "max_msg_size": 1024768,
    "sync_timeout": "2s",
    "msg_timeout": 60000,
    "statsd_mem_stats": True,
    "deflate": False,
    "e2e_processing_latency_percentiles": [1.0, 0.99, 0.95],
    "max_rdy_count": 2500,
    "weights": [1, -2, 16, 15, 3, 1000.0, -0.015, 6.02e23],
    "nested": [[1, 2], ["a"], []],
    "quoted key": 'tab\tquote" backslash\\ \u00b5 \U0001F600',
    "literal": "C:\\path\\no\\escapes",
    "empty": "",
    "dotted": {"key": 1},
    "section": {"inner": "x"},
}


def test_parse_toml_example():
    doc = parse_toml(EXAMPLE)
    assert doc == EXAMPLE_EXPECTED
    assert isinstance(doc["weights"][0], int) and isinstance(doc["weights"][5], float)
    assert doc["statsd_mem_stats"] is True


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is 3.11+")
def test_parse_toml_agrees_with_tomllib():
    import tomllib

    assert parse_toml(EXAMPLE) == tomllib.loads(EXAMPLE)
    assert config.loads(EXAMPLE) == EXAMPLE_EXPECTED


def test_parse_toml_small_forms():
    assert parse_toml("") == {}
    assert parse_toml("# only a comment") == {}
    assert parse_toml("a=1") == {"a": 1}
    assert parse_toml("a = 1\r\nb = 2\r\n") == {"a": 1, "b": 2}
    assert parse_toml("a = [ ]") == {"a": []}
    assert parse_toml("a = [\n# comment\n]") == {"a": []}
    assert parse_toml("a = inf\nb = -inf") == {"a": float("inf"), "b": float("-inf")}
    assert parse_toml("a = 0\nb = -0.0") == {"a": 0, "b": 0.0}
    assert parse_toml("[a.b]\nc = 1\n[a]\nd = 2") == {"a": {"b": {"c": 1}, "d": 2}}


@pytest.mark.parametrize(
    "text, message",
    [
        ('a = """x"""', "line 1: multi-line strings are not supported"),
        ("a = '''x'''", "line 1: multi-line strings are not supported"),
        ("a = {b = 1}", "line 1: inline tables are not supported"),
        ("[[a]]\nb = 1", "line 1: arrays of tables"),
        ("a = 1979-05-27", "line 1: dates and times are not supported"),
        ("a = 07:32:00", "line 1: dates and times are not supported"),
    ],
)
def test_parse_toml_refuses_unsupported_toml(text, message):
    """Valid TOML outside the subset is an error, never a wrong value."""
    with pytest.raises(ConfigError) as e:
        parse_toml(text)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize(
    "text, message",
    [
        ("\n\na = 1\na = 2", "line 4: key 'a' defined twice"),
        ("a = 1\na.b = 2", "line 2: key 'a' is not a table"),
        ("[a]\n[a]", "line 2: table [a] defined twice"),
        ("a = ", "line 1: expected a value"),
        ("a", "line 1: expected '=' after key"),
        ("= 1", "line 1: expected a key"),
        ("a = 1 2", "line 1: unexpected '2' after value"),
        ("a = 1,", "line 1: unexpected ','"),
        ('a = "x', "line 1: unterminated string"),
        ('a = "x\ny"', "line 1: unterminated string"),
        ("a = 'x", "line 1: unterminated string"),
        ('a = "\\q"', "line 1: invalid escape \\q"),
        ('a = "\\uD800"', "line 1: invalid unicode scalar"),
        ("a = [1 2]", "line 1: expected ',' or ']' in array"),
        ("a = [1,\n2", "line 2: expected ',' or ']' in array, found 'end of file'"),
        ("a = 01", "line 1: invalid value '01'"),
        ("a = 1__0", "line 1: invalid value '1__0'"),
        ("a = True", "line 1: invalid value 'True'"),
        ("a = yes", "line 1: invalid value 'yes'"),
        ("[a\nb = 1", "line 1: expected ']'"),
    ],
)
def test_parse_toml_rejects_invalid_toml(text, message):
    with pytest.raises(ConfigError) as e:
        parse_toml(text)
    assert str(e.value).startswith(message)
    if sys.version_info >= (3, 11):
        import tomllib

        with pytest.raises(tomllib.TOMLDecodeError):
            tomllib.loads(text)


def test_load_reads_utf8_file(tmp_path):
    path = tmp_path / "nsqd.cfg"
    path.write_text('broadcast_address = "h\u00f6st"\n', encoding="utf-8")
    assert config.load(str(path)) == {"broadcast_address": "h\u00f6st"}


# -- the settings table and coercion -------------------------------------------

# Every flag of Go nsqd 1.3 (options.md §2), with its config-file key.
GO_FLAGS = {
    "version": None, "config": None, "log-level": "log_level", "log-prefix": "log_prefix",
    "verbose": None, "node-id": "id", "worker-id": None, "tcp-address": "tcp_address",
    "http-address": "http_address", "https-address": "https_address",
    "broadcast-address": "broadcast_address", "broadcast-tcp-port": "broadcast_tcp_port",
    "broadcast-http-port": "broadcast_http_port", "lookupd-tcp-address": "nsqlookupd_tcp_addresses",
    "http-client-connect-timeout": "http_client_connect_timeout",
    "http-client-request-timeout": "http_client_request_timeout",
    "topology-region": "topology_region", "topology-zone": "topology_zone",
    "enable-experiment": "enable_experiment", "data-path": "data_path",
    "mem-queue-size": "mem_queue_size", "max-bytes-per-file": "max_bytes_per_file",
    "sync-every": "sync_every", "sync-timeout": "sync_timeout",
    "queue-scan-worker-pool-max": "queue_scan_worker_pool_max",
    "queue-scan-selection-count": "queue_scan_selection_count", "msg-timeout": "msg_timeout",
    "max-msg-timeout": "max_msg_timeout", "max-msg-size": "max_msg_size",
    "max-req-timeout": "max_req_timeout", "max-body-size": "max_body_size",
    "max-heartbeat-interval": "max_heartbeat_interval", "max-rdy-count": "max_rdy_count",
    "max-output-buffer-size": "max_output_buffer_size",
    "max-output-buffer-timeout": "max_output_buffer_timeout",
    "min-output-buffer-timeout": "min_output_buffer_timeout",
    "output-buffer-timeout": "output_buffer_timeout", "max-channel-consumers": "max_channel_consumers",
    "statsd-address": "statsd_address", "statsd-interval": "statsd_interval",
    "statsd-mem-stats": "statsd_mem_stats", "statsd-prefix": "statsd_prefix",
    "statsd-udp-packet-size": "statsd_udp_packet_size",
    "statsd-exclude-ephemeral": "statsd_exclude_ephemeral",
    "e2e-processing-latency-percentile": "e2e_processing_latency_percentiles",
    "e2e-processing-latency-window-time": "e2e_processing_latency_window_time",
    "tls-cert": "tls_cert", "tls-key": "tls_key", "tls-client-auth-policy": "tls_client_auth_policy",
    "tls-root-ca-file": "tls_root_ca_file", "tls-required": "tls_required",
    "tls-min-version": "tls_min_version", "deflate": "deflate", "max-deflate-level": "max_deflate_level",
    "snappy": "snappy", "auth-http-address": "auth_http_addresses",
    "auth-http-request-method": "auth_http_request_method",
}


# Our flags beyond Go nsqd's (documented in docs/divergences.md).
OUR_FLAGS = {"durable": "durable", "http-read-timeout": "http_read_timeout", "http-idle-timeout": "http_idle_timeout"}


def test_settings_cover_every_go_flag():
    assert {s.flag: s.key for s in SETTINGS} == {**GO_FLAGS, **OUR_FLAGS}
    assert len(SETTINGS) == len(GO_FLAGS) + len(OUR_FLAGS)


def test_supported_settings_are_options_fields():
    fields = set(Options.__dataclass_fields__)
    for setting in SETTINGS:
        if setting.status == SUPPORTED:
            assert setting.field in fields, setting.flag


def test_defaults_match_go():
    defaults = {s.flag: config.default(s) for s in SETTINGS}
    assert defaults["msg-timeout"] == 60.0
    assert defaults["max-msg-timeout"] == 900.0
    assert defaults["output-buffer-timeout"] == 0.25
    assert defaults["max-bytes-per-file"] == 104857600
    assert defaults["node-id"] is None  # computed from the hostname
    assert defaults["deflate"] is True
    assert defaults["statsd-prefix"] == "nsq.%s"


@pytest.mark.parametrize(
    "kind, value, expected",
    [
        ("duration", "2s", 2.0),
        ("duration", "1m30s", 90.0),
        ("duration", 2500, 2.5),  # integers are milliseconds
        ("duration", 0, 0.0),
        ("int", 42, 42),
        ("int", "0x10", 16),
        ("bool", True, True),
        ("bool", "false", False),
        ("str", "0.0.0.0:4150", "0.0.0.0:4150"),
        ("loglevel", "WARN", "warn"),
        ("tlsrequired", True, "true"),
        ("tlsrequired", "tcp-https", "tcp-https"),
        ("strlist", ["a:1", "b:2"], ("a:1", "b:2")),
        ("strlist", "a:1,b:2", ("a:1", "b:2")),
        ("strlist", "", ()),
        ("strlist", [], ()),
        ("floatlist", [1, 0.99], (1.0, 0.99)),
        ("floatlist", "1.0, 0.99,0.5", (1.0, 0.99, 0.5)),
    ],
)
def test_coerce(kind, value, expected):
    result = config.coerce(kind, value)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    "kind, value, message",
    [
        ("duration", 1.5, "integer milliseconds"),
        ("duration", True, "integer milliseconds"),
        ("duration", "2", "missing unit"),
        ("int", 1.0, "want an integer"),
        ("int", True, "want an integer"),
        ("int", "1.5", "invalid integer"),
        ("int", 1 << 63, "out of range"),
        ("bool", 1, "want true or false"),  # Go inverts integers; we refuse them
        ("bool", "yes", "invalid boolean"),
        ("str", 4150, "want a string"),
        ("loglevel", "loud", "invalid log level"),
        ("tlsrequired", "maybe", "tcp-https"),
        ("strlist", [1, 2], "array of strings"),
        ("floatlist", "1.0,x", "invalid list of floats"),
        ("floatlist", [True], "array of numbers"),
    ],
)
def test_coerce_rejects(kind, value, message):
    with pytest.raises(ValueError, match=message):
        config.coerce(kind, value)


def by_flag(values):
    return {s.flag: v for s, v in values.items()}


def test_resolve_uses_cfg_names_and_ignores_unknown_keys():
    doc = {
        "id": 7,
        "node_id": 9,  # the flag's own spelling is not the config key
        "msg_timeout": "5s",
        "max_req_timeout": 1500,
        "nsqlookupd_tcp_addresses": "a:4160,b:4160",
        "e2e_processing_latency_percentiles": [0.99],
        "enable_experiment": ["topology-aware-consumption"],
        "auth_http_addresses": [],
        "verbose": True,  # deprecated flags have no config key
        "no_such_option": 1,
        "section": {"msg_timeout": "9s"},
    }
    assert by_flag(config.resolve(doc)) == {
        "node-id": 7,
        "msg-timeout": 5.0,
        "max-req-timeout": 1.5,
        "lookupd-tcp-address": ("a:4160", "b:4160"),
        "e2e-processing-latency-percentile": (0.99,),
        "enable-experiment": ("topology-aware-consumption",),
        "auth-http-address": (),
    }


def test_resolve_names_the_key_of_a_bad_value():
    with pytest.raises(ConfigError) as e:
        config.resolve({"msg_timeout": "soon"})
    assert str(e.value) == 'msg_timeout: time: invalid duration "soon"'


def test_is_inert():
    settings = {s.flag: s for s in SETTINGS if s.status == UNSUPPORTED}
    assert config.is_inert(settings["tls-cert"], "")
    assert config.is_inert(settings["lookupd-tcp-address"], ())
    assert config.is_inert(settings["deflate"], True)  # nsqd's default
    assert config.is_inert(settings["max-deflate-level"], 6)
    assert config.is_inert(settings["tls-required"], "false")
    assert not config.is_inert(settings["tls-cert"], "cert.pem")
    assert config.is_inert(settings["deflate"], False)  # off is what we do anyway
    assert config.is_inert(settings["statsd-mem-stats"], False)
    assert not config.is_inert(settings["max-deflate-level"], 0)
    assert not config.is_inert(settings["statsd-exclude-ephemeral"], True)
    assert not config.is_inert(settings["tls-required"], "tcp-https")
    assert not config.is_inert(settings["lookupd-tcp-address"], ("a:4160",))
