"""The fallback TOML parser (Python < 3.11): the subset nsqd config files use, and nothing else."""

import sys

import pytest

from nsqd_threaded.settings import config
from nsqd_threaded.settings.toml_fallback import TOMLDecodeError
from nsqd_threaded.settings.toml_fallback import loads as parse_toml

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
    with pytest.raises(TOMLDecodeError) as e:
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
    with pytest.raises(TOMLDecodeError) as e:
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


