"""Pushing stats to a statsd daemon over UDP, as nsqd's statsdLoop does.

The formatting is pure: :func:`render_lines` turns a stats snapshot (the
/stats document of :func:`..broker.stats.collect`, without clients) and the
previous one into statsd lines with Go nsqd's key names, and :func:`pack`
packs lines into datagrams of at most ``--statsd-udp-packet-size`` bytes
without ever splitting a line.  :class:`StatsdLoop` is the I/O edge: one
thread that takes a snapshot every ``--statsd-interval`` and sends it.
"""

import socket
import threading
import time

from ..internal.gocompat import join_host_port, split_host_port
from ..broker.stats import collect

EPHEMERAL_SUFFIX = "#ephemeral"

# Go's bufio.NewWriterSize falls back to this size when asked for <= 0 bytes.
GO_DEFAULT_BUFFER_SIZE = 4096


# -- pure formatting -----------------------------------------------------------------


def host_key(broadcast_address, http_port):
    """nsqd's statsd host key: ``host:port`` (JoinHostPort) with ``.`` and ``:`` made ``_``."""
    return join_host_port(broadcast_address, http_port).replace(".", "_").replace(":", "_")


def expand_prefix(prefix, broadcast_address, http_port):
    """``--statsd-prefix`` as nsqd expands it at startup: every ``%s`` becomes the host key and a
    ``.`` ends it; an empty prefix stays empty (keys then start with ``topic.``)."""
    if not prefix:
        return ""
    prefix = prefix.replace("%s", host_key(broadcast_address, http_port))
    return prefix if prefix.endswith(".") else prefix + "."


def _by_name(docs, key):
    return {d[key]: d for d in docs or ()}


def _percentile_lines(prefix, key, e2e):
    # Go formats the quantile with %.0f and truncates the nanosecond value to an int64.
    return [
        "%s%s.e2e_processing_latency_%.0f:%d|g\n" % (prefix, key, p["quantile"] * 100.0, int(p["value"]))
        for p in e2e["percentiles"] or ()
    ]


def render_lines(prefix, current, previous=None, exclude_ephemeral=False):
    """The statsd lines (``str``, each ending in a newline) of one push, in nsqd's order.

    ``current`` and ``previous`` are /stats documents (``topics``, and ``memory``
    when mem stats are on); counters are deltas against ``previous`` (the last
    push; None for the first, whose counters are the full values).  A topic or
    channel absent from ``previous`` counts from zero.
    """
    last_topics = _by_name(previous["topics"] if previous else (), "topic_name")
    lines = []
    for topic in current["topics"] or ():
        name = topic["topic_name"]
        if exclude_ephemeral and name.endswith(EPHEMERAL_SUFFIX):
            continue
        last = last_topics.get(name, {})
        key = "topic." + name
        lines += [
            "%s%s.message_count:%d|c\n" % (prefix, key, topic["message_count"] - last.get("message_count", 0)),
            "%s%s.message_bytes:%d|c\n" % (prefix, key, topic["message_bytes"] - last.get("message_bytes", 0)),
            "%s%s.depth:%d|g\n" % (prefix, key, topic["depth"]),
            "%s%s.backend_depth:%d|g\n" % (prefix, key, topic["backend_depth"]),
        ]
        lines += _percentile_lines(prefix, key, topic["e2e_processing_latency"])
        last_channels = _by_name(last.get("channels"), "channel_name")
        for channel in topic["channels"]:
            cname = channel["channel_name"]
            if exclude_ephemeral and cname.endswith(EPHEMERAL_SUFFIX):
                continue
            was = last_channels.get(cname, {})
            ckey = "%s.channel.%s" % (key, cname)
            lines += [
                "%s%s.message_count:%d|c\n" % (prefix, ckey, channel["message_count"] - was.get("message_count", 0)),
                "%s%s.depth:%d|g\n" % (prefix, ckey, channel["depth"]),
                "%s%s.backend_depth:%d|g\n" % (prefix, ckey, channel["backend_depth"]),
                "%s%s.in_flight_count:%d|g\n" % (prefix, ckey, channel["in_flight_count"]),
                "%s%s.deferred_count:%d|g\n" % (prefix, ckey, channel["deferred_count"]),
                "%s%s.requeue_count:%d|c\n" % (prefix, ckey, channel["requeue_count"] - was.get("requeue_count", 0)),
                "%s%s.timeout_count:%d|c\n" % (prefix, ckey, channel["timeout_count"] - was.get("timeout_count", 0)),
                "%s%s.clients:%d|g\n" % (prefix, ckey, channel["client_count"]),
            ]
            if "dead_letter_count" in channel:  # (a delivery policy applies: not in Go nsqd)
                lines += [
                    "%s%s.dead_letter_count:%d|c\n"
                    % (prefix, ckey, channel["dead_letter_count"] - was.get("dead_letter_count", 0)),
                    "%s%s.expired_count:%d|c\n" % (prefix, ckey, channel["expired_count"] - was.get("expired_count", 0)),
                ]
            lines += _percentile_lines(prefix, ckey, channel["e2e_processing_latency"])
    mem = current.get("memory")
    if mem is not None:
        last_mem = (previous or {}).get("memory") or {}
        for name in ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
                     "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes"):
            lines.append("%smem.%s:%d|g\n" % (prefix, name, mem[name]))
        runs = mem["gc_total_runs"] - last_mem.get("gc_total_runs", 0)
        lines.append("%smem.gc_runs:%d|c\n" % (prefix, runs))
    return lines


