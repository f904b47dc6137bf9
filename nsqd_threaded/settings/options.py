"""Broker options: every setting of nsqd in one table, and the :class:`Options` built from it.

The machinery (:class:`Kind`, :class:`Setting`, :func:`options_class`,
:func:`check_settings`) is not nsqd's alone: nsqlookupd's table
(:mod:`nsqd_threaded.lookupd.options`) is built from it too.

:data:`SETTINGS` lists each setting once, in nsqd's ``--help`` order: its flag,
value kind (how a flag value and a config-file value are parsed, and how the
value is printed), default, help text, whether the feature is built, its
config-file key and its startup check.  Everything else is derived from it:
the :class:`Options` fields and defaults, the command line
(:mod:`nsqd_threaded.cli`), the config file and flag resolution
(:mod:`nsqd_threaded.settings.config`), :meth:`Options.validate`, and the sets
:data:`DURATION_OPTIONS` and :data:`INTERNAL_OPTIONS`.

Durations are held as float seconds; sizes and counts as ints.
"""

import dataclasses
import hashlib
import os
import socket
import zlib

from ..internal.logger import LOG_LEVELS
from ..wire.protocol_v2 import is_valid_name
from ..internal.gocompat import (
    is_socket_path,
    INT64_MAX,
    INT64_MIN,
    format_duration,
    go_quote,
    parse_duration,
    parse_go_bool,
    parse_go_int,
)

VERSION = "1.3.0"


class OptionError(ValueError):
    """A startup validation failure (the message names the flag)."""


def default_node_id():
    """nsqd's default: crc32(md5(hostname)) % 1024."""
    digest = hashlib.md5(socket.gethostname().encode()).digest()
    return zlib.crc32(digest) % 1024


# -- value kinds ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Kind:
    """One kind of value: parsed from flag text, coerced from a TOML value, printed as Go does.

    ``type`` is the Python type of a value; ``parse(text)`` reads flag text,
    ``coerce(value)`` a config-file value, ``format(value)`` prints one.
    ``parse`` and ``coerce`` raise ValueError with a message that does not
    name the setting (the caller adds the flag or key).  A ``multiple`` kind
    may be given several times; each flag value parses to a tuple of items.
    ``bare`` kinds take Go's bare ``--name`` form (meaning true).  Compared by
    identity, as :class:`Setting` is (``setting.kind is DURATION``).
    """

    name: str
    type: type
    parse: object
    coerce: object
    format: object
    multiple: bool = False
    bare: bool = False

    def __repr__(self):
        return "<Kind %s>" % self.name


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _want(what, value):
    return ValueError("want %s, got %r" % (what, value))


def _coerce_str(value):
    if isinstance(value, str):
        return value
    raise _want("a string", value)


def _coerce_int(value):
    if _is_int(value):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError("%d is out of range" % value)
        return value
    if isinstance(value, str):
        return parse_go_int(value)
    raise _want("an integer", value)


def _coerce_duration(value):
    if isinstance(value, str):
        return parse_duration(value)
    if _is_int(value):
        return value / 1000.0  # nsqd reads an integer as milliseconds
    raise _want('a duration string like "2s" or integer milliseconds', value)


def _coerce_bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return parse_go_bool(value)
    raise _want("true or false", value)  # Go inverts integers (0 -> true); we refuse them


def parse_log_level(text):
    """A level name, case-insensitive, normalized to lower case."""
    if text.lower() not in LOG_LEVELS:
        raise ValueError("invalid log level %s (debug, info, warn, error, fatal)" % go_quote(text))
    return text.lower()


def _coerce_log_level(value):
    if isinstance(value, str):
        return parse_log_level(value)
    raise _want("a level name", value)


# nsqd's TLSRequired: 0 off, 1 TCP only ("tcp-https"), 2 TCP and HTTP ("true").
_TLS_REQUIRED = {0: "false", 1: "tcp-https", 2: "true"}


