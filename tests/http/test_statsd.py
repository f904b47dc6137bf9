"""Pushing stats to statsd: the pure formatting, then a real broker against a UDP listener.

The listener stands in for a statsd daemon: it reads datagrams on
127.0.0.1:0 and splits the lines into pushes (a push ends with a known key:
``mem.gc_runs`` when mem stats are on, else the last key of the test's data).
"""

import os
import queue
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

from nsqd_threaded.server.statsd import datagrams, expand_prefix, host_key, pack, render_lines

from support.cli import invoke, options_for
from support.http_api import HTTP
from support.wire import Conn, wait_for

pytestmark = pytest.mark.timeout(60)

INTERVAL = 0.05  # seconds between pushes in the live tests


# -- the pure formatting ------------------------------------------------------------


def _channel(name, **counts):
    doc = {"channel_name": name, "depth": 0, "backend_depth": 0, "in_flight_count": 0, "deferred_count": 0,
           "message_count": 0, "requeue_count": 0, "timeout_count": 0, "client_count": 0,
           "e2e_processing_latency": {"count": 0, "percentiles": None}}
    doc.update(counts)
    return doc


def _topic(name, channels=(), **counts):
    doc = {"topic_name": name, "channels": list(channels), "depth": 0, "backend_depth": 0, "message_count": 0,
           "message_bytes": 0, "e2e_processing_latency": {"count": 0, "percentiles": None}}
    doc.update(counts)
    return doc


MEM = {"heap_objects": 7, "heap_idle_bytes": 0, "heap_in_use_bytes": 4096, "heap_released_bytes": 0,
       "gc_pause_usec_100": 30, "gc_pause_usec_99": 20, "gc_pause_usec_95": 10, "next_gc_bytes": 0,
       "gc_total_runs": 5}


def test_render_lines_go_keys_and_order():
    e2e = {"count": 3, "percentiles": [{"quantile": 1.0, "value": 2500.9}, {"quantile": 0.99, "value": 2000.0},
                                       {"quantile": 0.5, "value": 1000.2}]}
    snap = {"topics": [_topic("t", [_channel("c", depth=2, backend_depth=1, in_flight_count=3, deferred_count=4,
                                             message_count=9, requeue_count=5, timeout_count=6, client_count=7,
                                             e2e_processing_latency=e2e)],
                              depth=11, backend_depth=12, message_count=13, message_bytes=14,
                              e2e_processing_latency=e2e)],
            "memory": MEM}
    assert "".join(render_lines("p.", snap)) == (
        "p.topic.t.message_count:13|c\n"
        "p.topic.t.message_bytes:14|c\n"
        "p.topic.t.depth:11|g\n"
        "p.topic.t.backend_depth:12|g\n"
        "p.topic.t.e2e_processing_latency_100:2500|g\n"
        "p.topic.t.e2e_processing_latency_99:2000|g\n"
        "p.topic.t.e2e_processing_latency_50:1000|g\n"
        "p.topic.t.channel.c.message_count:9|c\n"
        "p.topic.t.channel.c.depth:2|g\n"
        "p.topic.t.channel.c.backend_depth:1|g\n"
        "p.topic.t.channel.c.in_flight_count:3|g\n"
        "p.topic.t.channel.c.deferred_count:4|g\n"
        "p.topic.t.channel.c.requeue_count:5|c\n"
        "p.topic.t.channel.c.timeout_count:6|c\n"
        "p.topic.t.channel.c.clients:7|g\n"
        "p.topic.t.channel.c.e2e_processing_latency_100:2500|g\n"
        "p.topic.t.channel.c.e2e_processing_latency_99:2000|g\n"
        "p.topic.t.channel.c.e2e_processing_latency_50:1000|g\n"
        "p.mem.heap_objects:7|g\n"
        "p.mem.heap_idle_bytes:0|g\n"
        "p.mem.heap_in_use_bytes:4096|g\n"
        "p.mem.heap_released_bytes:0|g\n"
        "p.mem.gc_pause_usec_100:30|g\n"
        "p.mem.gc_pause_usec_99:20|g\n"
        "p.mem.gc_pause_usec_95:10|g\n"
        "p.mem.next_gc_bytes:0|g\n"
        "p.mem.gc_runs:5|c\n"
    )


