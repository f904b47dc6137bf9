"""nsqd's settings table, the ``--config`` TOML file, and value coercion.

Every nsqd flag is listed once in :data:`SETTINGS` with its config-file key,
value kind and status; the command line (:mod:`nsqd_threaded.cli`) builds
its options from the same table, so the two can never disagree.

Config values are coerced as nsqd's option resolver does (options.md §1):
durations are Go duration strings or integer milliseconds, lists are TOML
arrays or comma-separated strings, unknown keys are ignored.
"""

import dataclasses
import re
import sys
from typing import NamedTuple

from .durations import parse_duration
from .options import LOG_LEVELS, Options
from .protocol import go_quote

SUPPORTED = "supported"
UNSUPPORTED = "unsupported"  # the feature is not built: refused when given
DEPRECATED = "deprecated"  # accepted, no effect (as in nsqd)
META = "meta"  # --version and --config: not options of the broker

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class Setting(NamedTuple):
    """One nsqd flag.  ``default`` is in our units (seconds for durations)."""

    flag: str
    kind: str  # str, int, duration, bool, loglevel, tlsrequired, strlist, floatlist
    help: str
    status: str = SUPPORTED
    default: object = None  # SUPPORTED settings take theirs from Options
    cfg: object = ""  # "" -> flag with "-" -> "_"; None -> no config key

    @property
    def key(self):
        """The config-file key, or None."""
        if self.cfg is None:
            return None
        return self.cfg or self.flag.replace("-", "_")

    @property
    def field(self):
        """The Options attribute (SUPPORTED settings only)."""
        if self.cfg and self.cfg != "id":
            return self.cfg  # e.g. e2e_processing_latency_percentiles
        return self.flag.replace("-", "_")

    @property
    def multiple(self):
        return self.kind in ("strlist", "floatlist")


U = UNSUPPORTED

