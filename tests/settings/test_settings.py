"""The settings table, Options built from it, config-file coercion and :func:`config.resolve`."""

import dataclasses

import pytest

from nsqd_threaded.settings import config, options
from nsqd_threaded.settings.config import ConfigError, NotSupportedError
from nsqd_threaded.settings.options import (
    BOOL,
    DURATION,
    FLOAT_LIST,
    INT,
    LOG_LEVEL,
    SETTINGS,
    STR,
    STR_LIST,
    SUPPORTED,
    TLS_REQUIRED,
    TLS_VERSION,
    UNSUPPORTED,
    Options,
)

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
OUR_FLAGS = {"durable": "durable", "connection-threads": "connection_threads", "http-read-timeout": "http_read_timeout", "http-idle-timeout": "http_idle_timeout",
             "debug-state-bodies": "debug_state_bodies", "max-attempts": "max_attempts",
             "dead-letter-topic": "dead_letter_topic", "msg-ttl": "msg_ttl", "channel-peek": "channel_peek",
             "time-skipping": "time_skipping", "time-skipping-grace": "time_skipping_grace"}


def test_settings_cover_every_go_flag():
    flags = [s for s in SETTINGS if s.flag]
    assert {s.flag: s.key for s in flags} == {**GO_FLAGS, **OUR_FLAGS}
    assert len(flags) == len(GO_FLAGS) + len(OUR_FLAGS)


def test_options_fields_are_the_settings_with_a_field():
    fields = [f.name for f in dataclasses.fields(Options)]
    assert fields == [s.field for s in SETTINGS if s.field]
    for setting in SETTINGS:
        if setting.status in (SUPPORTED, UNSUPPORTED):
            assert setting.field in fields, setting.flag
    assert Options().msg_timeout == 60.0 and Options().e2e_processing_latency_percentiles == []
    assert Options().nsqlookupd_tcp_addresses is not Options().nsqlookupd_tcp_addresses


def test_derived_sets():
    assert options.INTERNAL_OPTIONS == {
        "client_timeout", "queue_scan_interval", "queue_scan_refresh_interval", "queue_scan_dirty_percent", "version",
        "lookupd_ping_interval", "lookupd_channel_query_hold"}
    assert {"msg_timeout", "sync_timeout", "statsd_interval", "http_read_timeout"} <= options.DURATION_OPTIONS
    assert not options.DURATION_OPTIONS & options.INTERNAL_OPTIONS
    assert "max_rdy_count" not in options.DURATION_OPTIONS
    assert list(options.LOG_LEVELS) == ["debug", "info", "warn", "error", "fatal"]


def test_defaults_match_go():
    defaults = {s.flag: s.default for s in SETTINGS}
    go_defaults = {s.flag: s.go_default for s in SETTINGS}
    assert defaults["msg-timeout"] == 60.0
    assert defaults["max-msg-timeout"] == 900.0
    assert defaults["output-buffer-timeout"] == 0.25
    assert defaults["max-bytes-per-file"] == 104857600
    assert defaults["node-id"] is None  # computed from the hostname
    assert defaults["statsd-prefix"] == "nsq.%s"
    assert defaults["tls-min-version"] == 0x0301 and defaults["tls-required"] == 0
    assert (defaults["deflate"], go_defaults["deflate"]) == (True, True)
    assert (defaults["snappy"], go_defaults["snappy"]) == (True, True)


