"""Many consumers on one channel, as NSQ is deployed: each at a small RDY, FIN on receipt.

For each ``--consumers`` count, each broker in turn (ours; ``--go`` Go's nsqd; ``--baseline`` ours
from another tree; ``--threads`` ours with ``--connection-threads``; ``--floor`` the floor probe),
alternately for ``--rounds``:

1. client processes (``--clients``) open the consumers: magic, IDENTIFY, SUB, RDY; the time until
   the last has both OKs (*subscribe all*, as the clients stamp it; the broker's /stats, the floor's
   COUNT, then shows them all), then the broker's threads, RSS and CPU over three idle seconds;
2. ``--messages`` messages are MPUBed (200 a command) from one more connection, and every consumer
   FINs each message as it arrives: the time from the first MPUB until the clients have every
   message is the *rate*, and the broker's CPU time over that span per message its cost; beside
   it the load clients' CPU per message, and the cores the whole host kept busy meanwhile
   (*host cores busy*: on two cores, 2.00 means none sat idle);
3. the consumers close together: the time until /stats (COUNT) shows none (*gone after close*).

The load clients answer heartbeats and FIN from non-blocking sockets; ``--clients`` more processes
show whether they are the limit (Go's rate rises with them until the broker is).

``--instructions`` runs ours, the baseline and the floor once more, each under callgrind, and
counts the instructions each executes per subscribed consumer over step 1 and per message over
step 2 (``--instruction-messages``): figures the same on any host and whatever else it runs, unlike
the rate and the CPU time (not Go's: its runtime crashes under valgrind).  But not quite: valgrind
runs the broker some fifty times slower, and with thousands of consumers the heartbeats that come
due meanwhile are counted too, the more the slower the host (run it on a quiet one).  ``--rounds 0 --instructions`` counts alone.  The context
switches per message (voluntary, over the broker's threads) travel between hosts too.

``--floor`` adds the column ``floor``: ``floor.py serve-consumers`` under ``--python``, one thread
with epoll that only parses, deals messages in turn to the consumers with credit and sends (no
in-flight index, timeouts or stats), the least any single-process Python broker could cost per
message in this shape.  It has no HTTP /stats: the same TCP port answers ``COUNT`` (not NSQ's)
with the subscribed connections it holds, polled where /stats is for the others and meaning the
same (see ``client_count``).  Its threads, RSS and CPU come from /proc, as the others'.

    scripts/bench consumers --consumers 100,1000,5000 --go ../shared/reference/go-nsq-1.3.0/nsqd
    scripts/bench consumers --consumers 1000 --rdy 10 --threads --rounds 3
    scripts/bench consumers --consumers 1000 --floor --rounds 3
    scripts/bench consumers --consumers 100 --go GO_NSQD --flag=--mem-queue-size=1000000 --rounds 3
    scripts/bench consumers --consumers 100,5000 --floor --baseline TREE --rounds 0 --instructions
"""

import argparse
import json
import multiprocessing
import os
import re
import selectors
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time

from .common import BrokerProc, Quiet, cpu_seconds, host_busy_seconds
from .connections import raise_nofile, rss, threads_of
from .work import Counters, control

TOPIC = "bench_consumers"
CHANNEL = "ch"
HEARTBEAT = b"_heartbeat_"
IDLE_SECONDS = 3.0  # the idle CPU figure's span, consumers subscribed and nothing published