SETTINGS = (
    # process / network
    Setting("version", "bool", "print version string", META, False, None),
    Setting("config", "str", "path to config file", META, "", None),
    Setting("log-level", "loglevel", "set log verbosity: debug, info, warn, error, or fatal"),
    Setting("log-prefix", "str", "log message prefix"),
    Setting("verbose", "bool", "[deprecated] has no effect, use --log-level", DEPRECATED, False, None),
    Setting("node-id", "int", "unique part for message IDs, (int) in range [0,1024) "
            "(default is hash of hostname)", cfg="id"),
    Setting("worker-id", "bool", "[deprecated] use --node-id", DEPRECATED, False, None),
    Setting("https-address", "str", "<addr>:<port> to listen on for HTTPS clients", U, "0.0.0.0:4152"),
    Setting("http-address", "str", "<addr>:<port> to listen on for HTTP clients"),
    Setting("http-read-timeout", "duration", "(not in Go nsqd) time allowed for the head and body "
            "of one HTTP request to arrive"),
    Setting("http-idle-timeout", "duration", "(not in Go nsqd) time an HTTP connection may wait "
            "for its next request"),
    Setting("tcp-address", "str", "<addr>:<port> to listen on for TCP clients"),
    Setting("auth-http-address", "strlist", "<addr>:<port> or a full url to query auth server "
            "(may be given multiple times)", U, (), "auth_http_addresses"),
    Setting("auth-http-request-method", "str", "HTTP method to use for auth server requests", U, "get"),
    Setting("broadcast-address", "str", "address that will be registered with lookupd "
            "(defaults to the OS hostname)"),
    Setting("broadcast-tcp-port", "int", "TCP port that will be registered with lookupd "
            "(defaults to the TCP port that this nsqd is listening on)"),
    Setting("broadcast-http-port", "int", "HTTP port that will be registered with lookupd "
            "(defaults to the HTTP port that this nsqd is listening on)"),
    Setting("lookupd-tcp-address", "strlist", "lookupd TCP address (may be given multiple times)",
            U, (), "nsqlookupd_tcp_addresses"),
    Setting("http-client-connect-timeout", "duration", "timeout for HTTP connect", U, 2.0),
    Setting("http-client-request-timeout", "duration", "timeout for HTTP request", U, 5.0),
    Setting("topology-region", "str", "region of this nsqd (experiment)", U, ""),
    Setting("topology-zone", "str", "availability zone of this nsqd (experiment)", U, ""),
    Setting("enable-experiment", "strlist", "enable experimental feature (may be given multiple times) "
            "(valid options: 'topology-aware-consumption')", U, (), "enable_experiment"),
    # disk queue
    Setting("data-path", "str", "path to store disk-backed messages"),
    Setting("mem-queue-size", "int", "number of messages to keep in memory (per topic/channel)"),
    Setting("max-bytes-per-file", "int", "number of bytes per diskqueue file before rolling"),
    Setting("sync-every", "int", "number of messages per diskqueue fsync"),
    Setting("sync-timeout", "duration", "duration of time per diskqueue fsync"),
    Setting("durable", "bool", "(not in Go nsqd) acknowledge a publish only once it is fsynced "
            "(group commit), and keep every message recoverable until it is FINed"),
    Setting("queue-scan-worker-pool-max", "int", "max concurrency for checking in-flight and deferred "
            "message timeouts"),
    Setting("queue-scan-selection-count", "int", "number of channels to check per cycle (every 100ms) "
            "for in-flight and deferred timeouts"),
    # messages and commands
    Setting("msg-timeout", "duration", "default duration to wait before auto-requeing a message"),
    Setting("max-msg-timeout", "duration", "maximum duration before a message will timeout"),
    Setting("max-msg-size", "int", "maximum size of a single message in bytes"),
    Setting("max-req-timeout", "duration", "maximum requeuing timeout for a message"),
    Setting("max-body-size", "int", "maximum size of a single command body"),
    # client-overridable bounds
    Setting("max-heartbeat-interval", "duration", "maximum client configurable duration of time "
            "between client heartbeats"),
    Setting("max-rdy-count", "int", "maximum RDY count for a client"),
    Setting("max-output-buffer-size", "int", "maximum client configurable size (in bytes) for a "
            "client output buffer"),
    Setting("max-output-buffer-timeout", "duration", "maximum client configurable duration of time "
            "between flushing to a client"),
    Setting("min-output-buffer-timeout", "duration", "minimum client configurable duration of time "
            "between flushing to a client"),
    Setting("output-buffer-timeout", "duration", "default duration of time between flushing data "
            "to clients"),
    Setting("max-channel-consumers", "int", "maximum channel consumer connection count per nsqd "
            "instance (0 means unlimited)"),
    # statsd
    Setting("statsd-address", "str", "UDP <addr>:<port> of a statsd daemon for pushing stats", U, ""),
    Setting("statsd-interval", "duration", "duration between pushing to statsd", U, 60.0),
    Setting("statsd-mem-stats", "bool", "toggle sending memory and GC stats to statsd", U, True),
    Setting("statsd-prefix", "str", "prefix used for keys sent to statsd (%s for host replacement)",
            U, "nsq.%s"),
    Setting("statsd-udp-packet-size", "int", "the size in bytes of statsd UDP packets", U, 508),
    Setting("statsd-exclude-ephemeral", "bool", "skip ephemeral topics and channels when sending "
            "stats to statsd", U, False),
    # end-to-end latency
    Setting("e2e-processing-latency-percentile", "floatlist", "message processing time percentiles "
            "(as float (0, 1.0]) to track (can be specified multiple times or comma separated "
            "'1.0,0.99,0.95', default none)", SUPPORTED, (), "e2e_processing_latency_percentiles"),
    Setting("e2e-processing-latency-window-time", "duration", "calculate end to end latency "
            "quantiles for this duration of time", SUPPORTED, 600.0),
    # TLS
    Setting("tls-cert", "str", "path to certificate file", U, ""),
    Setting("tls-key", "str", "path to key file", U, ""),
    Setting("tls-client-auth-policy", "str", "client certificate auth policy "
            "('require' or 'require-verify')", U, ""),
    Setting("tls-root-ca-file", "str", "path to certificate authority file", U, ""),
    Setting("tls-required", "tlsrequired", "require TLS for client connections "
            "(true, false, tcp-https)", U, "false"),
    Setting("tls-min-version", "str", "minimum SSL/TLS version acceptable "
            "('tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')", U, "tls1.0"),
    # compression
    Setting("deflate", "bool", "enable deflate feature negotiation (client compression)", U, True),
    Setting("max-deflate-level", "int", "max deflate compression level a client can negotiate "
            "(> values == > nsqd CPU usage)", U, 6),
    Setting("snappy", "bool", "enable snappy feature negotiation (client compression)", U, True),
)