def test_counters_are_deltas_gauges_are_values():
    first = {"topics": [_topic("t", [_channel("c", message_count=3, requeue_count=1, depth=3)], message_count=3,
                               message_bytes=30, depth=3)], "memory": MEM}
    second = {"topics": [_topic("t", [_channel("c", message_count=5, requeue_count=1, timeout_count=2, depth=1),
                                      _channel("new", message_count=2)],
                                message_count=5, message_bytes=50, depth=1),
                         _topic("u", message_count=4)],
              "memory": dict(MEM, gc_total_runs=8)}
    lines = render_lines("", second, first)
    values = dict(line.rstrip("\n").split(":", 1) for line in lines)
    assert values["topic.t.message_count"] == "2|c"
    assert values["topic.t.message_bytes"] == "20|c"
    assert values["topic.t.depth"] == "1|g"
    assert values["topic.t.channel.c.message_count"] == "2|c"
    assert values["topic.t.channel.c.requeue_count"] == "0|c"
    assert values["topic.t.channel.c.timeout_count"] == "2|c"
    assert values["topic.t.channel.c.depth"] == "1|g"
    assert values["topic.t.channel.new.message_count"] == "2|c"  # new since the last push: from zero
    assert values["topic.u.message_count"] == "4|c"
    assert values["mem.gc_runs"] == "3|c"


def test_no_memory_no_mem_keys_and_empty_prefix():
    lines = render_lines("", {"topics": [_topic("t")]})
    assert lines[0] == "topic.t.message_count:0|c\n"
    assert not [line for line in lines if line.startswith("mem.")]
    assert render_lines("x.", {"topics": []}) == []


def test_exclude_ephemeral():
    snap = {"topics": [_topic("e#ephemeral", [_channel("c")]), _topic("t", [_channel("c"), _channel("d#ephemeral")])]}
    keys = {line.split(":")[0] for line in render_lines("", snap, exclude_ephemeral=True)}
    assert not [k for k in keys if "#ephemeral" in k]
    assert "topic.t.channel.c.clients" in keys
    keys = {line.split(":")[0] for line in render_lines("", snap)}
    assert {"topic.e#ephemeral.depth", "topic.e#ephemeral.channel.c.depth", "topic.t.channel.d#ephemeral.depth"} <= keys


def test_pack_never_splits_a_line():
    lines = ["a" * 40 + "\n", "b" * 50 + "\n", "c" * 7 + "\n", "d" * 200 + "\n", "e\n"]
    assert pack(lines, 100) == [lines[0].encode() + lines[1].encode() + lines[2].encode(),  # exactly 100
                                lines[3].encode(),  # longer than a packet: alone
                                b"e\n"]
    assert pack(lines, 60) == [lines[0].encode(), lines[1].encode() + lines[2].encode(), lines[3].encode(), b"e\n"]
    assert pack([], 508) == []
    assert pack(lines, 0) == [b"".join(line.encode() for line in lines)]  # Go's 4096 for a size <= 0


def test_datagrams_of_successive_snapshots():
    snaps = [{"topics": [_topic("t", message_count=n)]} for n in (3, 3, 7)]
    pushes = datagrams(snaps, "n.", 508)
    assert [p[0].split(b"\n")[0] for p in pushes] == [
        b"n.topic.t.message_count:3|c", b"n.topic.t.message_count:0|c", b"n.topic.t.message_count:4|c"]
    for push in datagrams(snaps * 10, "n.", 64):
        assert all(len(d) <= 64 and d.endswith(b"\n") for d in push)


def test_prefix_expansion():
    assert host_key("127.0.0.1", 4151) == "127_0_0_1_4151"
    assert host_key("::1", 4151) == "[__1]_4151"  # Go's JoinHostPort brackets an IPv6 host
    assert expand_prefix("nsq.%s", "127.0.0.1", 4151) == "nsq.127_0_0_1_4151."
    assert expand_prefix("a.%s.b.%s", "h.example", 80) == "a.h_example_80.b.h_example_80."
    assert expand_prefix("plain.", "h", 1) == "plain."
    assert expand_prefix("", "h", 1) == ""


# -- the flags ----------------------------------------------------------------------


