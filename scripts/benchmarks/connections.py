"""Many idle subscribed connections: memory per connection, mass close, /stats, PUB latency.

Starts a broker (``python -m nsqd_threaded``) as a child process on ephemeral
ports unless ``--nsqd-tcp-address``/``--nsqd-http-address`` are given.  Worker
processes open the connections (each: magic, IDENTIFY with a heartbeat
interval, SUB, RDY 1; heartbeats answered with NOP) on a topic nothing is
published to, so the consumers stay idle.  Then it measures:

* connections held (the channel's client_count in /stats) and the broker's RSS
  per connection (needs the broker's pid: ours, or ``--pid``),
* /stats time (JSON, clients included) with every connection held,
* PUB round trip (PUB -> OK) and PUB -> delivery latency on another topic while
  the idle consumers are connected,
* mass close: every worker closes all its sockets at once; the time until the
  broker has removed every client, and the max /ping latency meanwhile,
* the broker's RSS after the close (memory returned?).

``--channel-per-connection``: each connection subscribes to a channel of its
own (``ch0`` .. ``chN-1``, all new), a burst of channel creations.  The open
time runs until every connection is subscribed and held (per /stats).

``--go PATH_TO_GO_NSQD``: Go's nsqd too (on ephemeral 127.0.0.1 ports, with a
temporary data directory), alternately with ours for ``--rounds`` rounds; the
figures are then printed side by side as medians.

Example: ``scripts/bench connections --connections 5000``, or
``scripts/bench connections --channel-per-connection --go PATH_TO_GO_NSQD --rounds 3``.
"""

import argparse
import http.client
import json
import multiprocessing
import os
import resource
import selectors
import socket
import statistics
import struct
import sys
import threading
import time


IDLE_TOPIC = "bench_conn_idle"
RT_TOPIC = "bench_conn_rt"
HEARTBEAT = b"_heartbeat_"


def raise_nofile():
    """Raise this process's open-file limit to its hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid):
    """The process's (user, system) CPU seconds so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def threads_of(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


# -- worker process -------------------------------------------------------------


def consumer_worker(host, port, count, heartbeat_ms, control, report, first_channel=None):
    """Open ``count`` subscribed connections, keep them alive, close them all on "close".

    ``first_channel``: None, every connection subscribes to channel ``ch``; else the
    connections subscribe to ``ch<first_channel>``, ``ch<first_channel + 1>``, ... one each."""
    raise_nofile()
    identify = json.dumps({"heartbeat_interval": heartbeat_ms, "client_id": "bench", "hostname": "bench"}).encode()

    def hello(i):
        channel = "ch" if first_channel is None else "ch%d" % (first_channel + i)
        return (
            b"  V2"
            + b"IDENTIFY\n" + struct.pack(">i", len(identify)) + identify
            + ("SUB %s %s\n" % (IDLE_TOPIC, channel)).encode()
            + b"RDY 1\n"
        )
    sel = selectors.DefaultSelector()
    state = {}  # sock -> [buffer, OKs seen]
    subscribed = 0
    errors = 0
    opened = 0

    def on_readable(sock):
        nonlocal subscribed, errors
        st = state[sock]
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            errors += 1
            sel.unregister(sock)
            del state[sock]
            sock.close()
            return
        buf = st[0] + data
        while len(buf) >= 8:
            size, ftype = struct.unpack(">ii", buf[:8])
            if len(buf) < 4 + size:
                break
            body = buf[8 : 4 + size]
            buf = buf[4 + size :]
            if ftype == 0 and body == HEARTBEAT:
                try:
                    sock.sendall(b"NOP\n")
                except OSError:
                    pass  # the broker closed it: the next recv says so
            elif ftype == 0 and body == b"OK":
                st[1] += 1
                if st[1] == 2:
                    subscribed += 1
            elif ftype == 1:
                errors += 1
        st[0] = buf

    # Open in small batches: the broker's listen backlog is short.
    while opened < count:
        for _ in range(min(64, count - opened)):
            try:
                sock = socket.create_connection((host, port), timeout=30)
                sock.sendall(hello(opened))
            except OSError as e:
                errors += 1
                opened += 1
                if errors == 1:
                    print("connect failed: %s" % e, file=sys.stderr)
                continue
            sock.setblocking(False)
            state[sock] = [b"", 0]
            sel.register(sock, selectors.EVENT_READ)
            opened += 1
        for key, _ in sel.select(0):
            on_readable(key.fileobj)
    deadline = time.monotonic() + 120
    while subscribed + errors < count and time.monotonic() < deadline:
        for key, _ in sel.select(1.0):
            on_readable(key.fileobj)
    report.send(("subscribed", subscribed, errors))
    # Serve heartbeats until told to close.
    while True:
        if control.poll(0):
            break
        for key, _ in sel.select(0.2):
            on_readable(key.fileobj)
    control.recv()
    for sock in list(state):
        try:
            sock.close()
        except OSError:
            pass
    report.send(("closed", len(state)))