del U


class ConfigError(ValueError):
    """The config file cannot be used (syntax, or a value of the wrong type)."""


# -- values shared by flags and the config file ---------------------------


def parse_go_int(text):
    """Go's ``strconv.ParseInt(s, 0, 64)``: ``0x``/``0o``/``0b`` prefixes, leading ``0`` = octal."""
    sign, body = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    if re.fullmatch(r"0_*[0-7][0-7_]*", body):  # Go's legacy octal; Python wants 0o
        body = "0o" + body[1:]
    value = None
    if body and all(c.isascii() and (c.isalnum() or c == "_") for c in body):
        try:
            value = int(sign + body, 0)
        except ValueError:
            pass
    if value is None:
        raise ValueError("invalid integer %s" % go_quote(text))
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError("integer %s out of range" % go_quote(text))
    return value


def parse_go_bool(text):
    """Go's ``strconv.ParseBool``, which ``flag`` uses for ``--name=value``."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError("invalid boolean %s (true or false)" % go_quote(text))


def parse_log_level(text):
    """A level name, case-insensitive, normalized to lower case."""
    if text.lower() not in LOG_LEVELS:
        raise ValueError("invalid log level %s (debug, info, warn, error, fatal)" % go_quote(text))
    return text.lower()


def parse_tls_required(text):
    """``true``/``false`` (Go bool syntax) or ``tcp-https``, normalized to those three words."""
    if text == "tcp-https":
        return text
    try:
        return "true" if parse_go_bool(text) else "false"
    except ValueError:
        raise ValueError("invalid value %s (true, false, tcp-https)" % go_quote(text)) from None


def parse_float_list(text):
    """A comma-separated list of floats, as nsqd's percentile flag takes it."""
    try:
        return tuple(float(item.strip()) for item in text.split(","))
    except ValueError:
        raise ValueError("invalid list of floats %s" % go_quote(text)) from None


# -- the config file -------------------------------------------------------


def load(path):
    """Read a TOML config file into a dict (OSError, or ValueError on bad syntax)."""
    with open(path, "rb") as f:
        data = f.read()
    return loads(data.decode("utf-8"))


def loads(text):
    """Parse TOML with :mod:`tomllib` where it exists (3.11+), else :func:`parse_toml`."""
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)
    return parse_toml(text)


def resolve(doc):
    """The settings a parsed config file sets: ``{Setting: value}`` in our units.

    Keys no setting uses are ignored, as in nsqd.  A value of the wrong type
    raises ConfigError naming the key.
    """
    values = {}
    for setting in SETTINGS:
        if setting.key is not None and setting.key in doc:
            try:
                values[setting] = coerce(setting.kind, doc[setting.key])
            except ValueError as e:
                raise ConfigError("%s: %s" % (setting.key, e)) from None
    return values


def coerce(kind, value):
    """A config-file value -> the value the flag of ``kind`` would have produced."""
    if kind == "duration":
        if isinstance(value, str):
            return parse_duration(value)
        if _is_int(value):
            return value / 1000.0  # an integer means milliseconds
        raise ValueError('want a duration string like "2s" or integer milliseconds, got %r' % (value,))
    if kind == "int":
        if _is_int(value):
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise ValueError("%d is out of range" % value)
            return value
        if isinstance(value, str):
            return parse_go_int(value)
        raise ValueError("want an integer, got %r" % (value,))
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return parse_go_bool(value)
        raise ValueError("want true or false, got %r" % (value,))
    if kind == "tlsrequired":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return parse_tls_required(value)
        raise ValueError('want true, false or "tcp-https", got %r' % (value,))
    if kind == "loglevel":
        if isinstance(value, str):
            return parse_log_level(value)
        raise ValueError("want a level name, got %r" % (value,))
    if kind == "str":
        if isinstance(value, str):
            return value
        raise ValueError("want a string, got %r" % (value,))
    if kind == "strlist":
        if isinstance(value, str):
            return tuple(value.split(",")) if value else ()
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError("want an array of strings or a comma-separated string, got %r" % (value,))
    if kind == "floatlist":
        if isinstance(value, str):
            return parse_float_list(value) if value else ()
        if isinstance(value, list) and all(_is_number(v) for v in value):
            return tuple(float(v) for v in value)
        raise ValueError("want an array of numbers or a comma-separated string, got %r" % (value,))
    raise AssertionError("unknown kind %r" % kind)