@pytest.mark.parametrize(
    "kind, value, expected",
    [
        (DURATION, "2s", 2.0),
        (DURATION, "1m30s", 90.0),
        (DURATION, 2500, 2.5),  # integers are milliseconds
        (DURATION, 0, 0.0),
        (INT, 42, 42),
        (INT, "0x10", 16),
        (BOOL, True, True),
        (BOOL, "false", False),
        (STR, "0.0.0.0:4150", "0.0.0.0:4150"),
        (LOG_LEVEL, "WARN", "warn"),
        (TLS_REQUIRED, True, 2),
        (TLS_REQUIRED, "tcp-https", 1),
        (TLS_VERSION, "tls1.2", 0x0303),
        (TLS_VERSION, "", 0x0301),
        (STR_LIST, ["a:1", "b:2"], ("a:1", "b:2")),
        (STR_LIST, "a:1,b:2", ("a:1", "b:2")),
        (STR_LIST, "", ()),
        (STR_LIST, [], ()),
        (FLOAT_LIST, [1, 0.99], (1.0, 0.99)),
        (FLOAT_LIST, "1.0, 0.99,0.5", (1.0, 0.99, 0.5)),
    ],
)
def test_coerce(kind, value, expected):
    result = config.coerce(kind, value)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    "kind, value, message",
    [
        (DURATION, 1.5, "integer milliseconds"),
        (DURATION, True, "integer milliseconds"),
        (DURATION, "2", "missing unit"),
        (INT, 1.0, "want an integer"),
        (INT, True, "want an integer"),
        (INT, "1.5", "invalid integer"),
        (INT, 1 << 63, "out of range"),
        (BOOL, 1, "want true or false"),  # Go inverts integers; we refuse them
        (BOOL, "yes", "invalid boolean"),
        (STR, 4150, "want a string"),
        (LOG_LEVEL, "loud", "invalid log level"),
        (TLS_REQUIRED, "maybe", "tcp-https"),
        (STR_LIST, [1, 2], "array of strings"),
        (FLOAT_LIST, "1.0,x", "invalid list of floats"),
        (FLOAT_LIST, [True], "array of numbers"),
    ],
)
def test_coerce_rejects(kind, value, message):
    with pytest.raises(ValueError, match=message):
        config.coerce(kind, value)


def write_config(tmp_path, text):
    path = tmp_path / "nsqd.cfg"
    path.write_text(text)
    return str(path)


def test_read_uses_cfg_names_and_warns_about_unknown_keys(tmp_path):
    path = write_config(tmp_path, """
        id = 7
        node_id = 9                  # the flag's own spelling is not the config key
        msg_timeout = "5s"
        max_req_timeout = 1500
        mem_queue_sizee = 100        # a typo
        e2e_processing_latency_percentiles = [0.99]
        auth_http_addresses = []
        enable_experiment = ""
        verbose = true               # deprecated flags have no config key
        [section]
        msg_timeout = "9s"
        """)
    values, warnings = config.read(path)
    assert values == {
        "node_id": 7,
        "msg_timeout": 5.0,
        "max_req_timeout": 1.5,
        "e2e_processing_latency_percentiles": [0.99],
        "auth_http_addresses": [],
    }
    prefix = "config file %s: unknown key " % path
    assert warnings == [
        prefix + "node_id ignored (did you mean id?)",
        prefix + "mem_queue_sizee ignored (did you mean mem_queue_size?)",
        prefix + "verbose ignored",
        prefix + "section ignored",
    ]


def test_read_names_the_key_of_a_bad_value(tmp_path):
    path = write_config(tmp_path, 'msg_timeout = "soon"\n')
    with pytest.raises(ConfigError) as e:
        config.read(path)
    assert str(e.value) == 'failed to load config file %s - msg_timeout: time: invalid duration "soon"' % path


def test_read_takes_the_compression_keys(tmp_path):
    path = write_config(tmp_path, "deflate = true\nsnappy = false\nmax_deflate_level = 6\n")
    values, warnings = config.read(path)
    assert values == {"deflate": True, "snappy": False, "max_deflate_level": 6}
    assert warnings == []


def test_resolve_flags_win_and_deprecated_flags_warn(tmp_path):
    by_flag = {s.flag: s for s in SETTINGS}
    path = write_config(tmp_path, 'msg_timeout = "5s"\nmax_rdy_count = 3\n')
    flags = {by_flag["msg-timeout"]: 9.0, by_flag["verbose"]: True,
             by_flag["auth-http-address"]: [], by_flag["snappy"]: False, by_flag["tls-required"]: 0,
             by_flag["e2e-processing-latency-percentile"]: (0.5,)}
    values, warnings = config.resolve(flags, path)
    assert values == {"msg_timeout": 9.0, "max_rdy_count": 3, "e2e_processing_latency_percentiles": [0.5],
                      "auth_http_addresses": [], "snappy": False, "tls_required": 0}
    assert warnings == ["--verbose is deprecated and has no effect, use --log-level"]
    assert config.resolve({}, None) == ({}, [])