def test_flags_in_go_forms():
    opts, warnings = options_for("-statsd-address", "127.0.0.1:8125", "-statsd-exclude-ephemeral",
                                 "--statsd-interval=10s", "--statsd-udp-packet-size=1400", "--statsd-prefix=x.%s",
                                 "--statsd-mem-stats=false")
    assert (opts.statsd_address, opts.statsd_exclude_ephemeral, opts.statsd_interval, opts.statsd_udp_packet_size,
            opts.statsd_prefix, opts.statsd_mem_stats) == ("127.0.0.1:8125", True, 10.0, 1400, "x.%s", False)
    assert warnings == []


def test_zero_interval_is_refused():
    result = invoke("--statsd-interval=0s")
    assert result.exit_code != 0 and "--statsd-interval must be > 0" in result.output, result.output


# -- a broker against a UDP listener ---------------------------------------------------


class StatsdListener:
    """A statsd stand-in on 127.0.0.1:0.  ``_reader`` (joined by close) queues each datagram."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.datagrams = queue.Queue()
        self._lines = []  # lines read but not yet returned (only the test thread touches it)
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="statsd-listener", daemon=True)
        self._reader.start()

    def _read(self):
        while not self._closed.is_set():
            try:
                self.datagrams.put(self.sock.recv(65536))
            except socket.timeout:
                continue
            except OSError:
                return

    def close(self):
        self._closed.set()
        self._reader.join()
        self.sock.close()

    def push(self, end_key, timeout=20.0):
        """The next push: ``{key: (value, type)}`` of its lines up to the line of ``end_key``."""
        push = {}
        while True:
            if not self._lines:
                data = self.datagrams.get(timeout=timeout)
                assert data.endswith(b"\n"), data
                self._lines = data.decode().splitlines()
            line = self._lines.pop(0)
            key, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            push[key] = (int(value), kind)
            if key.endswith(end_key):
                return push

    def push_where(self, end_key, predicate, what, timeout=20.0):
        """Pushes until one satisfies ``predicate``; returns (that push, the pushes before it)."""
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            push = self.push(end_key, timeout)
            if predicate(push, seen):
                return push, seen
            seen.append(push)
        raise AssertionError("no push with %s; last: %r" % (what, seen[-1:]))


@pytest.fixture
def statsd():
    listener = StatsdListener()
    yield listener
    listener.close()


def _broker(make_nsqd, statsd, **kwargs):
    kwargs.setdefault("statsd_address", statsd.address)
    kwargs.setdefault("statsd_interval", INTERVAL)
    kwargs.setdefault("statsd_prefix", "")
    return make_nsqd(**kwargs)


def _sum(pushes, key):
    return sum(p[key][0] for p in pushes if key in p)


def test_counters_are_deltas_across_intervals(make_nsqd, statsd):
    nsqd = _broker(make_nsqd, statsd, statsd_mem_stats=False)
    end = "topic.t.channel.c.clients"
    with Conn(nsqd.tcp_address) as conn:
        conn.sub("t", "c")
        for i in range(3):
            assert conn.pub("t", b"abcd") == b"OK"
        # Pushes may already have gone out with part of the counts: their deltas add up.
        push, before = statsd.push_where(end, lambda p, seen: _sum(seen + [p], "topic.t.message_count") == 3,
                                         "3 messages")
        assert _sum(before + [push], "topic.t.message_bytes") == 12
        assert _sum(before + [push], "topic.t.channel.c.message_count") == 3
        assert push["topic.t.message_count"][1] == "c" and push["topic.t.depth"][1] == "g"
        # Nothing new: the next push counts zero while the gauges still show the state.
        quiet = statsd.push(end)
        assert quiet["topic.t.message_count"] == (0, "c")
        assert quiet["topic.t.channel.c.message_count"] == (0, "c")
        assert quiet["topic.t.channel.c.depth"] == (3, "g")
        assert quiet["topic.t.channel.c.clients"] == (1, "g")
        # Two more, one of them requeued by a consumer.
        conn.mpub("t", [b"x", b"yz"])
        push, before = statsd.push_where(end, lambda p, seen: _sum(seen + [p], "topic.t.message_count") == 2,
                                         "2 more messages")
        assert _sum(before + [push], "topic.t.message_bytes") == 3
        conn.cmd(b"RDY 1")
        msg_id = conn.read_message()[2]
        conn.cmd(b"REQ " + msg_id + b" 0")
        push, _ = statsd.push_where(end, lambda p, seen: _sum(seen + [p], "topic.t.channel.c.requeue_count") == 1,
                                    "a requeue")


def test_default_prefix_host_key_and_mem_stats(make_nsqd, statsd):
    nsqd = _broker(make_nsqd, statsd, statsd_prefix="nsq.%s", broadcast_address="127.0.0.1")
    prefix = "nsq.127_0_0_1_%d." % nsqd.http_address[1]
    nsqd.get_topic("t")
    push, _ = statsd.push_where("mem.gc_runs", lambda p, seen: prefix + "topic.t.depth" in p, "topic t")
    assert all(key.startswith(prefix) for key in push)
    mem = {key[len(prefix):]: v for key, v in push.items() if key.startswith(prefix + "mem.")}
    assert set(mem) == {"mem.heap_objects", "mem.heap_idle_bytes", "mem.heap_in_use_bytes", "mem.heap_released_bytes",
                        "mem.gc_pause_usec_100", "mem.gc_pause_usec_99", "mem.gc_pause_usec_95", "mem.next_gc_bytes",
                        "mem.gc_runs"}
    assert mem["mem.gc_runs"][1] == "c" and mem["mem.heap_in_use_bytes"][1] == "g"
    assert mem["mem.heap_in_use_bytes"][0] > 0
    # The key prefix is what /config shows.
    assert HTTP(nsqd).get("/config/statsd_prefix").body.decode() == prefix


def test_custom_prefix_and_no_mem_stats(make_nsqd, statsd):
    nsqd = _broker(make_nsqd, statsd, statsd_prefix="a.%s.b", broadcast_address="localhost",
                   broadcast_http_port=4151, statsd_mem_stats=False)
    nsqd.get_topic("t")
    push, _ = statsd.push_where("topic.t.backend_depth", lambda p, seen: True, "a push")
    assert set(push) == {"a.localhost_4151.b.topic.t." + k
                         for k in ("message_count", "message_bytes", "depth", "backend_depth")}


def test_exclude_ephemeral_live(make_nsqd, statsd):
    nsqd = _broker(make_nsqd, statsd, statsd_exclude_ephemeral=True, statsd_mem_stats=False)
    with Conn(nsqd.tcp_address) as c1, Conn(nsqd.tcp_address) as c2:
        c1.sub("t", "c#ephemeral")
        c2.sub("e#ephemeral", "c")
        nsqd.get_topic("t").get_channel("z")  # sorts after the ephemeral channel: the end of each push
        push, _ = statsd.push_where("topic.t.channel.z.clients", lambda p, seen: True, "a push")
        assert not [k for k in push if "#ephemeral" in k]
        assert "topic.t.channel.z.depth" in push


def test_ephemeral_included_by_default(make_nsqd, statsd):
    nsqd = _broker(make_nsqd, statsd, statsd_mem_stats=False)
    with Conn(nsqd.tcp_address) as conn:
        conn.sub("t", "c#ephemeral")
        push, _ = statsd.push_where("topic.t.channel.c#ephemeral.clients", lambda p, seen: True, "a push")
        assert push["topic.t.channel.c#ephemeral.clients"] == (1, "g")


def test_packets_split_at_the_packet_size(make_nsqd, statsd):
    nsqd = _broker(make_nsqd, statsd, statsd_udp_packet_size=120)
    for i in range(5):
        nsqd.get_topic("t%d" % i).get_channel("c")
    statsd.push_where("mem.gc_runs", lambda p, seen: "topic.t4.channel.c.clients" in p, "every topic")
    sizes = []
    for _ in range(20):
        data = statsd.datagrams.get(timeout=20)
        assert data.endswith(b"\n") and len(data) <= 120, data
        sizes.append(len(data))
    assert max(sizes) > 60  # several lines share a datagram


def test_e2e_percentiles(make_nsqd, statsd):
    nsqd = _broker(make_nsqd, statsd, statsd_mem_stats=False, e2e_processing_latency_percentiles=[0.5, 1.0])
    end = "topic.t.channel.c.e2e_processing_latency_50"
    with Conn(nsqd.tcp_address) as conn:
        conn.sub("t", "c", rdy=1)
        conn.pub("t", b"m")
        conn.cmd(b"FIN " + conn.read_message()[2])
        push, _ = statsd.push_where(end, lambda p, seen: p["topic.t.channel.c.e2e_processing_latency_100"][0] > 0,
                                    "a latency")
    for key in ("topic.t.e2e_processing_latency_100", "topic.t.e2e_processing_latency_50",
                "topic.t.channel.c.e2e_processing_latency_50"):
        assert push[key][1] == "g" and push[key][0] > 0


def _dead_udp_address():
    """A 127.0.0.1 UDP port nothing listens on (bound, then closed)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    return address