def default(setting):
    """A setting's default value in our units (None when computed at startup)."""
    if setting.status != SUPPORTED:
        return setting.default
    field = _OPTION_FIELDS[setting.field]
    return None if field.default is dataclasses.MISSING else field.default


def is_inert(setting, value):
    """True when a config value cannot turn anything on: empty, false, or nsqd's default.

    Config files often spell out every key (nsqd.cfg.example does), so a key
    of an unbuilt feature is refused only when it asks for something.
    """
    return value is False or value in ("", ()) or value == default(setting)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_OPTION_FIELDS = {f.name: f for f in dataclasses.fields(Options)}


# -- fallback TOML parser (Python < 3.11 has no tomllib) --------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[A-Za-z0-9_.+:-]+")
_DEC_INT = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)")
_PREFIXED_INT = re.compile(r"0x[0-9A-Fa-f](_?[0-9A-Fa-f])*|0o[0-7](_?[0-7])*|0b[01](_?[01])*")
_FLOAT = re.compile(
    r"[+-]?(0|[1-9](_?[0-9])*)(\.[0-9](_?[0-9])*([eE][+-]?[0-9](_?[0-9])*)?|[eE][+-]?[0-9](_?[0-9])*)"
    r"|[+-]?(inf|nan)"
)
_DATE_LIKE = re.compile(r"\d{4}-\d{2}|\d{2}:\d{2}")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def parse_toml(text):
    """Parse the TOML subset nsqd config files use; ConfigError on anything else.

    Supported: comments, ``key = value`` (bare, quoted and dotted keys),
    ``[table]`` headers, basic and literal strings, integers, floats,
    booleans, and arrays of those (nested, spanning lines).  Not supported:
    multi-line strings, inline tables, arrays of tables, dates and times.
    """
    return _TomlParser(text).document()