def pack(lines, packet_size):
    """Datagrams (``bytes``) of at most ``packet_size`` bytes, never splitting a line.

    As nsqd's boundary-buffered writer: a line that does not fit in what is
    left of the current datagram starts the next one; a line longer than a
    whole datagram is sent alone.
    """
    if packet_size <= 0:
        packet_size = GO_DEFAULT_BUFFER_SIZE
    packets = []
    current = bytearray()
    for line in lines:
        data = line.encode("utf-8")
        if len(current) + len(data) > packet_size and current:
            packets.append(bytes(current))
            current.clear()
        if len(data) > packet_size:
            packets.append(data)
        else:
            current += data
    if current:
        packets.append(bytes(current))
    return packets


def datagrams(snapshots, prefix, packet_size, exclude_ephemeral=False):
    """For successive snapshots, the datagrams of each push (one list per snapshot)."""
    pushes = []
    previous = None
    for snapshot in snapshots:
        pushes.append(pack(render_lines(prefix, snapshot, previous, exclude_ephemeral), packet_size))
        previous = snapshot
    return pushes


# -- the I/O edge --------------------------------------------------------------------


class StatsdLoop:
    """The ``nsqd-statsd`` thread of one broker (started and joined by NSQD).

    Every ``--statsd-interval`` it resolves ``--statsd-address``, snapshots the
    broker's stats (no clients) and sends the datagrams spread evenly over the
    interval minus one second, as nsqd does (at once when that is not
    positive).  :meth:`close` wakes it at once; datagrams still due are then
    sent without waiting.  Send errors are logged, never fatal.

    The previous snapshot (for counter deltas) is touched only by the thread.
    """

    def __init__(self, nsqd, prefix):
        self._nsqd = nsqd
        self.prefix = prefix
        self._stop = threading.Event()  # set by close(): the thread exits
        self._previous = None
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._run, name="nsqd-statsd", daemon=True)
        self._thread.start()

    def close(self):
        """Stop the thread and join it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self):
        interval = self._nsqd.options.statsd_interval
        next_push = time.monotonic() + interval
        while not self._stop.wait(max(0.0, next_push - time.monotonic())):
            try:
                self.push()
            except Exception as e:  # a bug in one push must not end the pushes
                self._nsqd.log.error("STATSD: push failed - %r", e)
            now = time.monotonic()
            next_push += interval
            while next_push <= now:  # as a Go ticker: missed ticks are dropped, the phase is kept
                next_push += interval
        self._nsqd.log.info("STATSD: closing")

    def push(self):
        """One round: resolve and connect, snapshot, send.  No connection -> skip the round."""
        options = self._nsqd.options
        log = self._nsqd.log
        address = options.statsd_address
        try:
            sock = _connect_udp(address)
        except (OSError, ValueError) as e:
            log.error("failed to create UDP socket to statsd(%s) - %s", address, e)
            return
        with sock:
            log.info("STATSD: pushing stats to %s", address)
            snapshot = collect(self._nsqd, include_clients=False, include_mem=options.statsd_mem_stats)
            lines = render_lines(self.prefix, snapshot, self._previous, options.statsd_exclude_ephemeral)
            self._previous = snapshot
            self._send(sock, pack(lines, options.statsd_udp_packet_size), options.statsd_interval - 1.0, address)

    def _send(self, sock, packets, spread, address):
        pause = spread / len(packets) if packets and spread > 0 else 0.0
        failed = 0
        error = None
        for i, packet in enumerate(packets):
            try:
                sock.send(packet)
            except OSError as e:  # e.g. ECONNREFUSED: nothing listens there (yet)
                failed += 1
                error = e
            if pause and i < len(packets) - 1:
                self._stop.wait(pause)  # after close(): the rest at once
        if failed:
            self._nsqd.log.warn("STATSD: %d of %d packets to %s not sent - %s", failed, len(packets), address, error)


def _connect_udp(address):
    """A UDP socket connected to ``host:port`` (resolved now, as nsqd dials each round)."""
    host, port = split_host_port(address)
    family, type_, proto, _, sockaddr = socket.getaddrinfo(host or None, port, 0, socket.SOCK_DGRAM)[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.connect(sockaddr)
    except OSError:
        sock.close()
        raise
    return sock