@pytest.mark.parametrize("which", ["closed-port", "no-port-here"])
def test_a_dead_statsd_does_not_hurt_the_broker(make_nsqd, which):
    address = _dead_udp_address() if which == "closed-port" else which
    # One line a datagram: the sends after the first meet the ICMP port unreachable.
    nsqd = make_nsqd(statsd_address=address, statsd_interval=0.01, statsd_udp_packet_size=1)
    log = nsqd.log.stream
    wait_for(lambda: log.getvalue().count("STATSD") + log.getvalue().count("statsd(") >= 5, what="several rounds")
    with Conn(nsqd.tcp_address) as conn:
        assert conn.pub("t", b"still here") == b"OK"
    assert HTTP(nsqd).stats(topic="t")["topics"][0]["message_count"] == 1
    if address == "no-port-here":
        assert "failed to create UDP socket to statsd(no-port-here)" in log.getvalue()
    else:  # ICMP port unreachable makes the later sends fail: logged, not fatal
        wait_for(lambda: "packets to %s not sent" % address in log.getvalue(), what="a send error logged")
    nsqd.stop()
    assert not [t for t in threading.enumerate() if t.name == "nsqd-statsd"]


def test_stop_wakes_the_thread_at_once(make_nsqd, statsd):
    """With an hour between pushes, stop() returns only because it wakes the thread (else the timeout fails)."""
    nsqd = _broker(make_nsqd, statsd, statsd_interval=3600.0)
    assert [t for t in threading.enumerate() if t.name == "nsqd-statsd"]
    nsqd.stop()
    assert not [t for t in threading.enumerate() if t.name == "nsqd-statsd"]
    assert "STATSD: closing" in nsqd.log.stream.getvalue()


