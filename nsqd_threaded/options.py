"""Broker options: nsqd's flags, defaults and startup validation.

Durations are held as float seconds; sizes and counts as ints.  The command
line (:mod:`nsqd_threaded.cli`) and the test fixture both build an
:class:`Options`; only :meth:`Options.validate` decides what is acceptable.
"""

import dataclasses
import hashlib
import socket
import zlib

VERSION = "1.3.0"


def default_node_id():
    """nsqd's default: crc32(md5(hostname)) % 1024."""
    digest = hashlib.md5(socket.gethostname().encode()).digest()
    return zlib.crc32(digest) % 1024


class OptionError(ValueError):
    """A startup validation failure (the message names the flag)."""


@dataclasses.dataclass
class Options:
    # process / network
    node_id: int = dataclasses.field(default_factory=default_node_id)
    tcp_address: str = "0.0.0.0:4150"
    http_address: str = "0.0.0.0:4151"
    http_read_timeout: float = 30.0  # beyond nsqd: the head and body of one request must arrive within it
    http_idle_timeout: float = 60.0  # beyond nsqd: the wait for a connection's next request
    broadcast_address: str = dataclasses.field(default_factory=socket.gethostname)
    broadcast_tcp_port: int = 0
    broadcast_http_port: int = 0
    log_level: str = "info"
    log_prefix: str = "[nsqd] "

    # queues
    data_path: str = ""
    durable: bool = False  # beyond nsqd: acknowledge publishes only once fsynced
    mem_queue_size: int = 10000
    max_bytes_per_file: int = 104857600
    sync_every: int = 2500
    sync_timeout: float = 2.0
    queue_scan_worker_pool_max: int = 4
    queue_scan_selection_count: int = 20

    # messages and commands
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_msg_size: int = 1048576
    max_req_timeout: float = 3600.0
    max_body_size: int = 5242880

    # client-overridable bounds
    max_heartbeat_interval: float = 60.0
    max_rdy_count: int = 2500
    max_output_buffer_size: int = 65536
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    max_channel_consumers: int = 0

    # end-to-end latency (percentiles sorted descending; empty = off)
    e2e_processing_latency_percentiles: list = dataclasses.field(default_factory=list)
    e2e_processing_latency_window_time: float = 600.0

    # compression (negotiation not built yet: both off, advertised as false)
    deflate: bool = False
    max_deflate_level: int = 6
    snappy: bool = False

    # not built yet: present so /config answers with nsqd's defaults
    https_address: str = "0.0.0.0:4152"
    nsqlookupd_tcp_addresses: list = dataclasses.field(default_factory=list)
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    auth_http_addresses: list = dataclasses.field(default_factory=list)
    auth_http_request_method: str = "get"
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_auth_policy: str = ""
    tls_root_ca_file: str = ""
    tls_required: int = 0
    tls_min_version: int = 0x0301
    statsd_address: str = ""
    statsd_prefix: str = "nsq.%s"
    statsd_interval: float = 60.0
    statsd_mem_stats: bool = True
    statsd_udp_packet_size: int = 508
    statsd_exclude_ephemeral: bool = False
    enable_experiment: list = dataclasses.field(default_factory=list)

    # topology experiment: only echoed in IDENTIFY responses
    topology_region: str = ""
    topology_zone: str = ""

    # fixed internals (no flag in nsqd)
    client_timeout: float = 60.0
    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_dirty_percent: float = 0.25
    version: str = VERSION

    def validate(self):
        """Raise OptionError with nsqd's wording for an unusable value."""
        if not 0 <= self.node_id < 1024:
            raise OptionError("--node-id must be [0,1024)")
        if not 1 <= self.max_deflate_level <= 9:
            raise OptionError("--max-deflate-level must be [1,9]")
        positive = [
            ("--msg-timeout", self.msg_timeout),
            ("--max-msg-timeout", self.max_msg_timeout),
            ("--max-msg-size", self.max_msg_size),
            ("--max-body-size", self.max_body_size),
            ("--max-heartbeat-interval", self.max_heartbeat_interval),
            ("--max-output-buffer-size", self.max_output_buffer_size),
            ("--output-buffer-timeout", self.output_buffer_timeout),
            ("--max-bytes-per-file", self.max_bytes_per_file),
            ("--sync-every", self.sync_every),
            ("--sync-timeout", self.sync_timeout),
            ("--queue-scan-worker-pool-max", self.queue_scan_worker_pool_max),
            ("--queue-scan-selection-count", self.queue_scan_selection_count),
            ("--http-read-timeout", self.http_read_timeout),
            ("--http-idle-timeout", self.http_idle_timeout),
        ]
        for flag, value in positive:
            if value <= 0:
                raise OptionError("%s must be > 0 (got %s)" % (flag, value))
        non_negative = [
            ("--mem-queue-size", self.mem_queue_size),
            ("--max-rdy-count", self.max_rdy_count),
            ("--max-req-timeout", self.max_req_timeout),
            ("--max-channel-consumers", self.max_channel_consumers),
            ("--max-output-buffer-timeout", self.max_output_buffer_timeout),
            ("--min-output-buffer-timeout", self.min_output_buffer_timeout),
            ("--broadcast-tcp-port", self.broadcast_tcp_port),
            ("--broadcast-http-port", self.broadcast_http_port),
        ]
        for flag, value in non_negative:
            if value < 0:
                raise OptionError("%s must be >= 0 (got %s)" % (flag, value))
        if self.msg_timeout > self.max_msg_timeout:
            raise OptionError("--msg-timeout must be <= --max-msg-timeout")
        for p in self.e2e_processing_latency_percentiles:
            if not 0 < p <= 1:
                raise OptionError("invalid E2E processing latency percentile: %g" % p)
        self.e2e_processing_latency_percentiles = sorted(self.e2e_processing_latency_percentiles, reverse=True)
        if self.log_level.lower() not in LOG_LEVELS:
            raise OptionError("--log-level must be one of debug, info, warn, error, fatal")
        return self


LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}


# Options whose /config value is a Go time.Duration (rendered in nanoseconds).
DURATION_OPTIONS = frozenset(
    {
        "sync_timeout",
        "msg_timeout",
        "max_msg_timeout",
        "max_req_timeout",
        "max_heartbeat_interval",
        "max_output_buffer_timeout",
        "min_output_buffer_timeout",
        "output_buffer_timeout",
        "http_client_connect_timeout",
        "http_client_request_timeout",
        "statsd_interval",
        "e2e_processing_latency_window_time",
        "http_read_timeout",
        "http_idle_timeout",
    }
)

# Fields that are internal constants in nsqd (no flag, so no /config entry).
INTERNAL_OPTIONS = frozenset(
    {"client_timeout", "queue_scan_interval", "queue_scan_refresh_interval", "queue_scan_dirty_percent", "version"}
)