class _TomlParser:
    """A recursive-descent parser over the whole text; ``pos`` is the read position."""

    def __init__(self, text):
        self.text = text
        self.pos = 0
        self.doc = {}
        self.defined_tables = set()

    def error(self, message):
        line = self.text.count("\n", 0, self.pos) + 1
        return ConfigError("line %d: %s" % (line, message))

    def peek(self, n=1):
        return self.text[self.pos:self.pos + n]

    def skip_space(self):
        while self.peek() in (" ", "\t"):
            self.pos += 1

    def skip_comment(self):
        if self.peek() == "#":
            end = self.text.find("\n", self.pos)
            self.pos = len(self.text) if end < 0 else end

    def end_of_line(self):
        """After a statement: only spaces and a comment may follow on its line."""
        self.skip_space()
        self.skip_comment()
        if self.peek(2) == "\r\n":
            self.pos += 2
        elif self.peek() == "\n":
            self.pos += 1
        elif self.pos < len(self.text):
            raise self.error("unexpected %r after value" % self.peek())

    def document(self):
        table = self.doc
        while True:
            self.skip_space()
            self.skip_comment()
            if self.pos >= len(self.text):
                return self.doc
            c = self.peek()
            if c in ("\n", "\r"):
                self.end_of_line()
            elif c == "[":
                table = self.table_header()
            else:
                self.key_value(table)

    def table_header(self):
        if self.peek(2) == "[[":
            raise self.error("arrays of tables ([[...]]) are not supported")
        self.pos += 1
        self.skip_space()
        keys = self.key()
        self.skip_space()
        if self.peek() != "]":
            raise self.error("expected ']' to close the table header")
        self.pos += 1
        if keys in self.defined_tables:
            raise self.error("table [%s] defined twice" % ".".join(keys))
        self.defined_tables.add(keys)
        self.end_of_line()
        return self.descend(self.doc, keys)

    def descend(self, table, keys):
        for k in keys:
            table = table.setdefault(k, {})
            if not isinstance(table, dict):
                raise self.error("key %r is not a table" % k)
        return table

    def key_value(self, table):
        keys = self.key()
        self.skip_space()
        if self.peek() != "=":
            raise self.error("expected '=' after key %r" % ".".join(keys))
        self.pos += 1
        self.skip_space()
        value = self.value()
        table = self.descend(table, keys[:-1])
        if keys[-1] in table:
            raise self.error("key %r defined twice" % ".".join(keys))
        table[keys[-1]] = value
        self.end_of_line()

    def key(self):
        """A possibly dotted key, as a tuple of parts."""
        parts = [self.simple_key()]
        while True:
            self.skip_space()
            if self.peek() != ".":
                return tuple(parts)
            self.pos += 1
            self.skip_space()
            parts.append(self.simple_key())

    def simple_key(self):
        c = self.peek()
        if c == '"':
            return self.basic_string()
        if c == "'":
            return self.literal_string()
        m = _BARE_KEY.match(self.text, self.pos)
        if not m:
            raise self.error("expected a key, found %r" % c)
        self.pos = m.end()
        return m.group()

    def value(self):
        c = self.peek()
        if c == '"':
            return self.basic_string()
        if c == "'":
            return self.literal_string()
        if c == "[":
            return self.array()
        if c == "{":
            raise self.error("inline tables are not supported")
        return self.scalar()

    def basic_string(self):
        if self.peek(3) == '"""':
            raise self.error("multi-line strings are not supported")
        self.pos += 1
        out = []
        while True:
            c = self.peek()
            if c in ("", "\n", "\r"):
                raise self.error("unterminated string")
            self.pos += 1
            if c == '"':
                return "".join(out)
            if c == "\\":
                out.append(self.escape())
            elif c < " " and c != "\t" or c == "\x7f":
                raise self.error("control character %r in string" % c)
            else:
                out.append(c)

    def escape(self):
        c = self.peek()
        self.pos += 1
        if c in _ESCAPES:
            return _ESCAPES[c]
        if c in ("u", "U"):
            width = 4 if c == "u" else 8
            digits = self.peek(width)
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.error("invalid \\%s escape" % c)
            self.pos += width
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise self.error("invalid unicode scalar \\%s%s" % (c, digits))
            return chr(code)
        raise self.error("invalid escape \\%s" % c)

    def literal_string(self):
        if self.peek(3) == "'''":
            raise self.error("multi-line strings are not supported")
        end = self.pos + 1
        while end < len(self.text) and self.text[end] not in "'\n\r":
            end += 1
        if self.text[end:end + 1] != "'":
            raise self.error("unterminated string")
        value = self.text[self.pos + 1:end]
        self.pos = end + 1
        return value

    def array(self):
        self.pos += 1
        items = []
        while True:
            self.skip_array_space()
            if self.peek() == "]":
                self.pos += 1
                return items
            items.append(self.value())
            self.skip_array_space()
            c = self.peek()
            if c == ",":
                self.pos += 1
            elif c != "]":
                raise self.error("expected ',' or ']' in array, found %r" % (c or "end of file"))

    def skip_array_space(self):
        """Inside arrays, newlines and comments are whitespace."""
        while True:
            self.skip_space()
            self.skip_comment()
            if self.peek(2) == "\r\n":
                self.pos += 2
            elif self.peek() == "\n":
                self.pos += 1
            else:
                return

    def scalar(self):
        m = _SCALAR.match(self.text, self.pos)
        if not m:
            raise self.error("expected a value, found %r" % (self.peek() or "end of file"))
        token = m.group()
        if token in ("true", "false"):
            value = token == "true"
        elif _DEC_INT.fullmatch(token) or _PREFIXED_INT.fullmatch(token):
            value = int(token, 0) if token[:2] in ("0x", "0o", "0b") else int(token)
        elif _FLOAT.fullmatch(token):
            value = float(token)
        elif _DATE_LIKE.match(token):
            raise self.error("dates and times are not supported: %r" % token)
        else:
            raise self.error("invalid value %r" % token)
        self.pos = m.end()
        return value