def consumer_process(address, count, rdy, received, subscribed, control, subscribed_at=None):
    """Open ``count`` consumers; FIN every message; count them in ``received``; close on "close".

    ``subscribed`` counts the consumers with both OKs (IDENTIFY's and SUB's); ``subscribed_at``
    (a Value without a lock of its own, written under ``subscribed``'s) is when the last of them
    came, on the monotonic clock every process shares: the parent polls slowly and still times
    *subscribe all* exactly (a fine poll is a process waking a thousand times a second beside the
    broker, which moved the figure it measured).
    """
    raise_nofile()
    identify = json.dumps({"heartbeat_interval": 30000, "client_id": "bench", "hostname": "bench"}).encode()
    hello = (b"  V2IDENTIFY\n" + struct.pack(">i", len(identify)) + identify
             + ("SUB %s %s\nRDY %d\n" % (TOPIC, CHANNEL, rdy)).encode())
    sel = selectors.DefaultSelector()
    buffers = {}
    oks = {}
    for i in range(count):
        sock = socket.create_connection(address, timeout=60)
        sock.sendall(hello)
        sock.setblocking(False)
        buffers[sock] = b""
        oks[sock] = 0
        sel.register(sock, selectors.EVENT_READ)
        if i % 64 == 63:
            for key, _ in sel.select(0):
                _serve(key.fileobj, buffers, oks, received, subscribed, subscribed_at)
    while True:
        if control.poll(0):
            control.recv()
            break
        for key, _ in sel.select(0.05):
            _serve(key.fileobj, buffers, oks, received, subscribed, subscribed_at)
    for sock in buffers:
        sock.close()
    control.send("closed")


def _serve(sock, buffers, oks, received, subscribed, subscribed_at=None):
    try:
        data = sock.recv(262144)
    except BlockingIOError:
        return
    except OSError:
        data = b""
    if not data:
        return
    buf = buffers[sock] + data
    out = []
    got = 0
    pos = 0
    while len(buf) - pos >= 8:
        size, ftype = struct.unpack_from(">ii", buf, pos)
        if len(buf) - pos < 4 + size:
            break
        if ftype == 2:
            out.append(b"FIN " + buf[pos + 18 : pos + 34] + b"\n")
            got += 1
        elif ftype == 0:
            body = buf[pos + 8 : pos + 4 + size]
            if body == HEARTBEAT:
                out.append(b"NOP\n")
            elif body == b"OK" or body.startswith(b"{"):
                oks[sock] += 1
                if oks[sock] == 2:
                    with subscribed.get_lock():
                        subscribed.value += 1
                        if subscribed_at is not None:
                            subscribed_at.value = time.monotonic()  # (under the lock: the last is the latest)
        pos += 4 + size
    buffers[sock] = buf[pos:]
    if out:
        try:
            sock.sendall(b"".join(out))
        except OSError:
            pass
    if got:
        with received.get_lock():
            received.value += got


def client_count(broker):
    """The consumers the broker holds on the channel, from /stats.

    The floor (no HTTP) counts them itself: a connection counts from when it handled its SUB,
    before it answers the OK, until it saw the connection close, as /stats counts for the others.
    So once every load client has both OKs (IDENTIFY's and SUB's, *subscribe all*) the broker
    counts every consumer; *gone after close* is until it counts none.
    """
    if broker.http_address is None:
        return floor_count(broker.address)
    t = broker.stats(TOPIC)
    return sum(c["client_count"] for c in (t or {}).get("channels") or [])