@pytest.mark.parametrize("flag, value", [("topology-region", "r1"), ("enable-experiment", ["topology-aware-consumption"])])
def test_resolve_refuses_values_of_unbuilt_features(flag, value):
    setting = {s.flag: s for s in SETTINGS}[flag]
    with pytest.raises(NotSupportedError, match="--%s is not supported yet" % flag):
        config.resolve({setting: value})


def test_asks_for_nothing():
    settings = {s.flag: s for s in SETTINGS if s.status == UNSUPPORTED}
    assert settings["topology-zone"].asks_for_nothing("")
    assert settings["enable-experiment"].asks_for_nothing([])
    assert not settings["topology-zone"].asks_for_nothing("z1")
    assert not settings["enable-experiment"].asks_for_nothing(["topology-aware-consumption"])


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"node_id": 1024}, "--node-id must be [0,1024)"),
        ({"tcp_address": "127.0.0.1:99999"}, "--tcp-address=127.0.0.1:99999: invalid port 99999 (want 0-65535)"),
        ({"http_address": "localhost"},
         "--http-address=localhost: invalid address (want host:port, or a unix socket path starting with / or ./, "
         "or @name)"),
        ({"https_address": "/run/nsqd.sock"}, "--https-address=/run/nsqd.sock: invalid address (want host:port)"),
        ({"msg_timeout": 0.0}, "--msg-timeout must be > 0 (got 0.0)"),
        ({"http_read_timeout": 0.0}, "--http-read-timeout must be > 0 (got 0.0)"),
        ({"max_rdy_count": -1}, "--max-rdy-count must be >= 0 (got -1)"),
        ({"msg_timeout": 1000.0}, "--msg-timeout must be <= --max-msg-timeout"),
        ({"log_level": "loud"}, "--log-level must be one of debug, info, warn, error, fatal"),
        ({"max_deflate_level": 0}, "--max-deflate-level must be [1,9]"),
        ({"e2e_processing_latency_percentiles": [0.5, 0]}, "invalid E2E processing latency percentile: 0"),
    ],
)
def test_validate_names_the_flag(fields, message):
    with pytest.raises(options.OptionError) as e:
        Options(**dict({"node_id": 1}, **fields)).validate()
    assert str(e.value) == message


def test_validate_accepts_listen_addresses():
    for address in ("127.0.0.1:0", "[::1]:4150", ":4150", "0.0.0.0:65535"):
        Options(tcp_address=address, http_address=address).validate()
    Options(http_address="").validate()  # HTTP off
    opts = Options(e2e_processing_latency_percentiles=(0.5, 0.99, 1.0)).validate()
    assert opts.e2e_processing_latency_percentiles == [1.0, 0.99, 0.5]


def test_check_data_path(tmp_path):
    assert options.check_data_path(str(tmp_path)) is None
    missing = str(tmp_path / "missing")
    assert options.check_data_path(missing) == (
        "--data-path %s does not exist (create it, writable by this user, or choose another)" % missing)
    afile = tmp_path / "file"
    afile.write_text("")
    assert options.check_data_path(str(afile)) == "--data-path %s is not a directory" % afile


def test_test_brokers_resolve_like_the_command_line(tmp_path):
    """testing.Broker goes through config.resolve too: same acceptances, same warnings in its log."""
    from nsqd_threaded.testing import Broker, resolve_options

    path = write_config(tmp_path, "mem_queue_sizee = 100\nmax_rdy_count = 7\n")
    assert resolve_options(["--config=" + path, "--topology-zone="]) == {"max_rdy_count": 7}
    with pytest.raises(ValueError, match="--topology-zone is not supported yet"):
        resolve_options(["--topology-zone=z1"])
    with Broker("--config=" + path, "--verbose") as broker:
        assert broker.nsqd.options.max_rdy_count == 7
        log = broker.log
    assert "WARNING: config file %s: unknown key mem_queue_sizee ignored (did you mean mem_queue_size?)" % path in log
    assert "WARNING: --verbose is deprecated and has no effect, use --log-level" in log
