#!/usr/bin/env python3
"""Bursts, many channels, many connections and host limits, against this broker and Go nsqd side by side.

    scripts/reliability.py [--go PATH_TO_GO_NSQD] [--rows a,b,...] [--quick]

Each row starts a fresh broker (ours: ``python -m nsqd_threaded``; Go: the
binary given with --go, skipped when absent) on 127.0.0.1 ephemeral ports in
a temp data dir, attacks it, and prints one line per broker.  --quick runs
every row at a tenth of its size.  The figures and how to read them are in
docs/reliability.md.  Standalone on purpose: the standard library only.
"""

import argparse
import json
import os
import re
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")
MAGIC = b"  V2"


class Broker:
    """A broker process on ephemeral ports; its stderr kept (lines) for the log checks."""

    def __init__(self, kind, go_path=None, preexec_fn=None):
        self.kind = kind
        self.dir = tempfile.mkdtemp(prefix="reliability-")
        self.tcp = ("127.0.0.1", _free_port())
        self.http = ("127.0.0.1", _free_port())
        args = [
            "--tcp-address=%s:%d" % self.tcp, "--http-address=%s:%d" % self.http, "--data-path=%s" % self.dir,
        ]
        if kind == "go":
            argv = [go_path] + args
        else:
            argv = [sys.executable, "-m", "nsqd_threaded"] + args
        env = dict(os.environ, PYTHONPATH=REPO)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env, preexec_fn=preexec_fn)
        self._lock = threading.Lock()  # guards lines
        self.lines = 0
        self.tracebacks = 0
        self.text = []  # the first 200 lines
        self.first_accept_error = None  # the first line about a failed accept
        self._reader = threading.Thread(target=self._read, name="broker-log", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 20
        while not self._ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("%s broker did not start: %s" % (kind, "".join(self.text)))
            time.sleep(0.05)

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            with self._lock:
                self.lines += 1
                if "Traceback" in line or line.startswith("panic:"):
                    self.tracebacks += 1
                if len(self.text) < 200:
                    self.text.append(line)
                if self.first_accept_error is None and "accept" in line.lower():
                    self.first_accept_error = line

    def _ping(self):
        try:
            return http_get(self.http, "/ping", timeout=1.0)[0] == 200
        except OSError:
            return False

    def cpu(self):
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def threads(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            return int(re.search(r"Threads:\s+(\d+)", f.read()).group(1))

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signal, wait; seconds it took to exit."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        took = time.monotonic() - started
        self._reader.join(timeout=10)
        subprocess.call(["rm", "-rf", self.dir])
        return took


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(address, path, timeout=5.0, method="GET"):
    with socket.create_connection(address, timeout=timeout) as s:
        s.sendall(("%s %s HTTP/1.0\r\nHost: x\r\n\r\n" % (method, path)).encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def stats(address):
    return json.loads(http_get(address, "/stats?format=json", timeout=30)[1])


def stats_clients(address):
    doc = stats(address)
    doc = doc.get("data", doc)  # Go 1.3 answers {"version":..,"topics":..} without the V1 envelope
    return sum(len(c["clients"]) for t in doc.get("topics") or [] for c in t.get("channels") or [])


# -- many clients in one thread -------------------------------------------------


class Clients:
    """``n`` non-blocking connections driven by one selector: each sends ``request`` once
    connected and is done when ``done(received_bytes)`` is true (or the peer closes)."""

    def __init__(self, address, n, request, done):
        self.sel = selectors.DefaultSelector()
        self.started = time.monotonic()
        self.socks = []
        self.state = {}
        self.finished = {}  # sock -> (seconds since start, received bytes, closed by the peer)
        self.done = done
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(address)
            self.socks.append(s)
            self.state[s] = [request, b""]
            self.sel.register(s, selectors.EVENT_WRITE)

    def run(self, timeout):
        deadline = time.monotonic() + timeout
        while len(self.finished) < len(self.socks) and time.monotonic() < deadline:
            for key, events in self.sel.select(max(0.0, deadline - time.monotonic())):
                s = key.fileobj
                st = self.state[s]
                try:
                    if events & selectors.EVENT_WRITE:
                        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                            self._finish(s, True)
                            continue
                        n = s.send(st[0])
                        st[0] = st[0][n:]
                        if not st[0]:
                            self.sel.modify(s, selectors.EVENT_READ)
                    else:
                        chunk = s.recv(65536)
                        if not chunk:
                            self._finish(s, True)
                            continue
                        st[1] += chunk
                        if self.done(st[1]):
                            self._finish(s, False)
                except OSError:
                    self._finish(s, True)
        return self

    def _finish(self, s, closed):
        self.finished[s] = (time.monotonic() - self.started, self.state[s][1], closed)
        self.sel.unregister(s)

    def close(self):
        for s in self.socks:
            s.close()
        self.sel.close()


def _frame_done(data):
    return len(data) >= 4 and len(data) >= 4 + struct.unpack(">i", data[:4])[0]


def _http_done(data):
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    return m is None or len(body) >= int(m.group(1))


# -- the rows ---------------------------------------------------------------------


def row_http_burst(broker, scale):
    """500 clients connect to the HTTP port at once, GET /ping: how many wait >= 1 s."""
    n = int(500 * scale)
    c = Clients(broker.http, n, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n", _http_done).run(60)
    times = [t for t, data, closed in c.finished.values() if not closed and b" 200 " in data[:20]]
    c.close()
    slow = sum(1 for t in times if t >= 1.0)
    return "%d clients: %d answered, %d waited >= 1 s, max %.2f s" % (n, len(times), slow, max(times or [0]))


def _deflate_flood(address, stop, counter):
    sock = socket.create_connection(address, timeout=10)
    sock.sendall(MAGIC)
    body = json.dumps({"feature_negotiation": True, "deflate": True, "deflate_level": 6}).encode()
    sock.sendall(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    got = b""
    while not _frame_done(got):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the IDENTIFY answer: %r" % got)
        got += chunk
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = b"NOP\n" * (1 << 18)
    try:
        while not stop.is_set():
            data = comp.compress(block) + comp.flush(zlib.Z_SYNC_FLUSH)
            sock.sendall(data)
            counter[0] += len(data)
            counter[1] += len(block)
    except OSError:
        pass
    sock.close()


def row_sigterm_deflate(broker, scale):
    """SIGTERM while a client streams deflate-compressed NOPs: seconds to exit."""
    stop = threading.Event()
    counter = [0, 0]
    t = threading.Thread(target=_deflate_flood, args=(broker.tcp, stop, counter), name="flood")
    t.start()
    deadline = time.monotonic() + 30
    while counter[0] < 190000 * scale and time.monotonic() < deadline:
        time.sleep(0.01)
    took = broker.stop()
    stop.set()
    t.join()
    return "SIGTERM after %d KB sent (%d MB of NOPs): exited in %.2f s" % (
        counter[0] // 1000, counter[1] // 1000000, took)


def row_idle_channels(broker, scale):
    """5,000 idle channels (50 topics x 100): CPU while idle."""
    topics, per = 50, max(1, int(100 * scale))

    def create(t):
        http_get(broker.http, "/topic/create?topic=t%d" % t, method="POST")
        for c in range(per):
            http_get(broker.http, "/channel/create?topic=t%d&channel=c%d" % (t, c), method="POST", timeout=60)

    creators = [threading.Thread(target=create, args=(t,), name="create-%d" % t) for t in range(topics)]
    for c in creators:
        c.start()
    for c in creators:
        c.join()
    # Idle means settled: nsqd.dat unchanged for 3 s (Go persists it from a goroutine per change,
    # and those run on after the creations are answered).
    dat = os.path.join(broker.dir, "nsqd.dat")
    last, since, deadline = None, time.monotonic(), time.monotonic() + 300
    while time.monotonic() - since < 3 and time.monotonic() < deadline:
        try:
            st = os.stat(dat)
            mark = (st.st_mtime_ns, st.st_ino, st.st_size)
        except OSError:
            mark = None
        if mark != last:
            last, since = mark, time.monotonic()
        time.sleep(0.1)
    before, started = broker.cpu(), time.monotonic()
    time.sleep(10)
    used = (broker.cpu() - before) / (time.monotonic() - started)
    return "%d channels idle: %.1f %% of a core" % (topics * per, 100 * used)


def row_sub_new_channels(broker, scale):
    """5,000 consumers SUB to 5,000 new channels of one topic; then all disconnect."""
    n = int(5000 * scale)
    http_get(broker.http, "/topic/create?topic=t", method="POST")
    # Each connection sends its SUB as soon as it is connected.
    c = Clients(broker.tcp, 0, b"", _frame_done)
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(broker.tcp)
        c.socks.append(s)
        c.state[s] = [MAGIC + b"SUB t c%d\n" % i, b""]
        c.sel.register(s, selectors.EVENT_WRITE)
    c.started = time.monotonic()
    c.run(120)
    took = max([t for t, _, _ in c.finished.values()] or [0])
    ok = sum(1 for _, data, closed in c.finished.values() if data[8:10] == b"OK")
    time.sleep(1)
    started = time.monotonic()
    c.close()
    while stats_clients(broker.http) and time.monotonic() - started < 120:
        time.sleep(0.02)
    gone = time.monotonic() - started
    return "%d SUBs: %d OK in %.2f s; all disconnected: /stats empty after %.2f s" % (n, ok, took, gone)


def row_http_keepalive(broker, scale):
    """2,000 HTTP/1.1 keep-alive clients each GET /ping and stay: time to answer all, threads."""
    n = int(2000 * scale)
    c = Clients(broker.http, n, b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n", _http_done).run(60)
    times = [t for t, data, closed in c.finished.values() if not closed and b" 200 " in data[:20]]
    time.sleep(1)
    threads = broker.threads()
    c.close()
    return "%d clients: %d answered, all within %.2f s; %d threads while they stay" % (
        n, len(times), max(times or [0]), threads)


def _nofile(n):
    def preexec():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return preexec


def row_nofile(broker, scale):
    """128 open files allowed, 300 clients connect: CPU, log lines, served again after."""
    n = int(300 * scale) if scale < 1 else 300
    socks = []
    for _ in range(n):
        s = socket.create_connection(broker.tcp, timeout=10)
        s.sendall(MAGIC)
        socks.append(s)
    time.sleep(1)
    lines0 = broker.lines
    before, started = broker.cpu(), time.monotonic()
    time.sleep(5)
    cpu = (broker.cpu() - before) / (time.monotonic() - started)
    lines = broker.lines - lines0
    for s in socks:
        s.close()
    started = time.monotonic()
    while not broker._ping() and time.monotonic() - started < 30:
        time.sleep(0.05)
    again = time.monotonic() - started
    reason = (broker.first_accept_error or "(no accept error logged)").strip()
    return "%d clients: %.0f %% CPU, %d log lines in 5 s, /ping again %.2f s after they left; first: %s" % (
        n, 100 * cpu, lines, again, reason[:160])


def _pids_cgroup(limit):
    root = "/sys/fs/cgroup/pids"
    if not os.path.exists(os.path.join(root, "cgroup.procs")):
        return None
    path = os.path.join(root, "reliability-%s" % uuid.uuid4().hex[:8])
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(limit))
    except OSError:
        return None
    return path


def row_tasks(broker, scale):
    """200 tasks allowed, 300 consumers SUB: subscribed, refused, tracebacks."""
    n = 300
    http_get(broker.http, "/topic/create?topic=t", method="POST")
    c = Clients(broker.tcp, n, MAGIC + b"SUB t c\n", _frame_done).run(60)
    ok = sum(1 for _, data, closed in c.finished.values() if data[8:10] == b"OK")
    refused = n - ok
    errors = {}
    for _, data, closed in c.finished.values():
        if data[8:10] != b"OK":
            key = data[8:60].decode("latin-1") if data else "closed"
            errors[key] = errors.get(key, 0) + 1
    time.sleep(1)
    c.close()
    return "%d SUBs: %d subscribed, %d refused %s, %d tracebacks" % (n, ok, refused, errors, broker.tracebacks)


ROWS = [
    ("http_burst", row_http_burst, {}),
    ("sigterm_deflate", row_sigterm_deflate, {}),
    ("idle_channels", row_idle_channels, {}),
    ("sub_new_channels", row_sub_new_channels, {}),
    ("http_keepalive", row_http_keepalive, {}),
    ("nofile", row_nofile, {"nofile": 128}),
    ("tasks", row_tasks, {"tasks": 200}),
]


def run_row(name, fn, limits, kind, go_path, scale):
    cgroup = None
    preexec = None
    if "nofile" in limits:
        preexec = _nofile(limits["nofile"])
    if "tasks" in limits:
        cgroup = _pids_cgroup(limits["tasks"])
        if cgroup is None:
            return "skipped (no pids cgroup can be made here)"

        def preexec():
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write("0")
    broker = Broker(kind, go_path, preexec)
    try:
        return fn(broker, scale)
    finally:
        if broker.proc.poll() is None:
            broker.stop(signal.SIGKILL)
        if cgroup is not None:
            for _ in range(100):
                try:
                    os.rmdir(cgroup)
                    break
                except OSError:
                    time.sleep(0.1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--go", default=os.path.join(os.path.dirname(REPO), "shared", "reference", "go-nsq-1.3.0", "nsqd"),
                    help="Go nsqd binary (default: the reference tree beside this repository)")
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    ap.add_argument("--quick", action="store_true", help="every row at a tenth of its size")
    ap.add_argument("--only", choices=["ours", "go"], help="one broker only")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    wanted = set(filter(None, args.rows.split(",")))
    kinds = ["ours"]
    if os.path.exists(args.go):
        kinds.append("go")
    else:
        print("# Go nsqd not found at %s: ours only" % args.go)
    if args.only:
        kinds = [k for k in kinds if k == args.only]
    scale = 0.1 if args.quick else 1.0
    print("# load average before: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    for name, fn, limits in ROWS:
        if wanted and name not in wanted:
            continue
        for kind in kinds:
            try:
                result = run_row(name, fn, limits, kind, args.go, scale)
            except Exception as e:
                result = "failed: %r" % e
            print("%-17s %-4s %s" % (name, kind, result), flush=True)
    print("# load average after: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))


if __name__ == "__main__":
    main()