def floor_count(address):
    """The floor's ``COUNT`` (benchmarks/floor.py ``serve-consumers``), on a connection of its own,
    as each /stats poll is an HTTP request of its own."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"  V2COUNT\n")
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = sock.recv(4096)
            if not chunk:
                raise RuntimeError("the floor closed the COUNT connection")
            data += chunk
    return int(data[8:])  # after the size and the frame type (0, a response)


def wait(predicate, timeout, poll=0.01):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)  # (polling a counter or /stats, bounded by the deadline)
    return True


def run_once(broker, consumers, clients, rdy, messages, callgrind_out=None):
    """One broker, one consumer count: the figures (a dict).

    ``callgrind_out``: the broker runs under callgrind, writing there; its counters are zeroed as
    the load clients start and dumped once every consumer is subscribed, zeroed again as the first
    MPUB goes out and dumped once every message has arrived, and the figures are the
    ``instructions`` per message and ``sub_instructions`` per subscribed consumer alone (no idle
    span, no close)."""
    if broker.http_address is not None:  # (the floor has one channel, made by the first SUB)
        broker.http("POST", "/topic/create?topic=" + TOPIC)
        broker.http("POST", "/channel/create?topic=%s&channel=%s" % (TOPIC, CHANNEL))
    host, port = broker.address.rsplit(":", 1)
    address = (host, int(port))
    received = multiprocessing.Value("q", 0)
    subscribed = multiprocessing.Value("q", 0)
    subscribed_at = multiprocessing.Value("d", 0.0, lock=False)
    procs = []
    if callgrind_out:
        control(broker.pid, "--zero")
    start = time.monotonic()
    for i in range(clients):
        n = consumers // clients + (1 if i < consumers % clients else 0)
        parent, child = multiprocessing.Pipe()
        p = multiprocessing.Process(target=consumer_process,
                                    args=(address, n, rdy, received, subscribed, child, subscribed_at),
                                    daemon=True)
        p.start()
        procs.append((p, parent))
    figures = {}
    try:
        if not wait(lambda: subscribed.value >= consumers and client_count(broker) >= consumers, 300, 0.05):
            raise RuntimeError("only %d of %d consumers subscribed" % (subscribed.value, consumers))
        figures["subscribe_s"] = subscribed_at.value - start  # (the last OK, not the poll that saw it)
        if callgrind_out:
            control(broker.pid, "--dump")
            figures = {"sub_instructions": _dumped_instructions(callgrind_out + ".1") / consumers}
            figures.update(_count_instructions(broker, address, received, messages, callgrind_out))
            return figures
        figures["threads"] = threads_of(broker.pid)
        figures["rss_mb"] = rss(broker.pid) / 1e6
        idle0 = broker.cpu_seconds()
        time.sleep(IDLE_SECONDS)  # (measuring: the broker's CPU while every consumer waits)
        figures["idle_cpu_ms"] = (broker.cpu_seconds() - idle0) / IDLE_SECONDS * 1000
        counters0 = Counters(broker.pid)
        clients0 = sum(cpu_seconds(p.pid) for p, _ in procs)
        host0 = host_busy_seconds()
        user0, sys0 = broker.cpu_split()
        t0 = time.monotonic()
        _publish(address, received, messages)
        elapsed = time.monotonic() - t0
        user1, sys1 = broker.cpu_split()
        # (the cores the broker and its load clients kept busy: below the host's count, a core sat
        # idle while messages waited for another)
        figures["host_cores"] = (host_busy_seconds() - host0) / elapsed
        figures["clients_us"] = (sum(cpu_seconds(p.pid) for p, _ in procs) - clients0) / messages * 1e6
        cpu = (user1 - user0) + (sys1 - sys0)  # (each difference exact: an idle span is 0, not -5e-15)
        figures["sys_us"] = (sys1 - sys0) / messages * 1e6
        counters1 = Counters(broker.pid)
        figures["rate"] = messages / elapsed
        figures["cpu_us"] = cpu / messages * 1e6
        figures["switches"] = (counters1.switches - counters0.switches) / messages
        t1 = time.monotonic()
        for _, parent in procs:
            parent.send("close")
        for _, parent in procs:
            parent.recv()
        wait(lambda: client_count(broker) == 0, 120, 0.01)
        figures["gone_s"] = time.monotonic() - t1
    finally:
        for p, parent in procs:
            if p.is_alive():
                p.terminate()
            p.join(30)
    return figures


def _publish(address, received, messages):
    """MPUB ``messages`` (200 a command, each waiting for its OK) and wait until all arrived."""
    pub = socket.create_connection(address, timeout=60)
    try:
        pub.sendall(b"  V2")
        body = b"x" * 100
        batch = struct.pack(">i", 200) + (struct.pack(">i", len(body)) + body) * 200
        command = ("MPUB %s\n" % TOPIC).encode() + struct.pack(">i", len(batch)) + batch
        for _ in range(messages // 200):
            pub.sendall(command)
            _read_ok(pub)
        if not wait(lambda: received.value >= messages, 600, 0.002):
            raise RuntimeError("only %d of %d messages arrived" % (received.value, messages))
    finally:
        pub.close()


def _count_instructions(broker, address, received, messages, out):
    """Instructions per message of a broker under callgrind, over :func:`_publish` alone (its
    second dump: the first counted the subscribing)."""
    control(broker.pid, "--zero")
    _publish(address, received, messages)
    control(broker.pid, "--dump")
    return {"instructions": _dumped_instructions(out + ".2") / messages}


def _dumped_instructions(path):
    """The instructions a callgrind dump counted (it is written a moment after ``--dump``)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError("callgrind wrote no counts")
        time.sleep(0.05)  # polling for the dump, bounded by the deadline
    with open(path) as f:
        text = f.read()
    return int(re.search(r"^summary: (\d+)", text, re.M).group(1))