def parse_tls_required(text):
    """``true``/``false`` (Go bool syntax) or ``tcp-https`` -> nsqd's 2/0/1."""
    if text == "tcp-https":
        return 1
    try:
        return 2 if parse_go_bool(text) else 0
    except ValueError:
        raise ValueError("invalid value %s (true, false, tcp-https)" % go_quote(text)) from None


def _coerce_tls_required(value):
    if isinstance(value, bool):
        return 2 if value else 0
    if isinstance(value, str):
        return parse_tls_required(value)
    raise _want('true, false or "tcp-https"', value)


TIME_SKIPPING_AUTO = 2  # --time-skipping=auto: the broker skips by itself while nothing happens
_TIME_SKIPPING = {0: "false", 1: "true", TIME_SKIPPING_AUTO: "auto"}


def parse_time_skipping(text):
    """``true``/``false`` (Go bool syntax) or ``auto`` -> 1/0/2."""
    if text == "auto":
        return TIME_SKIPPING_AUTO
    try:
        return 1 if parse_go_bool(text) else 0
    except ValueError:
        raise ValueError("invalid value %s (true, false, auto)" % go_quote(text)) from None


def _coerce_time_skipping(value):
    if isinstance(value, bool):
        return 1 if value else 0
    if isinstance(value, int) and value in _TIME_SKIPPING:
        return value
    if isinstance(value, str):
        return parse_time_skipping(value)
    raise _want('true, false or "auto"', value)