# -- measurements ---------------------------------------------------------------


def http_get(address, path, timeout=60.0):
    conn = http.client.HTTPConnection(address[0], address[1], timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def client_count(http_address):
    """The idle topic's clients, over all its channels."""
    status, body = http_get(http_address, "/stats?format=json&topic=%s&include_clients=false" % IDLE_TOPIC)
    doc = json.loads(body)
    return sum(c["client_count"] for t in doc.get("topics") or [] for c in t["channels"] or [])


def wait_clients(http_address, want, timeout, poll=0.1):
    """Poll /stats until the idle channel has ``want`` clients; the last count (None: no answer)."""
    deadline = time.monotonic() + timeout
    n = None
    while time.monotonic() < deadline:
        try:
            n = client_count(http_address)
        except OSError:  # a stalled broker: keep asking until the deadline
            n = None
            continue
        if n == want:
            return n
        time.sleep(poll)
    return n


class Pinger(threading.Thread):
    """Measures /ping latency (fresh connection each time, as a health check does) until stopped."""

    def __init__(self, http_address, interval=0.01):
        super().__init__(name="bench-pinger", daemon=True)
        self.http_address = http_address
        self.interval = interval
        self.latencies = []
        self.failures = 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            t0 = time.perf_counter()
            try:
                status, _ = http_get(self.http_address, "/ping", timeout=120)
                if status != 200:
                    self.failures += 1
            except OSError:
                self.failures += 1
            self.latencies.append(time.perf_counter() - t0)
            self._stop_event.wait(self.interval)

    def stop(self):
        self._stop_event.set()
        self.join()


def read_frame(sock):
    head = b""
    while len(head) < 8:
        chunk = sock.recv(8 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    size, ftype = struct.unpack(">ii", head)
    body = b""
    while len(body) < size - 4:
        chunk = sock.recv(size - 4 - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return ftype, body


def pub_latency(tcp_address, n):
    """PUB -> OK and PUB -> delivery latencies, one message at a time."""
    cons = socket.create_connection(tcp_address)
    cons.sendall(b"  V2" + ("SUB %s ch\n" % RT_TOPIC).encode())
    assert read_frame(cons) == (0, b"OK")
    cons.sendall(b"RDY 1\n")
    prod = socket.create_connection(tcp_address)
    prod.sendall(b"  V2")
    rtt, delivery = [], []
    for i in range(n):
        body = b"x" * 100
        t0 = time.perf_counter()
        prod.sendall(("PUB %s\n" % RT_TOPIC).encode() + struct.pack(">i", len(body)) + body)
        while True:
            ftype, data = read_frame(prod)
            if ftype == 0 and data == HEARTBEAT:
                prod.sendall(b"NOP\n")
                continue
            break
        rtt.append(time.perf_counter() - t0)
        while True:
            ftype, data = read_frame(cons)
            if ftype == 2:
                break
            if data == HEARTBEAT:
                cons.sendall(b"NOP\n")
        delivery.append(time.perf_counter() - t0)
        cons.sendall(b"FIN " + data[10:26] + b"\n")
    prod.close()
    cons.close()
    return rtt, delivery


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(seconds):
    return "%.1f ms" % (seconds * 1e3)


FIGURES = [
    ("connections held", "connections_held", "%d"),
    ("open errors", "open_errors", "%d"),
    ("open time (all subscribed and held)", "open_seconds", "%.2f s"),
    ("  of which until every SUB's OK", "subscribed_seconds", "%.2f s"),
    ("broker CPU during open (user)", "open_cpu_user_s", "%.2f s"),
    ("broker CPU during open (system)", "open_cpu_sys_s", "%.2f s"),
    ("broker RSS before", "rss_before_mb", "%.1f MB"),
    ("broker RSS holding", "rss_held_mb", "%.1f MB"),
    ("RSS per connection", "rss_per_connection_kb", "%.1f KB"),
    ("broker threads", "broker_threads", "%d"),
    ("/stats (JSON, clients) median", "stats_median_ms", "%.0f ms"),
    ("/stats max", "stats_max_ms", "%.0f ms"),
    ("/stats size", "stats_bytes", "%d bytes"),
    ("PUB->OK p50", "pub_ok_p50_ms", "%.2f ms"),
    ("PUB->OK p99", "pub_ok_p99_ms", "%.2f ms"),
    ("PUB->OK max", "pub_ok_max_ms", "%.2f ms"),
    ("PUB->delivery p50", "pub_delivery_p50_ms", "%.2f ms"),
    ("PUB->delivery p99", "pub_delivery_p99_ms", "%.2f ms"),
    ("mass close (all clients removed)", "mass_close_seconds", "%.2f s"),
    ("  of which until every worker had closed", "closed_seconds", "%.2f s"),
    ("clients left", "clients_left_after_close", "%d"),
    ("broker CPU during close (user)", "close_cpu_user_s", "%.2f s"),
    ("broker CPU during close (system)", "close_cpu_sys_s", "%.2f s"),
    ("/ping max during close", "ping_max_ms", "%.1f ms"),
    ("/ping p99 during close", "ping_p99_ms", "%.1f ms"),
    ("/ping count", "ping_count", "%d"),
    ("/ping failures", "ping_failures", "%d"),
    ("broker RSS after close", "rss_after_close_mb", "%.1f MB"),
    ("broker threads after close", "broker_threads_after", "%d"),
]


def start_profiler(command, pid):
    """``command`` (with ``{pid}``) started 1 s ahead of what it profiles, or None."""
    if not (command and pid):
        return None
    import shlex
    import subprocess

    profiler = subprocess.Popen(
        shlex.split(command.format(pid=pid)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(1.0)  # the profiler attaches (a measurement aid, not a wait for an event)
    return profiler


def measure(a, tcp_address, http_address, pid):
    """One run against a listening broker: the figures (a dict keyed as FIGURES)."""
    figures = {"connections_asked": a.connections}
    # Create the topics first so their fixed cost is not counted per connection.
    http_get(http_address, "/topic/create?topic=%s" % IDLE_TOPIC)
    if not a.channel_per_connection:
        http_get(http_address, "/channel/create?topic=%s&channel=ch" % IDLE_TOPIC)
    http_get(http_address, "/topic/create?topic=%s" % RT_TOPIC)
    pub_latency(tcp_address, 20)  # warm up
    rss_before = rss(pid) if pid else None
    threads_before = threads_of(pid) if pid else None

    opening_profiler = start_profiler(a.profile_open, pid)
    open_cpu0 = cpu_seconds(pid) if pid else None
    ctx = multiprocessing.get_context("fork")
    workers = []
    per = [a.connections // a.workers + (1 if i < a.connections % a.workers else 0) for i in range(a.workers)]
    t0 = time.perf_counter()
    first = 0
    for n in per:
        control_r, control_w = ctx.Pipe(duplex=False)
        report_r, report_w = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=consumer_worker,
            args=(tcp_address[0], tcp_address[1], n, a.heartbeat_ms, control_r, report_w,
                  first if a.channel_per_connection else None),
        )
        p.start()
        workers.append((p, control_w, report_r))
        first += n
    try:
        subscribed = errors = 0
        for _, _, report in workers:
            _, s, e = report.recv()
            subscribed += s
            errors += e
        figures["subscribed_seconds"] = time.perf_counter() - t0
        held = wait_clients(http_address, subscribed, 60, poll=0.02)
        figures["open_seconds"] = time.perf_counter() - t0
        if pid:
            open_cpu1 = cpu_seconds(pid)
            figures["open_cpu_user_s"] = open_cpu1[0] - open_cpu0[0]
            figures["open_cpu_sys_s"] = open_cpu1[1] - open_cpu0[1]
        if opening_profiler is not None:
            opening_profiler.wait()
        figures["connections_held"] = held
        figures["open_errors"] = errors
        if pid:
            time.sleep(1.0)  # let the allocator settle (a measurement, not a wait for an event)
            rss_held = rss(pid)
            figures["rss_before_mb"] = rss_before / 1e6
            figures["rss_held_mb"] = rss_held / 1e6
            figures["rss_per_connection_kb"] = (rss_held - rss_before) / max(1, held or 0) / 1024
            figures["broker_threads"] = threads_of(pid)
            figures["broker_threads_before"] = threads_before

        stats_times = []
        for _ in range(a.stats_runs):
            t = time.perf_counter()
            status, body = http_get(http_address, "/stats?format=json")
            stats_times.append(time.perf_counter() - t)
        figures["stats_bytes"] = len(body)
        figures["stats_median_ms"] = statistics.median(stats_times) * 1e3
        figures["stats_max_ms"] = max(stats_times) * 1e3

        rtt, delivery = pub_latency(tcp_address, a.pubs)
        figures["pub_ok_p50_ms"] = pct(rtt, 0.5) * 1e3
        figures["pub_ok_p99_ms"] = pct(rtt, 0.99) * 1e3
        figures["pub_ok_max_ms"] = max(rtt) * 1e3
        figures["pub_delivery_p50_ms"] = pct(delivery, 0.5) * 1e3
        figures["pub_delivery_p99_ms"] = pct(delivery, 0.99) * 1e3

        pinger = Pinger(http_address)
        pinger.start()
        time.sleep(0.3)  # a few baseline pings
        profiler = start_profiler(a.profile_close, pid)
        cpu0 = cpu_seconds(pid) if pid else None
        t0 = time.perf_counter()
        open("/work/tmp/closelog", "a").write("T0 %.3f\n" % time.time())
        for _, control, _ in workers:
            control.send("close")
        for _, _, report in workers:
            report.recv()
        figures["closed_seconds"] = time.perf_counter() - t0
        open("/work/tmp/closelog", "a").write("CLOSED %.3f\n" % time.time())
        remaining = wait_clients(http_address, 0, 300, poll=0.02)
        figures["mass_close_seconds"] = time.perf_counter() - t0
        open("/work/tmp/closelog", "a").write("TEND %.3f\n" % time.time())
        figures["clients_left_after_close"] = -1 if remaining is None else remaining
        if pid:
            cpu1 = cpu_seconds(pid)
            figures["close_cpu_user_s"] = cpu1[0] - cpu0[0]
            figures["close_cpu_sys_s"] = cpu1[1] - cpu0[1]
        if profiler is not None:
            profiler.wait()
        time.sleep(0.3)
        pinger.stop()
        figures["ping_count"] = len(pinger.latencies)
        figures["ping_max_ms"] = max(pinger.latencies) * 1e3 if pinger.latencies else float("nan")
        figures["ping_p99_ms"] = pct(pinger.latencies, 0.99) * 1e3 if pinger.latencies else float("nan")
        figures["ping_failures"] = pinger.failures
        for p, _, _ in workers:
            p.join()
        if pid:
            time.sleep(a.settle)  # memory is returned asynchronously (thread exits, allocator trim)
            figures["rss_after_close_mb"] = rss(pid) / 1e6
            figures["broker_threads_after"] = threads_of(pid)
    except BaseException:
        print("figures so far: %s" % json.dumps(figures), file=sys.stderr)
        for p, control, _ in workers:
            if p.is_alive():
                p.terminate()
        raise
    return figures


def measure_started(a, command=None, env=None):
    """Start a broker (ours, or ``command``: Go's nsqd), measure it, stop it."""
    from nsqd_threaded.testing import BrokerProcess

    broker = BrokerProcess(command=command, stop_timeout=60, start_timeout=30, env=env).start()
    try:
        return measure(a, broker.tcp_address, broker.http_address, broker.pid)
    except BaseException:
        print("broker running: %s; its log ends:\n%s" % (broker.running, broker.log[-3000:]), file=sys.stderr)
        raise
    finally:
        broker.stop()


def print_figures(columns):
    """``columns``: ``[(heading, [figures of each round])]``; one round: its figures, else medians."""
    print("%-38s" % "" + "".join("%16s" % heading for heading, _ in columns))
    for label, key, fmt in FIGURES:
        cells = []
        for _, rounds in columns:
            values = [f[key] for f in rounds if key in f]
            cells.append(fmt % statistics.median(values) if values else "-")
        if any(c != "-" for c in cells):
            print("%-38s" % label + "".join("%16s" % c for c in cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=4, help="processes opening the connections")
    ap.add_argument("--heartbeat-ms", type=int, default=5000, help="IDENTIFY heartbeat_interval")
    ap.add_argument("--pubs", type=int, default=500, help="PUBs for the latency figures")
    ap.add_argument("--stats-runs", type=int, default=5)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before reading RSS after the close")
    ap.add_argument("--channel-per-connection", action="store_true",
                    help="each connection subscribes to a new channel of its own (ch0 .. chN-1)")
    ap.add_argument("--go", metavar="PATH_TO_GO_NSQD", help="also Go's nsqd, alternately with ours")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each broker (alternately); medians printed")
    ap.add_argument("--nsqd-tcp-address", help="use this broker (host:port) instead of starting one")
    ap.add_argument("--nsqd-http-address", help="its HTTP address (host:port)")
    ap.add_argument("--pid", type=int, help="the given broker's pid, for RSS figures")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    ap.add_argument("--broker-env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment of the started broker (e.g. MALLOC_ARENA_MAX=2); repeatable")
    ap.add_argument("--profile-close", metavar="COMMAND",
                    help="a profiler command started 1 s before the mass close and waited for after it, {pid} "
                         "being the broker's, e.g. 'perf record -a -g -o close.{pid}.perf -- sleep 4' (then "
                         "perf report --pid {pid}; perf -p fails on thousands of threads) or "
                         "'py-spy record --gil -d 4 -f raw -o close.txt --pid {pid}' (few samples with "
                         "thousands of threads)")
    ap.add_argument("--profile-open", metavar="COMMAND",
                    help="as --profile-close, started 1 s before the connections open and waited for once held")
    a = ap.parse_args()

    nofile = raise_nofile()
    if a.connections + 100 > nofile:
        print("warning: open-file limit %d is below --connections" % nofile, file=sys.stderr)
    print("load average %.2f %.2f %.2f, %d CPUs; %d connections, %s" % (
        os.getloadavg() + (os.cpu_count(), a.connections,
                           "a channel each" if a.channel_per_connection else "one channel")))

    if a.nsqd_tcp_address:
        if a.go:
            ap.error("--go starts its own brokers: not with --nsqd-tcp-address")
        host, port = a.nsqd_tcp_address.rsplit(":", 1)
        tcp_address = (host, int(port))
        if not a.nsqd_http_address:
            ap.error("--nsqd-http-address is required with --nsqd-tcp-address")
        host, port = a.nsqd_http_address.rsplit(":", 1)
        http_address = (host, int(port))
        runs = {"broker": [measure(a, tcp_address, http_address, a.pid) for _ in range(a.rounds)]}
    else:
        env = dict(os.environ)
        env.update(kv.split("=", 1) for kv in a.broker_env)
        runs = {"ours": []}
        if a.go:
            runs["go"] = []
        for r in range(a.rounds):
            runs["ours"].append(measure_started(a, env=env))
            if a.go:
                runs["go"].append(measure_started(a, command=[a.go]))
            if a.rounds > 1:
                print("round %d: %s" % (r + 1, "; ".join(
                    "%s open %.2f s, mass close %.2f s, /ping max %.0f ms" % (
                        name, f[-1]["open_seconds"], f[-1]["mass_close_seconds"], f[-1]["ping_max_ms"])
                    for name, f in runs.items())), flush=True)
    if a.rounds > 1:
        print("\nmedians of %d rounds" % a.rounds)
    print_figures([(name, rounds) for name, rounds in runs.items()])
    if a.json:
        print(json.dumps(runs))


if __name__ == "__main__":
    main()