def _read_ok(sock):
    data = b""
    while True:
        while len(data) < 4:
            chunk = sock.recv(4096)
            if not chunk:
                raise RuntimeError("the broker closed the publisher")
            data += chunk
        size = struct.unpack(">i", data[:4])[0]
        while len(data) < 4 + size:
            data += sock.recv(4096)
        frame, data = data[4 : 4 + size], data[4 + size :]
        if frame[4:] == b"OK":
            return
        if frame[4:] != HEARTBEAT:
            raise RuntimeError("MPUB answered %r" % frame)


FIGURES = [
    ("subscribe all (s)", "subscribe_s", "%.2f"),
    ("delivered msg/s", "rate", "%.0f"),
    ("broker CPU us/msg", "cpu_us", "%.1f"),
    ("  of which kernel", "sys_us", "%.1f"),
    ("load clients us/msg", "clients_us", "%.1f"),
    ("host cores busy", "host_cores", "%.2f"),
    ("threads (subscribed)", "threads", "%d"),
    ("RSS MB (subscribed)", "rss_mb", "%.1f"),
    ("idle CPU ms/s", "idle_cpu_ms", "%.1f"),
    ("context switches/msg", "switches", "%.2f"),
    ("instructions/msg", "instructions", "%.0f"),
    ("instructions/subscribe", "sub_instructions", "%.0f"),
    ("gone after close (s)", "gone_s", "%.2f"),
]


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench consumers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--consumers", default="100,1000,5000", help="comma-separated consumer counts")
    ap.add_argument("--rdy", type=int, default=1, help="each consumer's RDY (go-nsq's and pynsq's default: 1)")
    ap.add_argument("--messages", type=int, default=20000, help="messages MPUBed per run (a multiple of 200)")
    ap.add_argument("--clients", default="2", help="load client processes (comma-separated: a column each)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each broker, alternately (medians)")
    ap.add_argument("--go", metavar="GO_NSQD", help="Go's nsqd binary, measured alternately with ours")
    ap.add_argument("--baseline", metavar="TREE", help="ours from another tree too (before/after a change)")
    ap.add_argument("--threads", action="store_true", help="ours with --connection-threads too")
    ap.add_argument("--floor", action="store_true",
                    help="the floor probe too (floor.py serve-consumers, under --python): one thread, epoll, "
                         "parsing and sending only: the least a Python broker costs per message here")
    ap.add_argument("--instructions", action="store_true",
                    help="one more run of ours, the baseline and the floor under callgrind (not Go's: its "
                         "runtime crashes under valgrind): instructions per message, whatever else the host runs")
    ap.add_argument("--instruction-messages", type=int, default=2000,
                    help="messages MPUBed in each callgrind run (a multiple of 200)")
    ap.add_argument("--keep", metavar="DIR", help="keep each callgrind profile there, for callgrind_annotate")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs our broker and the floor")
    ap.add_argument("--flag", action="append", default=[], metavar="FLAG",
                    help="an nsqd flag for every broker but the floor, such as --mem-queue-size=1000000 "
                         "(no backlog on disk); repeat for more")
    ap.add_argument("--max-load", type=float, default=1.0, help="refuse to start above this load average")
    ap.add_argument("--allow-load", action="store_true", help="run on a busy machine anyway")
    a = ap.parse_args()
    quiet = Quiet(max_load=a.max_load)
    if not quiet.start_is_quiet() and not a.allow_load:
        raise SystemExit("the machine is busy (load average %.2f): --allow-load to run anyway" % quiet.start_load)
    raise_nofile()
    flags = list(a.flag)
    brokers = [("ours", lambda **kw: BrokerProc("ours", a.python, flags, http=True, **kw))]
    if a.threads:
        brokers.append(("ours threads", lambda **kw: BrokerProc("ours", a.python, ["--connection-threads"] + flags,
                                                                 http=True, **kw)))
    if a.baseline:
        brokers.append(("baseline", lambda **kw: BrokerProc("ours", a.python, flags, root=os.path.abspath(a.baseline),
                                                            http=True, **kw)))
    if a.go:
        brokers.append(("go", lambda: BrokerProc("go", a.go, ["--max-rdy-count=2500"] + flags, http=True)))
    if a.floor:
        brokers.append(("floor", lambda **kw: BrokerProc("floor-consumers", a.python, **kw)))
    clients_list = [int(c) for c in a.clients.split(",")]
    print("load average %.2f, %d CPUs, RDY %d, %d messages, client processes %s" % (
        os.getloadavg()[0], os.cpu_count(), a.rdy, a.messages, a.clients), flush=True)
    for consumers in [int(c) for c in a.consumers.split(",")]:
        columns = [(name, clients, make) for clients in clients_list for name, make in brokers]
        results = {(name, clients): [] for name, clients, _ in columns}
        for r in range(a.rounds):
            for name, clients, make in columns:
                broker = make()
                try:
                    results[name, clients].append(run_once(broker, consumers, clients, a.rdy, a.messages))
                finally:
                    broker.stop()
                print("  %d consumers, %d clients, round %d, %s: %s" % (
                    consumers, clients, r + 1, name, results[name, clients][-1]), flush=True)
        if a.instructions:
            for name, clients, make in columns:
                if name == "go":
                    continue
                out = os.path.join(tempfile.mkdtemp(prefix="nsqd-bench-callgrind-"), "callgrind.out")
                broker = make(wrapper=["valgrind", "--tool=callgrind", "--compress-strings=no",
                                       "--callgrind-out-file=" + out])
                try:
                    counted = run_once(broker, consumers, clients, a.rdy, a.instruction_messages, out)
                    if a.keep:
                        os.makedirs(a.keep, exist_ok=True)
                        for dump, step in ((".1", "subscribe"), (".2", "deliver")):
                            shutil.copy(out + dump, os.path.join(a.keep, "callgrind.%s.%d.%s" % (
                                name.replace(" ", "-"), consumers, step)))
                finally:
                    broker.stop()
                    shutil.rmtree(os.path.dirname(out), ignore_errors=True)
                for f in results[name, clients]:
                    f.update(counted)
                if not results[name, clients]:
                    results[name, clients].append(dict(counted))
                print("  %d consumers, %d clients, callgrind, %s: %.0f instructions/msg, %.0f/subscribe" % (
                    consumers, clients, name, counted["instructions"], counted["sub_instructions"]), flush=True)
        print("\n%d consumers at RDY %d%s" % (consumers, a.rdy, " (medians of %d)" % a.rounds if a.rounds > 1 else ""))
        print("%-24s" % "" + "".join("%16s" % ("%s/%dc" % (name, clients) if len(clients_list) > 1 else name)
                                     for name, clients, _ in columns))
        for label, key, fmt in FIGURES:
            cells = []
            for name, clients, _ in columns:
                values = [f[key] for f in results[name, clients] if key in f]
                cells.append(fmt % statistics.median(values) if values else "-")
            if any(cell != "-" for cell in cells):
                print("%-24s" % label + "".join("%16s" % cell for cell in cells))
        print(flush=True)
    if not quiet.start_is_quiet():
        print("LOADED: the run started with the load average at %.2f: not a result" % quiet.start_load)


if __name__ == "__main__":
    main()