_TLS_VERSIONS = {"tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}


def parse_tls_version(text):
    """``tls1.0`` .. ``tls1.3`` -> the TLS version number nsqd keeps (empty: nsqd's tls1.0)."""
    if text == "":
        return 0x0301
    version = _TLS_VERSIONS.get(text.lower())
    if version is None:
        raise ValueError("invalid TLS version %s (tls1.0, tls1.1, tls1.2, tls1.3)" % go_quote(text))
    return version


def _format_tls_version(version):
    return {v: k for k, v in _TLS_VERSIONS.items()}.get(version, "0x%04x" % version)


def _parse_str_item(text):
    return (text,)


def _coerce_str_list(value):
    if isinstance(value, str):
        return tuple(value.split(",")) if value else ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise _want("an array of strings or a comma-separated string", value)


def parse_float_list(text):
    """A comma-separated list of floats, as nsqd's percentile flag takes it."""
    try:
        return tuple(float(item.strip()) for item in text.split(","))
    except ValueError:
        raise ValueError("invalid list of floats %s" % go_quote(text)) from None


def _coerce_float_list(value):
    if isinstance(value, str):
        return parse_float_list(value) if value else ()
    if isinstance(value, list) and all(_is_number(v) for v in value):
        return tuple(float(v) for v in value)
    raise _want("an array of numbers or a comma-separated string", value)


def _coerce_float(value):
    if _is_number(value):
        return float(value)
    raise _want("a number", value)


def _format_floats(values):
    return ",".join(repr(float(v)) for v in values)


STR = Kind("string", str, str, _coerce_str, str)
INT = Kind("integer", int, parse_go_int, _coerce_int, str)
DURATION = Kind("duration", float, parse_duration, _coerce_duration, format_duration)
BOOL = Kind("bool", bool, parse_go_bool, _coerce_bool, lambda v: "true" if v else "false", bare=True)
LOG_LEVEL = Kind("level", str, parse_log_level, _coerce_log_level, str)
TLS_REQUIRED = Kind(
    "tls-required", int, parse_tls_required, _coerce_tls_required, _TLS_REQUIRED.get, bare=True
)
TLS_VERSION = Kind("tls-version", int, parse_tls_version, lambda v: parse_tls_version(_coerce_str(v)),
                   _format_tls_version)
TIME_SKIPPING = Kind("time-skipping", int, parse_time_skipping, _coerce_time_skipping, _TIME_SKIPPING.get, bare=True)
FLOAT = Kind("float", float, float, _coerce_float, repr)
STR_LIST = Kind("string", list, _parse_str_item, _coerce_str_list, ",".join, multiple=True)
FLOAT_LIST = Kind("float-list", list, parse_float_list, _coerce_float_list, _format_floats, multiple=True)


# -- startup checks (each returns an error text, or None) ----------------------------


def _positive(flag, value):
    return None if value > 0 else "%s must be > 0 (got %s)" % (flag, value)


def _non_negative(flag, value):
    return None if value >= 0 else "%s must be >= 0 (got %s)" % (flag, value)


def _node_id(flag, value):
    return None if 0 <= value < 1024 else "%s must be [0,1024)" % flag


def _deflate_level(flag, value):
    return None if 1 <= value <= 9 else "%s must be [1,9]" % flag


def _log_level(flag, value):
    if value.lower() in LOG_LEVELS:
        return None
    return "%s must be one of debug, info, warn, error, fatal" % flag


def _percentiles(flag, values):
    for p in values:
        if not 0 < p <= 1:
            return "invalid E2E processing latency percentile: %g" % p
    return None


def _auth_method(flag, value):
    return None if value in ("get", "post") else "%s must be post or get" % flag


def _listen_address(flag, value):
    """``host:port`` with a port in 0..65535, or a unix socket path; empty turns the listener off."""
    if value == "" or is_socket_path(value):
        return None
    return _tcp_listen_address(flag, value)


def _tcp_listen_address(flag, value):
    """``host:port`` with a port in 0..65535 (HTTPS: TLS over TCP only, as Go); empty turns it off."""
    if value == "":
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        if flag != "--https-address" and "/" not in value:
            return ("%s=%s: invalid address (want host:port, or a unix socket path starting with / or ./, "
                    "or @name)" % (flag, value))
        return "%s=%s: invalid address (want host:port)" % (flag, value)
    if int(port) > 65535:
        return "%s=%s: invalid port %s (want 0-65535)" % (flag, value, port)
    return None


# A --dead-letter-topic pattern names each topic's dead-letter topic: the placeholder stands for the topic's name.
DEAD_LETTER_TOPIC_PLACEHOLDER = "{topic}"

# The largest max attempts: a message's attempts field is 16 bits on the wire.
MAX_ATTEMPTS_LIMIT = 65535


def expand_dead_letter_topic(pattern, topic_name):
    """The dead-letter topic a --dead-letter-topic pattern names for ``topic_name`` (may be an invalid name)."""
    return pattern.replace(DEAD_LETTER_TOPIC_PLACEHOLDER, topic_name)


def _dead_letter_pattern(flag, value):
    if value == "" or is_valid_name(expand_dead_letter_topic(value, "t")):
        return None
    return ("%s=%s: invalid topic name or pattern (a topic name, where %s stands for the topic's name)"
            % (flag, value, DEAD_LETTER_TOPIC_PLACEHOLDER))


def _max_attempts(flag, value):
    if 0 <= value <= MAX_ATTEMPTS_LIMIT:
        return None
    return "%s must be [0,%d] (got %s)" % (flag, MAX_ATTEMPTS_LIMIT, value)


def _msg_ttl(flag, value):
    if value == 0 or value >= 0.001:
        return None
    return "%s must be 0 (none) or at least 1ms (got %s)" % (flag, format_duration(value))


# -- the table ----------------------------------------------------------------------

SUPPORTED = "supported"
UNSUPPORTED = "unsupported"  # the feature is not built: refused unless the value asks for nothing
DEPRECATED = "deprecated"  # accepted, no effect (as in nsqd)
META = "meta"  # --version and --config: about the command, not the broker
INTERNAL = "internal"  # an nsqd constant: an Options field without a flag or config key

_SAME = object()


@dataclasses.dataclass(frozen=True, eq=False)
class Setting:
    """One setting of a daemon (nsqd's unless a table says otherwise).  ``default`` is in our units and is the :class:`Options` default.

    ``field`` is the Options attribute (default: the flag with ``_``; None for
    META and DEPRECATED flags); ``cfg`` the config-file key (default: the
    field; None for none).  ``factory`` computes a default at startup.
    ``go_default`` is Go nsqd's default where ours differs (a feature we do
    not build that Go has on).  ``check(flag, value)`` returns an error text.
    """

    flag: object  # str, or None for INTERNAL settings
    kind: Kind
    default: object
    help: str = ""
    status: str = SUPPORTED
    field: object = ""
    cfg: object = ""
    check: object = None
    factory: object = None
    go_default: object = _SAME

    def __post_init__(self):
        if self.field == "":
            field = None if self.status in (META, DEPRECATED) else self.flag.replace("-", "_")
            object.__setattr__(self, "field", field)
        if self.cfg == "":
            cfg = None if self.status == INTERNAL else self.field
            object.__setattr__(self, "cfg", cfg)
        if self.go_default is _SAME:
            object.__setattr__(self, "go_default", self.default)

    @property
    def key(self):
        """The config-file key, or None."""
        return self.cfg

    @property
    def option(self):
        """``--flag`` as messages spell it."""
        return "--" + self.flag if self.flag else self.field

    @property
    def multiple(self):
        return self.kind.multiple

    def asks_for_nothing(self, value):
        """True when a value of an unbuilt feature changes nothing: off, empty, or our default.

        Such values are accepted (``--snappy=false``, ``tls_cert = ""``):
        they only restate what the broker does anyway.
        """
        return value is False or value in ("", (), []) or value == self.default


U = UNSUPPORTED

SETTINGS = (
    # process / network
    Setting("version", BOOL, False, "print version string", META),
    Setting("config", STR, "", "path to config file", META),
    Setting("log-level", LOG_LEVEL, "info", "set log verbosity: debug, info, warn, error, or fatal",
            check=_log_level),
    Setting("log-prefix", STR, "[nsqd] ", "log message prefix"),
    Setting("verbose", BOOL, False, "[deprecated] has no effect, use --log-level", DEPRECATED),
    Setting("node-id", INT, None, "unique part for message IDs, (int) in range [0,1024) "
            "(default is hash of hostname)", cfg="id", check=_node_id, factory=default_node_id),
    Setting("worker-id", BOOL, False, "[deprecated] use --node-id", DEPRECATED),
    Setting("https-address", STR, "0.0.0.0:4152", "<addr>:<port> to listen on for HTTPS clients",
            check=_tcp_listen_address),
    Setting("http-address", STR, "0.0.0.0:4151", "address to listen on for HTTP clients (<addr>:<port> for "
            "TCP/IP or <path> for unix socket)", check=_listen_address),
    Setting("tcp-address", STR, "0.0.0.0:4150", "address to listen on for TCP clients (<addr>:<port> for "
            "TCP/IP or <path> for unix socket)", check=_listen_address),
    Setting("auth-http-address", STR_LIST, (), "<addr>:<port> or a full url to query auth server "
            "(may be given multiple times)", field="auth_http_addresses"),
    Setting("auth-http-request-method", STR, "get", "HTTP method to use for auth server requests",
            check=_auth_method),
    Setting("broadcast-address", STR, None, "address that will be registered with lookupd "
            "(defaults to the OS hostname)", factory=socket.gethostname),
    Setting("broadcast-tcp-port", INT, 0, "TCP port that will be registered with lookupd "
            "(defaults to the TCP port that this nsqd is listening on)", check=_non_negative),
    Setting("broadcast-http-port", INT, 0, "HTTP port that will be registered with lookupd "
            "(defaults to the HTTP port that this nsqd is listening on)", check=_non_negative),
    Setting("lookupd-tcp-address", STR_LIST, (), "lookupd TCP address (may be given multiple times)",
            field="nsqlookupd_tcp_addresses"),
    Setting("http-client-connect-timeout", DURATION, 2.0, "timeout for HTTP connect", check=_non_negative),
    Setting("http-client-request-timeout", DURATION, 5.0, "timeout for HTTP request", check=_non_negative),
    Setting("http-read-timeout", DURATION, 30.0, "(not in Go nsqd) how long the HTTP server waits "
            "for a request's headers and body, and for the first request of a new connection", check=_positive),
    Setting("http-idle-timeout", DURATION, 60.0, "(not in Go nsqd) how long an idle HTTP keep-alive "
            "connection is kept open", check=_positive),
    Setting("debug-state-bodies", BOOL, False, "(not in Go nsqd) let GET /debug/state?bodies=true show the "
            "first bytes of queued, in-flight and deferred messages (with --auth-http-address, only to a "
            "request whose X-NSQ-Auth-Secret the auth server grants subscribe on the topic)"),
    Setting("channel-peek", BOOL, False, "(not in Go nsqd) answer GET /channel/peek: a channel's next "
            "messages with their bodies, consuming nothing (with --auth-http-address, only to a request "
            "whose X-NSQ-Auth-Secret the auth server grants subscribe on the topic and channel)"),
    Setting("time-skipping", TIME_SKIPPING, 0, "(not in Go nsqd) let POST /debug/time/skip move this broker's "
            "clock forward, for test suites: in-flight timeouts, REQ delays and deferred messages fall due at once; "
            "auto: also skip to the next deadline by itself whenever no connection has moved a byte for "
            "--time-skipping-grace"),
    Setting("time-skipping-grace", DURATION, 0.05, "(not in Go nsqd) with --time-skipping=auto, how long "
            "every connection must be quiet before the clock jumps", check=_positive),
    Setting("topology-region", STR, "", "region of this nsqd (experiment)", U),
    Setting("topology-zone", STR, "", "availability zone of this nsqd (experiment)", U),
    Setting("enable-experiment", STR_LIST, (), "enable experimental feature (may be given multiple "
            "times) (valid options: 'topology-aware-consumption')", U),
    # disk queue
    Setting("data-path", STR, "", "path to store disk-backed messages (an existing directory "
            "writable by this user; default: the working directory)"),
    Setting("mem-queue-size", INT, 10000, "number of messages to keep in memory (per topic/channel)",
            check=_non_negative),
    Setting("max-bytes-per-file", INT, 104857600, "number of bytes per diskqueue file before rolling",
            check=_positive),
    Setting("sync-every", INT, 2500, "number of messages per diskqueue fsync", check=_positive),
    Setting("sync-timeout", DURATION, 2.0, "duration of time per diskqueue fsync", check=_positive),
    Setting("connection-threads", BOOL, False, "(not in Go nsqd) give each TCP connection a thread of "
            "its own instead of serving them from epoll with a few threads (where there is no epoll, "
            "it always does)"),
    Setting("durable", BOOL, False, "(not in Go nsqd) acknowledge a publish only once it is fsynced "
            "(group commit), and keep every message recoverable until it is FINed"),
    Setting("queue-scan-worker-pool-max", INT, 4, "max concurrency for checking in-flight and "
            "deferred message timeouts", check=_positive),
    Setting("queue-scan-selection-count", INT, 20, "number of channels to check per cycle (every "
            "100ms) for in-flight and deferred timeouts", check=_positive),
    # messages and commands
    Setting("msg-timeout", DURATION, 60.0, "default duration to wait before auto-requeing a message",
            check=_positive),
    Setting("max-msg-timeout", DURATION, 900.0, "maximum duration before a message will timeout",
            check=_positive),
    Setting("max-msg-size", INT, 1048576, "maximum size of a single message in bytes", check=_positive),
    Setting("max-req-timeout", DURATION, 3600.0, "maximum requeuing timeout for a message",
            check=_non_negative),
    Setting("max-body-size", INT, 5242880, "maximum size of a single command body", check=_positive),
    # client-overridable bounds
    Setting("max-heartbeat-interval", DURATION, 60.0, "maximum client configurable duration of time "
            "between client heartbeats", check=_positive),
    Setting("max-rdy-count", INT, 2500, "maximum RDY count for a client", check=_non_negative),
    Setting("max-output-buffer-size", INT, 65536, "maximum client configurable size (in bytes) for "
            "a client output buffer", check=_positive),
    Setting("max-output-buffer-timeout", DURATION, 30.0, "maximum client configurable duration of "
            "time between flushing to a client", check=_non_negative),
    Setting("min-output-buffer-timeout", DURATION, 0.025, "minimum client configurable duration of "
            "time between flushing to a client", check=_non_negative),
    Setting("output-buffer-timeout", DURATION, 0.25, "default duration of time between flushing "
            "data to clients", check=_positive),
    Setting("max-channel-consumers", INT, 0, "maximum channel consumer connection count per nsqd "
            "instance (0 means unlimited)", check=_non_negative),
    # delivery policies (see docs/policies.md); a channel's own, set over HTTP, take precedence
    Setting("max-attempts", INT, 0, "(not in Go nsqd) default for every channel: a message is not "
            "delivered more than this many times, then goes to its dead-letter topic or is dropped "
            "(0 means unlimited)", check=_max_attempts),
    Setting("dead-letter-topic", STR, "", "(not in Go nsqd) default for every channel: the topic a "
            "message goes to after --max-attempts or --msg-ttl (" + DEAD_LETTER_TOPIC_PLACEHOLDER
            + " stands for the topic's name, e.g. '" + DEAD_LETTER_TOPIC_PLACEHOLDER + "-dlq'; empty: drop it)",
            check=_dead_letter_pattern),
    Setting("msg-ttl", DURATION, 0.0, "(not in Go nsqd) default for every channel: a message older "
            "than this is not delivered, it goes to its dead-letter topic or is dropped (0 means none)",
            check=_msg_ttl),
    # statsd
    Setting("statsd-address", STR, "", "UDP <addr>:<port> of a statsd daemon for pushing stats"),
    Setting("statsd-interval", DURATION, 60.0, "duration between pushing to statsd", check=_positive),
    Setting("statsd-mem-stats", BOOL, True, "toggle sending memory and GC stats to statsd"),
    Setting("statsd-prefix", STR, "nsq.%s", "prefix used for keys sent to statsd (%s for host "
            "replacement)"),
    Setting("statsd-udp-packet-size", INT, 508, "the size in bytes of statsd UDP packets"),
    Setting("statsd-exclude-ephemeral", BOOL, False, "skip ephemeral topics and channels when "
            "sending stats to statsd"),
    # end-to-end latency (percentiles sorted descending by validate; empty = off)
    Setting("e2e-processing-latency-percentile", FLOAT_LIST, (), "message processing time "
            "percentiles (as float (0, 1.0]) to track (can be specified multiple times or comma "
            "separated '1.0,0.99,0.95', default none)", field="e2e_processing_latency_percentiles",
            check=_percentiles),
    Setting("e2e-processing-latency-window-time", DURATION, 600.0, "calculate end to end latency "
            "quantiles for this duration of time"),
    # TLS
    Setting("tls-cert", STR, "", "path to certificate file"),
    Setting("tls-key", STR, "", "path to key file"),
    Setting("tls-client-auth-policy", STR, "", "client certificate auth policy "
            "('require' or 'require-verify')"),
    Setting("tls-root-ca-file", STR, "", "path to certificate authority file"),
    Setting("tls-required", TLS_REQUIRED, 0, "require TLS for client connections "
            "(true, false, tcp-https)"),
    Setting("tls-min-version", TLS_VERSION, 0x0301, "minimum SSL/TLS version acceptable "
            "('tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')"),
    # compression
    Setting("deflate", BOOL, True, "enable deflate feature negotiation (client compression)"),
    Setting("max-deflate-level", INT, 6, "max deflate compression level a client can negotiate "
            "(> values == > nsqd CPU usage)", check=_deflate_level),
    Setting("snappy", BOOL, True, "enable snappy feature negotiation (client compression)"),
    # nsqd's internal constants (no flag, no config key, not in /config)
    Setting(None, DURATION, 60.0, status=INTERNAL, field="client_timeout"),
    Setting(None, DURATION, 0.1, status=INTERNAL, field="queue_scan_interval"),
    Setting(None, DURATION, 5.0, status=INTERNAL, field="queue_scan_refresh_interval"),
    Setting(None, FLOAT, 0.25, status=INTERNAL, field="queue_scan_dirty_percent"),
    Setting(None, STR, VERSION, status=INTERNAL, field="version"),
    Setting(None, DURATION, 15.0, status=INTERNAL, field="lookupd_ping_interval"),  # Go's 15 s; tests shorten it
    # ours: how long a topic created while no lookupd answered holds its messages for the cluster's channels
    Setting(None, DURATION, 5.0, status=INTERNAL, field="lookupd_channel_query_hold"),
)

del U

# Options whose /config value is a Go time.Duration (rendered in nanoseconds).
DURATION_OPTIONS = frozenset(s.field for s in SETTINGS if s.kind is DURATION and s.status != INTERNAL)

# Fields that are internal constants in nsqd (no flag, so no /config entry).
INTERNAL_OPTIONS = frozenset(s.field for s in SETTINGS if s.status == INTERNAL)

# The settings that are Options fields, by field name.
BY_FIELD = {s.field: s for s in SETTINGS if s.field}

# ``--config``, ``--verbose`` and ``--version``: about the command, not the daemon;
# the last of nsqlookupd's and nsqadmin's settings, as in Go's --help.
COMMAND_SETTINGS = tuple(s for flag in ("config", "verbose", "version") for s in SETTINGS if s.flag == flag)


def daemon_settings(program):
    """nsqd's log and HTTP-deadline settings as another daemon (``nsqlookupd``, ``nsqadmin``) has them.

    In that daemon's table order: ``--log-level``, ``--log-prefix`` (default
    ``[program] ``), ``--http-read-timeout`` and ``--http-idle-timeout`` (their
    help naming ``program``); defaults and checks are nsqd's.
    """
    read, idle = BY_FIELD["http_read_timeout"], BY_FIELD["http_idle_timeout"]
    prefix = "[%s] " % program
    return (
        BY_FIELD["log_level"],
        dataclasses.replace(BY_FIELD["log_prefix"], default=prefix, go_default=prefix),
        dataclasses.replace(read, help=read.help.replace("nsqd", program)),
        dataclasses.replace(idle, help=idle.help.replace("nsqd", program)),
    )


# -- Options -------------------------------------------------------------------


def table_fields(settings):
    """The dataclass fields of a settings table: ``(name, type, default)`` per setting with a field, in order.

    The type is the setting's kind's; the default is the table's, as a
    ``dataclasses.field`` with a factory where the setting has one, or a fresh
    list where the table's default is a tuple (a repeatable flag).
    """
    fields = []
    for s in settings:
        if not s.field:
            continue
        if s.factory is not None:
            default = dataclasses.field(default_factory=s.factory)
        elif isinstance(s.default, tuple):
            default = dataclasses.field(default_factory=list if s.default == () else lambda d=s.default: list(d))
        else:
            default = s.default
        fields.append((s.field, s.kind.type, default))
    return fields


def options_class(settings):
    """A class decorator: make the class a dataclass with one field per setting of ``settings`` that has one.

    The table is the one statement of each field (name, order, type,
    default: :func:`table_fields`); the class body holds the docstring and the
    methods (``validate``), and may not declare fields of its own.  nsqd's
    :class:`Options`, nsqlookupd's and nsqadmin's options are made this way;
    the tools' by :func:`nsqd_threaded.command.table_options`, from the same fields.
    """

    def make(cls):
        if cls.__dict__.get("__annotations__"):
            raise TypeError("%s declares fields: its settings table makes them" % cls.__name__)
        annotations = {}
        for name, type_, default in table_fields(settings):
            if name in cls.__dict__:
                raise TypeError("%s.%s is both a setting and a member" % (cls.__name__, name))
            annotations[name] = type_
            setattr(cls, name, default)
        cls.__annotations__ = annotations
        return dataclasses.dataclass(cls)

    return make


def check_settings(options, settings):
    """Run each setting's startup check on ``options``; raise OptionError naming the flag."""
    for s in settings:
        if s.check is not None:
            error = s.check(s.option, getattr(options, s.field))
            if error:
                raise OptionError(error)


@options_class(SETTINGS)
class Options:
    """A broker's settings: one attribute per :data:`SETTINGS` entry with a field.

    Build with keywords (``Options(msg_timeout=5.0)``); :meth:`validate`
    decides what is acceptable.
    """

    def validate(self):
        """Raise OptionError, naming the flag, for an unusable value; returns self."""
        check_settings(self, SETTINGS)
        try:
            self.time_skipping = _coerce_time_skipping(self.time_skipping)  # (a keyword may say True or "auto")
        except ValueError as e:
            raise OptionError("--time-skipping: %s" % e) from None
        if self.msg_timeout > self.max_msg_timeout:
            raise OptionError("%s must be <= %s" % (BY_FIELD["msg_timeout"].option,
                                                    BY_FIELD["max_msg_timeout"].option))
        self._validate_tls()
        self.e2e_processing_latency_percentiles = sorted(self.e2e_processing_latency_percentiles, reverse=True)
        return self

    def _validate_tls(self):
        # nsqd's order: a client auth policy implies tls-required; then the
        # TLS config is built; then tls-required needs it.
        if self.tls_client_auth_policy and self.tls_required == 0:
            self.tls_required = 2
        problem = _tls_problem(self)
        if problem:
            raise OptionError(problem)
        if self.tls_required and not (self.tls_cert and self.tls_key):
            raise OptionError("cannot require TLS client connections without TLS key and cert")


def _tls_problem(options):
    """nsqd's buildTLSConfig failure for these options, or None (no TLS, or it loads)."""
    if not options.tls_cert and not options.tls_key:
        return None
    import ssl  # only brokers with TLS need it

    paths = [options.tls_cert, options.tls_key] + ([options.tls_root_ca_file] if options.tls_root_ca_file else [])
    for path in paths:
        try:
            open(path, "rb").close()
        except OSError as e:  # Go's os.Open wording (a missing cert or key: "open : ...")
            return "failed to build TLS config - open %s: %s" % (path, (e.strerror or str(e)).lower())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(options.tls_cert, options.tls_key)
        if options.tls_root_ca_file:
            context.load_verify_locations(options.tls_root_ca_file)
    except (ssl.SSLError, ValueError) as e:
        return "failed to build TLS config - %s" % e
    return None


def check_data_path(path):
    """The one-line reason the data directory cannot be used, or None.

    nsqd itself fails later with a bare OS error; this says which flag to fix.
    """
    shown = path or "%s (the working directory)" % os.getcwd()
    path = path or os.getcwd()
    if not os.path.exists(path):
        return "--data-path %s does not exist (create it, writable by this user, or choose another)" % shown
    if not os.path.isdir(path):
        return "--data-path %s is not a directory" % shown
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        return "--data-path %s is not writable by this user" % shown
    return None