def test_no_address_no_thread(nsqd):
    assert not [t for t in threading.enumerate() if t.name == "nsqd-statsd"]


# -- side by side with Go nsqd (optional) -----------------------------------------------

GO_NSQD = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "reference", "go-nsq-1.3.0", "nsqd")


def _keys_of_one_push(statsd, end_key, host):
    push, _ = statsd.push_where(end_key, lambda p, seen: "topic.t.channel.c.depth" in {
        k.replace(host, "") for k in p}, "topic t")
    return {k.replace(host, "HOST") for k in push}


@pytest.mark.skipif(not os.access(GO_NSQD, os.X_OK), reason="Go nsqd binary not present")
def test_same_keys_as_go_nsqd(make_nsqd, statsd, tmp_path):
    percentiles = [1.0, 0.99, 0.5]
    ours = _broker(make_nsqd, statsd, statsd_prefix="nsq.%s", broadcast_address="127.0.0.1",
                   e2e_processing_latency_percentiles=percentiles, statsd_interval=0.2)
    ours.get_topic("t").get_channel("c")
    our_keys = _keys_of_one_push(statsd, "mem.gc_runs", "nsq.127_0_0_1_%d." % ours.http_address[1])
    ours.stop()

    go_statsd = StatsdListener()
    data = tmp_path / "go"
    data.mkdir()
    proc = subprocess.Popen(
        [GO_NSQD, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--data-path=%s" % data,
         "--broadcast-address=127.0.0.1", "--statsd-address=%s" % go_statsd.address, "--statsd-interval=2s",
         "--e2e-processing-latency-percentile=1.0,0.99,0.5", "--statsd-udp-packet-size=4096"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
    try:
        http = None
        for line in proc.stderr:
            if "HTTP: listening on " in line:
                http = line.rsplit(" ", 1)[1].strip()
                break
        assert http, "Go nsqd did not start"
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            urllib.request.urlopen(urllib.request.Request("http://" + http + path, method="POST"), timeout=10).read()
        go_keys = _keys_of_one_push(go_statsd, "mem.gc_runs", "nsq.%s." % http.replace(".", "_").replace(":", "_"))
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()
        go_statsd.close()
    assert our_keys == go_keys
