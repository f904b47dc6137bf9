#!/usr/bin/env python3
"""A fault harness: an NSQ cluster across Linux network namespaces, faults injected, histories checked.

    scripts/faults.py --scenario producer_cut [--scenario ...] [--short] [--go DIR] [--report]
    scripts/faults.py --scenario all --short --go /path/to/go-nsq-1.3.0 --report

Needs root, ``ip`` (iproute2) and ``unshare``/``nsenter`` (util-linux).  Every
name it makes starts with ``nsqf-<pid>-`` (namespaces) and lives inside those
namespaces (links, addresses, routes); everything is removed at the end, on an
error, on Ctrl-C and on SIGTERM.  The hosts are namespaces joined by veth pairs
to a bridge that lives in a namespace of its own, addressed 10.200.0.0/24.

Every process runs inside its host's namespace through ``ip netns exec``:
nsqlookupd and nsqd (ours, ``python -m nsqd_threaded``, or Go's with ``--go``),
and the clients, which are this script in a client mode (``_producer``,
``_consumer``, ``_pynsq_consumer``, ``_watch``, ``_http``, ``_proxy``) writing a
JSON-lines history.
The checker reads the histories: acked messages never delivered (lost),
messages delivered more than once and why, and recovery times.  What each
scenario does and the figures are in docs/reliability.md ("Faults across a
network").  Standalone on purpose: the standard library and this package only.
"""

import argparse
import atexit
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBNET = "10.200.0."
LOOKUPD_TCP, LOOKUPD_HTTP = 4160, 4161
NSQD_TCP, NSQD_HTTP = 4150, 4151
PROXY_TCP = 4150  # the proxy takes the broker's advertised port; the broker then listens on 127.0.0.1
TOPIC, CHANNEL = "faults", "check"
HOST_ADDRESSES = {"l1": 2, "b1": 11, "b2": 12, "p1": 21, "c1": 31, "c2": 32}


def now():
    return time.time()


# -- histories -------------------------------------------------------------------


class History:
    """A JSON-lines file of events, each stamped with the wall clock (every host shares it).

    ``_lock`` guards the file: client threads write events concurrently."""

    def __init__(self, path):
        self._lock = threading.Lock()
        self._file = open(path, "a", buffering=1)

    def write(self, ev, **fields):
        fields["ev"] = ev
        fields.setdefault("t", now())
        line = json.dumps(fields, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self):
        with self._lock:
            self._file.close()


def read_history(path):
    """The events of a history file (a torn last line, from a killed writer, is skipped)."""
    events = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return events


# -- client modes (run inside a host's namespace) -----------------------------------


def _stop_event():
    """An Event set by SIGTERM/SIGINT, for the client modes' main loops."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def client_producer(args):
    """Publish ``--count`` messages (``<seq>`` bodies) at ``--rate`` per second, at most ``--window``
    unanswered, over ``--nsqd`` (failover); every answer goes to the history."""
    sys.path.insert(0, REPO)
    from nsqd_threaded.client import Producer

    history = History(args.history)
    stop = _stop_event()
    producer = Producer(args.nsqd.split(","), timeout=args.timeout,
                        identify={"heartbeat_interval": args.heartbeat_ms}, reconnect_backoff=(0.1, 1.0))
    window = threading.Semaphore(args.window)
    interval = 1.0 / args.rate
    history.write("start", role="producer", pid=os.getpid())
    seq = 0
    next_at = time.monotonic()
    outstanding = []
    lock = threading.Lock()  # guards outstanding

    def answered(seq, sent, dpub, future):
        error = future.exception()
        history.write("pub", seq=seq, ts=sent, ok=error is None, err=None if error is None else repr(error)[:200],
                      dpub=dpub)
        window.release()

    while seq < args.count and not stop.is_set():
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        next_at += interval
        if not window.acquire(timeout=1.0):
            next_at = time.monotonic()
            continue
        seq += 1
        body = "%d" % seq
        dpub = args.dpub_every and seq % args.dpub_every == 0
        sent = now()
        try:
            future = producer.dpub_async(TOPIC, 200, body) if dpub else producer.pub_async(TOPIC, body)
        except Exception as e:  # noqa: BLE001 - every failure is history
            history.write("pub", seq=seq, ts=sent, ok=False, err=repr(e)[:200])
            window.release()
            continue
        with lock:
            outstanding.append(future)
        future.add_done_callback(lambda f, s=seq, ts=sent, d=bool(dpub): answered(s, ts, d, f))
    # Wait for the answers still due (a cut connection is noticed after two heartbeats).
    deadline = time.monotonic() + args.timeout * 4
    with lock:
        pending = list(outstanding)
    for future in pending:
        try:
            future.exception(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - timed out: never answered
            pass
    history.write("done", sent=seq)
    producer.close(timeout=1.0)
    history.close()


def client_consumer(args):
    """Consume through lookupd (or ``--nsqd``), each message held ``--work-ms`` then FIN'd (or REQ'd,
    every ``--req-every``-th first attempt); deliveries and FINs go to the history until SIGTERM."""
    import logging

    sys.path.insert(0, REPO)
    from nsqd_threaded.client import Consumer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    history = History(args.history)
    stop = _stop_event()
    name = args.name

    def handle(message):
        seq = message.body[:20].decode("ascii", "replace")
        mid = message.id.decode("ascii", "replace")
        where = "%s:%d" % tuple(message.connection.address)
        history.write("msg", seq=seq, mid=mid, att=message.attempts, who=name, conn=where)
        if args.work_ms:
            time.sleep(args.work_ms / 1000.0)
        answer = "fin"
        if args.req_every and message.attempts == 1 and random.randrange(args.req_every) == 0:
            answer = "req"
        try:
            message.req(0) if answer == "req" else message.fin()
            history.write(answer, seq=seq, mid=mid, who=name, ok=True)
        except Exception as e:  # noqa: BLE001 - a FIN on a lost connection is history too
            history.write(answer, seq=seq, mid=mid, who=name, ok=False, err=repr(e)[:200])

    history.write("start", role="consumer", who=name, pid=os.getpid())
    consumer = Consumer(
        args.nsqd.split(",") if args.nsqd else None, TOPIC, CHANNEL, handle,
        max_in_flight=args.max_in_flight, concurrency=args.concurrency,
        lookupd_http_addresses=args.lookupd.split(",") if args.lookupd else None,
        lookupd_poll_interval=args.poll, identify={"heartbeat_interval": args.heartbeat_ms},
        reconnect_backoff=(0.1, 1.0), timeout=5.0, on_error=lambda e: history.write("error", err=repr(e)[:200]),
    )
    consumer.start(wait=False)
    stop.wait()
    consumer.close(timeout=3.0)
    history.write("done", who=name)
    history.close()


def client_watch(args):
    """Poll lookupd's ``/nodes`` every ``--interval`` seconds; each answer (or failure) to the history."""
    history = History(args.history)
    stop = _stop_event()
    while not stop.is_set():
        try:
            with urllib.request.urlopen(args.url, timeout=1.0) as r:
                doc = json.load(r)
            producers = doc.get("producers", (doc.get("data") or {}).get("producers", []))
            nodes = [{"addr": p.get("broadcast_address"), "remote": p.get("remote_address")} for p in producers]
            history.write("nodes", nodes=nodes)
        except (OSError, ValueError) as e:
            history.write("nodes_failed", err=repr(e)[:200])
        stop.wait(args.interval)
    history.close()


def client_http(args):
    """One HTTP request, retried until it answers 2xx or ``--wait`` passes; prints the status and body."""
    deadline = time.monotonic() + args.wait
    data = args.data.encode() if args.data is not None else None
    last = None
    if args.repeat:  # send it --repeat times; stop at the first refusal and say after how many
        for i in range(args.repeat):
            try:
                req = urllib.request.Request(args.url, data=data, method=args.method)
                with urllib.request.urlopen(req, timeout=5.0) as r:
                    r.read()
            except urllib.error.HTTPError as e:
                print("%d %s after %d accepted" % (e.code, e.read().decode("utf-8", "replace").strip(), i))
                return 1
            except OSError as e:
                print("%r after %d accepted" % (e, i))
                return 1
        print("200 OK x%d" % args.repeat)
        return 0
    while True:
        try:
            req = urllib.request.Request(args.url, data=data, method=args.method)
            with urllib.request.urlopen(req, timeout=2.0) as r:
                print(r.status, r.read().decode("utf-8", "replace"))
                return 0
        except urllib.error.HTTPError as e:
            last = "%d %s" % (e.code, e.read().decode("utf-8", "replace"))
            if not args.retry_http_errors:
                print(last)
                return 1
        except OSError as e:
            last = repr(e)
        if time.monotonic() >= deadline:
            print(last)
            return 1
        time.sleep(0.1)


def client_proxy(args):
    """A TCP fault proxy: ``--listen`` to ``--target``, with toxics in the spirit of toxiproxy's.

    * latency: each chunk in each direction is held ``--delay-ms`` +- ``--jitter-ms`` (order kept),
      and with probability ``--loss`` a further ``--rto-ms`` (what a lost segment costs TCP: it is
      sent again after a retransmission timeout). A byte stream cannot lose bytes without breaking
      the protocol, so loss is modelled by its effect on a TCP flow; with netem, real loss is better.
    * bandwidth: ``--bandwidth-kbps`` (KiB/s, each direction of each connection): writes are paced.
    * stall: SIGUSR2 stops forwarding in both directions (connections stay open, bytes are read and
      held; new connections are accepted and held too); the next SIGUSR2 lets everything flow again.
    * reset: SIGUSR1 resets every proxied connection, both sides (SO_LINGER 0, then close: an RST
      to the client and to the broker), as a middlebox dropping its state does.

    With ``--history``, each accepted connection, stall, flow and reset is written there."""
    host, port = args.listen.rsplit(":", 1)
    thost, tport = args.target.rsplit(":", 1)
    stop = _stop_event()
    history = History(args.history) if args.history else None
    flowing = threading.Event()  # cleared while stalled
    flowing.set()
    toggles = []  # SIGUSR1/SIGUSR2 seen by the handler, acted on by the accept loop
    signal.signal(signal.SIGUSR1, lambda *_: toggles.append("reset"))
    signal.signal(signal.SIGUSR2, lambda *_: toggles.append("stall"))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(512)
    listener.settimeout(0.1)
    rng = random.Random(args.seed)
    rng_lock = threading.Lock()  # guards rng (one per proxy, used by every pump)
    conns_lock = threading.Lock()  # guards conns
    conns = []  # [client, upstream] of each live proxied connection
    rate = args.bandwidth_kbps * 1024.0 if args.bandwidth_kbps else None

    def record(ev, **fields):
        if history is not None:
            history.write(ev, **fields)

    def hold():
        with rng_lock:
            delay = args.delay_ms + rng.uniform(-args.jitter_ms, args.jitter_ms)
            if rng.random() < args.loss:
                delay += args.rto_ms
        return max(0.0, delay) / 1000.0

    def pump(src, dst, pair):
        # Reader: stamp each chunk with its release time; the writer releases in order.
        chunks = []
        cond = threading.Condition()  # guards chunks

        def writer():
            free_at = time.monotonic()  # the bandwidth limit: when the next byte may go
            while True:
                with cond:
                    while not chunks:
                        cond.wait()
                    at, data = chunks.pop(0)
                wait = at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if data is None:
                    break
                while not flowing.is_set() and not stop.is_set():
                    flowing.wait(0.5)  # stalled: hold the bytes, keep the connection
                try:
                    if rate is None:
                        dst.sendall(data)
                    else:
                        for i in range(0, len(data), 4096):
                            piece = data[i : i + 4096]
                            wait = free_at - time.monotonic()
                            if wait > 0:
                                time.sleep(wait)
                            dst.sendall(piece)
                            free_at = max(free_at, time.monotonic()) + len(piece) / rate
                except OSError:
                    break
            if not pair.get("reset"):
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        w = threading.Thread(target=writer, name="proxy-writer", daemon=True)
        w.start()
        last = 0.0
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if pair.get("reset"):
                data = b""
            last = max(last, time.monotonic() + hold())
            with cond:
                chunks.append((last, data or None))
                cond.notify()
            if not data:
                break
        w.join()

    def reset_all():
        with conns_lock:
            live = list(conns)
            conns.clear()
        for pair in live:
            pair["reset"] = True
            for sock in pair["socks"]:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.shutdown(socket.SHUT_RD)  # wakes its reader; the close below sends the RST
                except OSError:
                    pass
        for pair in live:
            for sock in pair["socks"]:
                sock.close()
        record("reset", conns=len(live))

    def serve(client, upstream):
        pair = {"socks": (client, upstream)}
        with conns_lock:
            conns.append(pair)
        threads = [threading.Thread(target=pump, args=(a, b, pair), name="proxy-pump", daemon=True)
                   for a, b in ((client, upstream), (upstream, client))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with conns_lock:
            if pair in conns:
                conns.remove(pair)
        for sock in pair["socks"]:
            sock.close()

    while not stop.is_set():
        while toggles:
            what = toggles.pop(0)
            if what == "reset":
                reset_all()
            elif flowing.is_set():
                flowing.clear()
                record("stall")
            else:
                flowing.set()
                record("flow")
        try:
            client, peer = listener.accept()
        except (socket.timeout, BlockingIOError):
            # (PyPy 3.9: a signal during a timed accept raises EAGAIN, not a timeout)
            continue
        try:
            upstream = socket.create_connection((thost, int(tport)), timeout=2.0)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        client.settimeout(None)
        record("accept", peer="%s:%d" % peer[:2])
        threading.Thread(target=serve, args=(client, upstream), name="proxy-conn", daemon=True).start()
    listener.close()
    if history is not None:
        history.close()


def client_pynsq_consumer(args):
    """A third-party consumer: pynsq's Reader (tornado), through lookupd, ``--max-in-flight``, 1 s
    heartbeats, no attempt limit; each delivery and FIN to the history (the consumer's format)."""
    import logging

    import nsq
    import tornado.ioloop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    history = History(args.history)
    name = args.name
    io_loop = tornado.ioloop.IOLoop.current()

    def handle(message):
        seq = message.body[:20].decode("ascii", "replace")
        mid = message.id.decode("ascii", "replace")
        history.write("msg", seq=seq, mid=mid, att=message.attempts, who=name, conn="pynsq")
        history.write("fin", seq=seq, mid=mid, who=name, ok=True)  # returning True FINs it
        return True

    reader = nsq.Reader(topic=TOPIC, channel=CHANNEL, message_handler=handle,
                        lookupd_http_addresses=["http://" + a for a in args.lookupd.split(",")],
                        lookupd_poll_interval=max(1, int(args.poll)), max_in_flight=args.max_in_flight,
                        heartbeat_interval=max(1, args.heartbeat_ms // 1000), max_tries=0)

    def on_term(*_):
        io_loop.add_callback_from_signal(io_loop.stop)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_term)
    history.write("start", role="consumer", who=name, pid=os.getpid(), client="pynsq " + nsq.__version__)
    io_loop.start()
    reader.close()
    io_loop.call_later(0.5, io_loop.stop)
    io_loop.start()
    history.write("done", who=name)
    history.close()


# -- the network ----------------------------------------------------------------------


def run_cmd(argv, check=True):
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and result.returncode != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(argv), result.stderr.strip()))
    return result


class Network:
    """Hosts as namespaces ``<prefix><host>``, each with ``eth0`` on a bridge in ``<prefix>br``.

    Everything made is listed in ``made`` (namespace names) and removed by :meth:`close`; the
    veth pairs live only inside the namespaces, so removing those removes them."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.made = []
        self.hosts = {}
        self.cuts = set()
        self.bridge = prefix + "br"
        self._add_ns(self.bridge)
        run_cmd(["ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge"])
        run_cmd(["ip", "-n", self.bridge, "link", "set", "br0", "up"])

    def _add_ns(self, name):
        run_cmd(["ip", "netns", "add", name])
        self.made.append(name)
        run_cmd(["ip", "-n", name, "link", "set", "lo", "up"])

    def ns(self, host):
        return self.prefix + host

    def address(self, host):
        return SUBNET + str(HOST_ADDRESSES[host])

    def add_host(self, host):
        ns = self.ns(host)
        self._add_ns(ns)
        veth = "v-" + host
        run_cmd(["ip", "-n", self.bridge, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run_cmd(["ip", "-n", self.bridge, "link", "set", veth, "master", "br0", "up"])
        run_cmd(["ip", "-n", ns, "addr", "add", self.address(host) + "/24", "dev", "eth0"])
        run_cmd(["ip", "-n", ns, "link", "set", "eth0", "up"])
        self.hosts[host] = ns

    def cut(self, a, b):
        """A partition between hosts ``a`` and ``b``: a blackhole route to the other on each side
        (packets vanish; an established connection sees silence, a new one fails)."""
        for x, y in ((a, b), (b, a)):
            run_cmd(["ip", "-n", self.ns(x), "route", "add", "blackhole", self.address(y) + "/32"])
        self.cuts.add((a, b))

    def heal(self, a, b):
        for x, y in ((a, b), (b, a)):
            run_cmd(["ip", "-n", self.ns(x), "route", "del", "blackhole", self.address(y) + "/32"], check=False)
        self.cuts.discard((a, b))

    def close(self):
        for name in reversed(self.made):
            run_cmd(["ip", "netns", "del", name], check=False)
        self.made = []


class Proc:
    """A process in a host's namespace (``ip netns exec`` execs it: the pid is the process's own),
    its output in ``log``; ``mount_tmpfs`` runs it in a private mount namespace with a tmpfs of that
    many MiB on ``data`` (a disk that fills, that the host never sees)."""

    def __init__(self, ns, argv, log, env=None, mount_tmpfs=None, data=None):
        self.ns = ns
        self.argv = argv
        self.log = log
        if mount_tmpfs:
            script = 'mount --make-rprivate / && mount -t tmpfs -o size=%dm tmpfs "$0" && exec "$@"' % mount_tmpfs
            argv = ["unshare", "-m", "sh", "-c", script, data] + argv
        full = ["ip", "netns", "exec", ns] + argv
        self.out = open(log, "ab")
        self.popen = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=self.out, stderr=subprocess.STDOUT,
                                      env=env, start_new_session=True)
        self.pid = self.popen.pid

    def signal(self, sig):
        if self.popen.poll() is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout=10.0):
        """SIGTERM (after SIGCONT: a stopped process cannot exit), then SIGKILL after ``timeout``."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(5)
        self.out.close()
        return self.popen.returncode

    def kill(self):
        self.signal(signal.SIGKILL)
        self.popen.wait(5)
        self.out.close()

    def alive(self):
        return self.popen.poll() is None


# -- a cluster ---------------------------------------------------------------------------


class Cluster:
    """One scenario's world: the network, the processes, the histories, the fault timeline.

    ``impl`` is ``"ours"`` or ``"go"`` (then ``go_dir`` holds nsqd and nsqlookupd)."""

    def __init__(self, impl, go_dir, workdir, prefix, log=print):
        self.impl = impl
        self.go_dir = go_dir
        self.dir = workdir
        self.procs = {}
        self.brokers = {}  # host -> its flags, for restarts
        self.timeline = []  # (time, what)
        self.log = log
        self.net = Network(prefix)
        self.env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")

    def mark(self, what):
        self.timeline.append((now(), what))
        self.log("    %s %s" % (time.strftime("%H:%M:%S"), what))

    def path(self, name):
        return os.path.join(self.dir, name)

    def close(self):
        for name, proc in list(self.procs.items()):
            if proc.alive():
                proc.stop(timeout=5.0)
        self.procs = {}
        self.net.close()

    # processes

    def start(self, name, host, argv, **kw):
        proc = Proc(self.net.ns(host), argv, self.path(name + ".log"), env=self.env, **kw)
        self.procs[name] = proc
        return proc

    def script(self, mode, *args):
        return [sys.executable, os.path.abspath(__file__), mode] + [str(a) for a in args]

    def http(self, host, method, url, data=None, wait=20.0, retry_http_errors=True, repeat=0):
        """Run one HTTP request (or ``repeat`` of them, up to the first refusal) from ``host``; (ok, output)."""
        argv = self.script("_http", "--method", method, "--url", url, "--wait", wait, "--repeat", repeat)
        if data is not None:
            argv += ["--data", data]
        if retry_http_errors:
            argv.append("--retry-http-errors")
        r = run_cmd(["ip", "netns", "exec", self.net.ns(host)] + argv, check=False)
        return r.returncode == 0, r.stdout.strip()

    def start_lookupd(self, host="l1"):
        self.net.add_host(host) if host not in self.net.hosts else None
        flags = ["--tcp-address=0.0.0.0:%d" % LOOKUPD_TCP, "--http-address=0.0.0.0:%d" % LOOKUPD_HTTP,
                 "--broadcast-address=" + self.net.address(host)]
        if self.impl == "go":
            argv = [os.path.join(self.go_dir, "nsqlookupd")] + flags
        else:
            argv = [sys.executable, "-m", "nsqd_threaded.lookupd"] + flags
        self.start("lookupd-" + host, host, argv)
        ok, out = self.http(host, "GET", "http://%s:%d/ping" % (self.net.address(host), LOOKUPD_HTTP))
        if not ok:
            raise RuntimeError("lookupd on %s did not start: %s" % (host, out))

    def start_broker(self, host, msg_timeout="60s", proxy=False, tmpfs_mb=None, extra=(), durable=True):
        """nsqd on ``host`` registering with l1; ours ``--durable``, Go ``--mem-queue-size=0 --sync-every=1``
        (both with their defaults when not ``durable``).  With ``proxy`` it listens on 127.0.0.1 and a
        fault proxy takes its advertised port."""
        if host not in self.net.hosts:
            self.net.add_host(host)
        data = self.path("data-" + host)
        os.makedirs(data, exist_ok=True)
        address = self.net.address(host)
        tcp = "127.0.0.1" if proxy else "0.0.0.0"
        flags = ["--tcp-address=%s:%d" % (tcp, NSQD_TCP), "--http-address=0.0.0.0:%d" % NSQD_HTTP,
                 "--broadcast-address=" + address, "--lookupd-tcp-address=%s:%d" % (self.net.address("l1"), LOOKUPD_TCP),
                 "--data-path=" + data, "--msg-timeout=" + msg_timeout]
        if self.impl == "go":
            argv = [os.path.join(self.go_dir, "nsqd")] + flags + (["--mem-queue-size=0", "--sync-every=1"] if durable else [])
        else:
            argv = [sys.executable, "-m", "nsqd_threaded"] + flags + (["--durable"] if durable else [])
        argv += list(extra)
        self.brokers[host] = dict(argv=argv, tmpfs_mb=tmpfs_mb, data=data)
        self._launch_broker(host)
        if proxy:
            self.start_proxy(host, **proxy)

    def _launch_broker(self, host):
        spec = self.brokers[host]
        self.start("nsqd-" + host, host, spec["argv"], mount_tmpfs=spec["tmpfs_mb"], data=spec["data"])
        ok, out = self.http(host, "GET", "http://%s:%d/ping" % (self.net.address(host), NSQD_HTTP))
        if not ok:
            raise RuntimeError("nsqd on %s did not start: %s" % (host, out))

    def restart_broker(self, host):
        self._launch_broker(host)

    def start_proxy(self, host, delay_ms=0, jitter_ms=0, loss=0.0, rto_ms=200, bandwidth_kbps=0):
        self.start("proxy-" + host, host, self.script(
            "_proxy", "--listen", "%s:%d" % (self.net.address(host), PROXY_TCP), "--target", "127.0.0.1:%d" % NSQD_TCP,
            "--delay-ms", delay_ms, "--jitter-ms", jitter_ms, "--loss", loss, "--rto-ms", rto_ms,
            "--bandwidth-kbps", bandwidth_kbps, "--history", self.path("proxy-%s.jsonl" % host)))

    def proxy_accepts(self, host):
        """How many connections the proxy of ``host`` has accepted so far."""
        return sum(1 for e in read_history(self.path("proxy-%s.jsonl" % host)) if e["ev"] == "accept")

    def stall_for(self, host, seconds):
        """The proxy of ``host`` forwards nothing for ``seconds`` (connections stay open)."""
        self.procs["proxy-" + host].signal(signal.SIGUSR2)
        self.mark("stall %s's links %ss" % (host, seconds))
        time.sleep(seconds)
        self.procs["proxy-" + host].signal(signal.SIGUSR2)
        self.mark("%s's links flow" % host)

    def reset_links(self, host):
        """RST every connection through the proxy of ``host``, both sides."""
        self.procs["proxy-" + host].signal(signal.SIGUSR1)
        self.mark("reset %s's connections" % host)

    def create_topic(self, host):
        base = "http://%s:%d" % (self.net.address(host), NSQD_HTTP)
        for url in ("/topic/create?topic=" + TOPIC, "/channel/create?topic=%s&channel=%s" % (TOPIC, CHANNEL)):
            ok, out = self.http(host, "POST", base + url)
            if not ok:
                raise RuntimeError("%s %s: %s" % (host, url, out))

    def lookupd_url(self, path="/nodes"):
        return "http://%s:%d%s" % (self.net.address("l1"), LOOKUPD_HTTP, path)

    def start_watch(self, host="l1"):
        self.start("watch", host, self.script("_watch", "--url", self.lookupd_url(), "--interval", 0.1,
                                              "--history", self.path("watch.jsonl")))

    def start_producer(self, host, brokers, count, rate, window=4, timeout=5.0, dpub_every=0):
        if host not in self.net.hosts:
            self.net.add_host(host)
        nsqd = ",".join("%s:%d" % (self.net.address(b), NSQD_TCP) for b in brokers)
        return self.start("producer-" + host, host, self.script(
            "_producer", "--history", self.path("producer-%s.jsonl" % host), "--nsqd", nsqd, "--count", count,
            "--rate", rate, "--window", window, "--timeout", timeout, "--heartbeat-ms", 1000,
            "--dpub-every", dpub_every))

    def start_pynsq_consumer(self, host, max_in_flight=20):
        """pynsq 0.9.1's Reader (a third-party client) as a consumer through lookupd."""
        if host not in self.net.hosts:
            self.net.add_host(host)
        return self.start("consumer-" + host, host, self.script(
            "_pynsq_consumer", "--history", self.path("consumer-%s.jsonl" % host), "--name", host,
            "--lookupd", "%s:%d" % (self.net.address("l1"), LOOKUPD_HTTP), "--poll", 1,
            "--max-in-flight", max_in_flight, "--heartbeat-ms", 1000))

    def start_consumer(self, host, max_in_flight=10, work_ms=20, concurrency=4, req_every=0):
        if host not in self.net.hosts:
            self.net.add_host(host)
        return self.start("consumer-" + host, host, self.script(
            "_consumer", "--history", self.path("consumer-%s.jsonl" % host), "--name", host,
            "--lookupd", "%s:%d" % (self.net.address("l1"), LOOKUPD_HTTP), "--poll", 1.0,
            "--max-in-flight", max_in_flight, "--work-ms", work_ms, "--concurrency", concurrency,
            "--heartbeat-ms", 1000, "--req-every", req_every))

    # progress

    def events(self, prefix):
        out = []
        for name in sorted(os.listdir(self.dir)):
            if name.startswith(prefix) and name.endswith(".jsonl"):
                out += read_history(self.path(name))
        return out

    def acked(self):
        return sum(1 for e in self.events("producer-") if e["ev"] == "pub" and e["ok"])

    def wait_for(self, what, predicate, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.1)
        self.mark("gave up waiting for " + what)
        return False

    def producer_done(self, host="p1"):
        return any(e["ev"] == "done" for e in read_history(self.path("producer-%s.jsonl" % host)))

    def drained(self):
        """Every acked message delivered at least once."""
        acked = {str(e["seq"]) for e in self.events("producer-") if e["ev"] == "pub" and e["ok"]}
        seen = {e["seq"] for e in self.events("consumer-") if e["ev"] == "msg"}
        return acked <= seen

    def finish(self, drain_timeout):
        """Wait for the producers, then for every acked message to arrive (or ``drain_timeout``),
        then stop the clients; the check of the histories."""
        self.wait_for("the producer", lambda: all(self.producer_done(p[len("producer-"):])
                                                  for p in self.procs if p.startswith("producer-")), 120)
        # A producer still publishing is stopped first (it waits for its answers), so that nothing
        # is acked after the drain was checked.
        for name, proc in self.procs.items():
            if name.startswith("producer-") and proc.alive():
                proc.stop(timeout=60.0)
        self.wait_for("the drain", self.drained, drain_timeout)
        time.sleep(0.5)  # the last FINs
        for name, proc in self.procs.items():
            if name.startswith(("consumer-", "watch", "producer-")) and proc.alive():
                proc.stop(timeout=8.0)
        return check(self)


# -- the checker ---------------------------------------------------------------------------


def check(cluster):
    """Lost, duplicates (and why), recovery times, from the histories and the fault timeline."""
    pubs = [e for e in cluster.events("producer-") if e["ev"] == "pub"]
    acked = {str(e["seq"]) for e in pubs if e["ok"]}
    failed = len(pubs) - len(acked)
    consumer_events = sorted(cluster.events("consumer-"), key=lambda e: e["t"])
    deliveries = {}
    unanswered = {}  # (mid, who) -> its latest delivery, until the FIN or REQ that answers it
    for e in consumer_events:
        if not e.get("seq", "").isdigit():
            continue  # a probe's body (full_disk), not one of the producer's
        if e["ev"] == "msg":
            deliveries.setdefault(e["seq"], []).append(e)
            unanswered[(e["mid"], e["who"])] = e
        elif e["ev"] in ("fin", "req"):
            delivery = unanswered.pop((e["mid"], e["who"]), None)
            if delivery is not None:
                delivery["answer"] = e
    lost = sorted(acked - set(deliveries), key=int)
    dup_reasons = {}
    dup_first = {}  # consumer -> duplicates whose earlier delivery it had
    duplicates = 0
    for seq, ds in deliveries.items():
        for before, after in zip(ds, ds[1:]):
            answer = before.get("answer")
            if before["mid"] != after["mid"]:
                why = "published twice (a retry after a lost answer)"
            elif answer is not None and answer["ev"] == "req":
                continue  # asked for: not a duplicate
            elif after["att"] > before["att"]:
                if answer is not None and answer["ok"]:
                    why = "timeout (its FIN was lost)"
                elif answer is not None:
                    why = "timeout (FIN failed: connection gone)"
                else:
                    why = "redelivered unanswered (timeout, or requeued by a closing consumer)"
            else:
                why = "redelivered after a restart (attempts not advanced)"
            duplicates += 1
            dup_reasons[why] = dup_reasons.get(why, 0) + 1
            dup_first[before["who"]] = dup_first.get(before["who"], 0) + 1
    result = {
        "published": len(pubs), "acked": len(acked), "pub_failed": failed, "delivered": len(deliveries),
        "lost": len(lost), "lost_sample": lost[:10], "duplicates": duplicates, "dup_reasons": dup_reasons, "dup_first": dup_first,
        "timeline": [(round(t, 3), w) for t, w in cluster.timeline],
    }
    result.update(recovery(cluster, pubs, consumer_events))
    return result


def _first_after(times, t0):
    later = [t for t in times if t >= t0]
    return round(min(later) - t0, 2) if later else None


def recovery(cluster, pubs, consumer_events):
    """Times measured from the faults: producers answered again, consumers flowing again, a broker
    registered again with lookupd (a new connection: its remote address changed)."""
    out = {}
    faults = [(t, w) for t, w in cluster.timeline if w.startswith(("cut", "kill", "stop", "fill"))]
    heals = [(t, w) for t, w in cluster.timeline if w.startswith(("heal", "restart", "cont", "free"))]
    if not faults:
        return out
    t_fault = faults[0][0]
    acks = sorted(e["t"] for e in pubs if e["ok"])
    # the longest wait for an answer from the fault on: a publish stuck on the lost node until failover
    stuck = [e["t"] - e["ts"] for e in pubs if e["ok"] and e["t"] >= t_fault]
    out["producer_failover_s"] = round(max(stuck), 2) if stuck else None
    gaps = [b - a for a, b in zip(acks, acks[1:]) if b >= t_fault]
    out["producer_max_gap_s"] = round(max(gaps), 2) if gaps else None
    msgs = [e["t"] for e in consumer_events if e["ev"] == "msg"]
    dgaps = [b - a for a, b in zip(msgs, msgs[1:]) if b >= t_fault]
    out["consumer_max_gap_s"] = round(max(dgaps), 2) if dgaps else None
    redelivered = [e["t"] for e in consumer_events if e["ev"] == "msg" and e["att"] > 1]
    out["first_redelivery_s"] = _first_after(redelivered, t_fault)
    watch = read_history(cluster.path("watch.jsonl"))
    if watch and heals:
        t_heal = heals[-1][0]
        broker = cluster.registration_host
        address = cluster.net.address(broker)
        before = [e for e in watch if e["ev"] == "nodes" and e["t"] < t_fault]
        remote0 = {n["remote"] for n in (before[-1]["nodes"] if before else []) if n["addr"] == address}
        listed_during = all(any(n["addr"] == address for n in e["nodes"])
                            for e in watch if e["ev"] == "nodes" and t_fault <= e["t"] < t_heal)
        again = [e["t"] for e in watch if e["ev"] == "nodes" and e["t"] >= t_heal
                 and any(n["addr"] == address and n["remote"] not in remote0 for n in e["nodes"])]
        out["reregistered_s"] = round(min(again) - t_heal, 2) if again else None
        out["listed_during_fault"] = listed_during
        t_gone = [e["t"] for e in watch if e["ev"] == "nodes" and t_fault <= e["t"]
                  and not any(n["addr"] == address for n in e["nodes"])]
        out["unlisted_after_s"] = round(min(t_gone) - t_fault, 2) if t_gone else None
    return out


# -- scenarios ------------------------------------------------------------------------------


def cut_for(c, a, b, seconds):
    """Partition hosts ``a`` and ``b`` for ``seconds``, then heal; both moments marked in the history."""
    c.net.cut(a, b)
    c.mark("cut %s-%s" % (a, b))
    time.sleep(seconds)
    c.net.heal(a, b)
    c.mark("heal %s-%s" % (a, b))


def start_two_brokers(c, count, rate):
    """The common cluster: a lookupd, brokers b1 and b2 with the topic, consumer c1, producer p1 over both."""
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b)
        c.create_topic(b)
    c.start_consumer("c1")
    c.start_producer("p1", ["b1", "b2"], count, rate)


def sc_producer_cut(c, short):
    """(1) The producer is cut from b1 mid-stream and fails over to b2; healed later."""
    count, rate = (1500, 300) if short else (6000, 300)
    start_two_brokers(c, count, rate)
    c.wait_for("30% acked", lambda: c.acked() >= count * 0.3, 60)
    cut_for(c, "p1", "b1", 5 if short else 15)
    return c.finish(60)


def sc_lookupd_cut(c, short):
    """(2) b1 is cut from lookupd for longer than a ping interval (15 s), then healed."""
    count, rate = (6000, 200) if short else (10000, 200)
    c.start_lookupd()
    c.start_watch()
    c.registration_host = "b1"
    for b in ("b1", "b2"):
        c.start_broker(b)
        c.create_topic(b)
    c.start_consumer("c1")
    c.start_producer("p1", ["b1", "b2"], count, rate)
    c.wait_for("500 acked", lambda: c.acked() >= 500, 60)
    cut_for(c, "b1", "l1", 17 if short else 30)
    t_heal = now()
    result = c.finish(60)
    via_b1 = [e["t"] for e in c.events("consumer-") if e["ev"] == "msg" and e["t"] >= t_heal
              and e["conn"].startswith(c.net.address("b1") + ":")]
    result["consumer_on_b1_after_heal"] = bool(via_b1)
    return result


def sc_consumer_cut(c, short):
    """(3) c1 is cut from its broker with messages in flight; after --msg-timeout they go to c2."""
    count, rate = (1200, 200) if short else (5000, 200)
    c.start_lookupd()
    c.start_broker("b1", msg_timeout="4s")
    c.create_topic("b1")
    c.start_consumer("c1", max_in_flight=20, work_ms=50)
    c.start_consumer("c2", max_in_flight=20, work_ms=50)
    c.start_producer("p1", ["b1"], count, rate)
    c.wait_for("30% acked", lambda: c.acked() >= count * 0.3, 60)
    cut_for(c, "c1", "b1", 8 if short else 20)
    return c.finish(60)


def sc_broker_kill(c, short, durable=True):
    """(4) b1 killed with SIGKILL mid-stream (messages queued and in flight), restarted on its data."""
    count, rate = (1500, 300) if short else (6000, 300)
    kills = 1 if short else 3
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b, durable=durable)
        c.create_topic(b)
    c.start_producer("p1", ["b1", "b2"], count, rate)
    c.wait_for("30% acked", lambda: c.acked() >= count * 0.3, 60)
    c.start_consumer("c1", max_in_flight=20, work_ms=20)  # late: a backlog sits on the brokers
    for i in range(kills):
        time.sleep(1.0)
        c.procs["nsqd-b1"].kill()
        c.mark("kill b1 (SIGKILL)")
        time.sleep(2.0)
        c.restart_broker("b1")
        c.mark("restart b1")
    return c.finish(90)


def sc_broker_kill_memory(c, short):
    """(4b) as broker_kill, with the brokers' defaults (no ``--durable``; Go's 10,000-message memory
    queue): what sat in memory is lost, bounded by the backlog and the messages in flight."""
    return sc_broker_kill(c, short, durable=False)


def sc_sigstop(c, short):
    """(6a) b1 paused with SIGSTOP (8 s short, 20 s full), then resumed."""
    count, rate = (3000, 200) if short else (8000, 200)
    start_two_brokers(c, count, rate)
    c.wait_for("20% acked", lambda: c.acked() >= count * 0.2, 60)
    c.procs["nsqd-b1"].signal(signal.SIGSTOP)
    c.mark("stop b1 (SIGSTOP)")
    time.sleep(8 if short else 20)
    c.procs["nsqd-b1"].signal(signal.SIGCONT)
    c.mark("cont b1 (SIGCONT)")
    return c.finish(90)


def sc_full_disk(c, short):
    """(6b) b1's data path is a 16 MiB tmpfs that a filler file fills; then the filler goes."""
    count, rate = (2000, 200) if short else (6000, 200)
    c.start_lookupd()
    c.start_broker("b1", tmpfs_mb=16)
    c.start_broker("b2")
    for b in ("b1", "b2"):
        c.create_topic(b)
    c.start_producer("p1", ["b1", "b2"], count, rate)
    c.wait_for("20% acked", lambda: c.acked() >= count * 0.2, 60)
    pid = c.procs["nsqd-b1"].pid
    filler = os.path.join(c.brokers["b1"]["data"], "filler")
    run_cmd(["nsenter", "-t", str(pid), "-m", "sh", "-c", "dd if=/dev/zero of=%s bs=1M count=64 2>/dev/null; true" % filler])
    c.mark("fill b1's disk")
    url = "http://%s:%d/pub?topic=%s" % (c.net.address("b1"), NSQD_HTTP, TOPIC)
    # A write may still land in a page the file already has: publish until the broker refuses.
    ok, answer = c.http("b1", "POST", url, data="x" * 1024, wait=0, retry_http_errors=False, repeat=2000)
    c.mark("HTTP pubs of 1 KiB on the full disk: %s" % answer[:80])
    c.full_disk_answer = answer
    time.sleep(3 if short else 10)
    run_cmd(["nsenter", "-t", str(pid), "-m", "rm", "-f", filler])
    c.mark("free b1's disk")
    ok, answer = c.http("b1", "POST", url, data="x" * 1024, wait=0, retry_http_errors=False, repeat=100)
    c.mark("HTTP pub after freeing: %s" % answer[:60])
    c.full_disk_recovered = ok
    c.start_consumer("c1")
    result = c.finish(90)
    result["full_disk_answer"] = c.full_disk_answer
    result["recovered"] = c.full_disk_recovered
    # The HTTP probes' bodies are not sequence numbers: the checker leaves them out.
    return result


def sc_lossy(c, short):
    """(5) every client link to the brokers through a proxy: 50 ms +- 20 ms per chunk, 2% of chunks
    held a further 200 ms (a retransmission), for the whole run."""
    seconds = 45 if short else 300
    rate = 500  # offered; what a window of 32 over ~100 ms round trips carries is the figure
    count = seconds * rate  # more than that carries: the producer is stopped after ``seconds``
    proxy = dict(delay_ms=50, jitter_ms=20, loss=0.02, rto_ms=200)
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b, proxy=proxy)
        c.create_topic(b)
    c.start_consumer("c1", max_in_flight=50, work_ms=0)
    t0 = now()
    c.start_producer("p1", ["b1", "b2"], count, rate, window=32)
    c.mark("lossy links (proxy) from the start")
    time.sleep(seconds)
    c.procs["producer-p1"].stop(timeout=60.0)
    c.mark("producer stopped after %d s" % seconds)
    result = c.finish(90)
    pubs = [e for e in c.events("producer-") if e["ev"] == "pub" and e["ok"]]
    if pubs:
        result["throughput_per_s"] = round(len(pubs) / max(0.001, max(e["t"] for e in pubs) - t0), 1)
    errors = [e for e in c.events("consumer-") if e["ev"] == "error"]
    result["consumer_errors"] = len(errors)
    return result


def sc_stall_reset(c, short):
    """(5b) every client link to the brokers through a proxy with toxics: a stall shorter than a
    heartbeat interval (nothing may be dropped for it), a stall longer than two (Go's rule: the broker
    closes a connection silent for twice the heartbeat interval; the clients' own heartbeat checks
    close theirs), then RSTs of every connection, under load. c2 is pynsq's Reader (a third-party
    client): its history is checked with c1's."""
    count, rate = (2400, 150) if short else (9000, 150)
    long_stall = 5 if short else 10
    resets = 1 if short else 3
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b, proxy=dict(bandwidth_kbps=512))
        c.create_topic(b)
    c.start_consumer("c1", max_in_flight=20, work_ms=5)
    c.start_pynsq_consumer("c2", max_in_flight=20)
    c.start_producer("p1", ["b1", "b2"], count, rate, window=8)
    c.wait_for("20% acked", lambda: c.acked() >= count * 0.2, 60)
    before = c.proxy_accepts("b1")
    c.stall_for("b1", 0.8)
    time.sleep(2.5)  # past two heartbeat intervals: a connection the stall broke would be redialled by now
    short_stall_new = c.proxy_accepts("b1") - before
    c.wait_for("40% acked", lambda: c.acked() >= count * 0.4, 60)
    before = c.proxy_accepts("b1")
    c.stall_for("b1", long_stall)
    t_flow = now()
    # Each client's connection dropped by the heartbeat rules and dialled again (maybe during the
    # stall: the proxy accepts and holds a new connection too).
    c.wait_for("the clients back on b1", lambda: c.proxy_accepts("b1") >= before + 3, 30)
    long_stall_redials = c.proxy_accepts("b1") - before
    back_after_reset = []
    for i in range(resets):
        c.wait_for("%d%% acked" % (60 + 10 * i), lambda: c.acked() >= count * (0.6 + 0.1 * i), 60)
        before = c.proxy_accepts("b1")
        c.reset_links("b1")
        t_reset = now()
        # Every client back on b1 (pynsq dials a node at most once per 10 s: up to that long).
        if c.wait_for("the clients back on b1 after the reset", lambda: c.proxy_accepts("b1") >= before + 3, 30):
            back_after_reset.append(round(now() - t_reset, 1))
    result = c.finish(90)
    result["reset_back_s"] = back_after_reset
    result["short_stall_reconnects"] = short_stall_new
    b1 = c.net.address("b1") + ":"
    again = [e["t"] for e in c.events("consumer-c1") if e["ev"] == "msg" and e["t"] >= t_flow
             and e["conn"].startswith(b1)]
    result["long_stall_redials"] = long_stall_redials
    result["long_stall_b1_again_s"] = round(min(again) - t_flow, 2) if again else None
    result["pynsq_deliveries"] = sum(1 for e in c.events("consumer-c2") if e["ev"] == "msg")
    result["consumer_errors"] = len([e for e in c.events("consumer-") if e["ev"] == "error"])
    return result


def sc_soak(c, short, minutes=None):
    """(7) mixed PUB/DPUB and consume/REQ load with consumers connecting and leaving; the broker's RSS,
    threads and open files sampled each 10 s."""
    minutes = minutes or (1 if short else 10)
    rate = 100
    count = int(minutes * 60 * rate)
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b)
        c.create_topic(b)
    c.start_consumer("c1", req_every=20)
    c.start_producer("p1", ["b1", "b2"], count, rate, dpub_every=10)
    samples = []
    end = time.monotonic() + minutes * 60
    turn = 0
    while time.monotonic() < end and not c.producer_done():
        time.sleep(10)
        samples.append(proc_sample(c.procs["nsqd-b1"].pid))
        turn += 1
        if turn % 3 == 0:  # c2 comes and goes
            name = "consumer-c2"
            if name in c.procs and c.procs[name].alive():
                c.procs[name].stop(timeout=8.0)
                c.mark("c2 leaves")
            else:
                c.start_consumer("c2", req_every=20)
                c.mark("c2 joins")
    result = c.finish(120)
    if len(samples) >= 4:
        warm = samples[len(samples) // 4]
        last = samples[-1]
        result["soak"] = {k: [warm[k], last[k]] for k in warm}
    with open(c.path("nsqd-b1.log"), errors="replace") as f:
        bad = [line.strip() for line in f if "Traceback" in line or "ERROR" in line]
    result["log_errors"] = len(bad)
    result["log_error_lines"] = bad[:3]
    return result


def proc_sample(pid):
    """RSS (KiB), threads and open files of a process, from /proc."""
    status = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                status[k] = v.split()[0] if v.split() else ""
        fds = len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return {"rss_kib": None, "threads": None, "fds": None}
    return {"rss_kib": int(status.get("VmRSS", 0)), "threads": int(status.get("Threads", 0)), "fds": fds}


SCENARIOS = {
    "producer_cut": sc_producer_cut,
    "lookupd_cut": sc_lookupd_cut,
    "consumer_cut": sc_consumer_cut,
    "broker_kill": sc_broker_kill,
    "broker_kill_memory": sc_broker_kill_memory,
    "sigstop": sc_sigstop,
    "full_disk": sc_full_disk,
    "lossy": sc_lossy,
    "stall_reset": sc_stall_reset,
    "soak": sc_soak,
}
ORDER = ["producer_cut", "consumer_cut", "broker_kill", "broker_kill_memory", "lookupd_cut", "sigstop", "full_disk", "lossy",
         "stall_reset", "soak"]


# -- running --------------------------------------------------------------------------------


class Runner:
    """Runs scenarios one cluster at a time and removes each cluster (and, at exit, anything left)."""

    def __init__(self, keep=False, log=print):
        self.keep = keep
        self.log = log
        self.root = tempfile.mkdtemp(prefix="nsqf-%d-" % os.getpid())
        self.prefix = os.path.basename(self.root) + "-"  # unique per runner, also within one process
        self.live = []  # clusters not yet closed
        self.counter = 0
        atexit.register(self.close)

    def run(self, scenario, impl, go_dir=None, short=True, minutes=None):
        self.counter += 1
        workdir = os.path.join(self.root, "%s-%s" % (scenario, impl))
        os.makedirs(workdir)
        # a namespace name must be unique per run and short: the prefix plus a counter
        cluster = Cluster(impl, go_dir, workdir, "%s%d-" % (self.prefix, self.counter), log=self.log)
        cluster.registration_host = "b1"
        self.live.append(cluster)
        self.log("%s (%s, %s)" % (scenario, impl, "short" if short else "full"))
        try:
            fn = SCENARIOS[scenario]
            result = fn(cluster, short, minutes) if scenario == "soak" else fn(cluster, short)
        finally:
            cluster.close()
            self.live.remove(cluster)
        result["workdir"] = workdir
        return result

    def close(self):
        for cluster in list(self.live):
            cluster.close()
        self.live = []
        if not self.keep and os.path.isdir(self.root):
            shutil.rmtree(self.root, ignore_errors=True)


def can_make_namespaces():
    """(True, "") when this process may make network namespaces, else (False, why)."""
    if os.geteuid() != 0:
        return False, "not root"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return False, "no %s" % tool
    name = "nsqf-%d-probe" % os.getpid()
    r = run_cmd(["ip", "netns", "add", name], check=False)
    if r.returncode != 0:
        return False, r.stderr.strip()
    run_cmd(["ip", "netns", "del", name], check=False)
    return True, ""


def clean_stale():
    """Delete the namespaces ``nsqf-<pid>-...`` whose run (``pid``) is no longer alive; their names."""
    out = run_cmd(["ip", "netns", "list"], check=False).stdout
    removed = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != "nsqf" or not parts[1].isdigit():
            continue
        if os.path.exists("/proc/%s" % parts[1]):
            continue  # that run is alive (or its pid was reused: left alone either way)
        run_cmd(["ip", "netns", "del", name], check=False)
        removed.append(name)
    return removed


def fmt_cell(r):
    if r is None:
        return "-"
    if "error" in r:
        return "error: %s" % r["error"][:80]
    parts = ["lost %d of %d acked" % (r["lost"], r["acked"]), "dup %d" % r["duplicates"]]
    if r.get("dup_reasons"):
        parts[-1] += " (%s)" % ", ".join("%d %s" % (n, why) for why, n in sorted(r["dup_reasons"].items()))
    for key, label in (("producer_failover_s", "longest publish %ss"), ("first_redelivery_s", "redelivered from %ss"),
                       ("consumer_max_gap_s", "delivery gap %ss"), ("reregistered_s", "re-registered %ss after heal"),
                       ("throughput_per_s", "%s msg/s acked"), ("consumer_errors", "%s consumer errors"),
                       ("full_disk_answer", "full: %s"), ("recovered", "accepting again after freeing: %s")):
        if r.get(key) is not None:
            parts.append(label % (r[key],))
    if "listed_during_fault" in r:
        parts.append("in /nodes throughout" if r["listed_during_fault"] else
                     "off /nodes %ss after cut" % r.get("unlisted_after_s"))
    if "consumer_on_b1_after_heal" in r:
        parts.append("consumer took from b1 after the heal" if r["consumer_on_b1_after_heal"]
                     else "consumer took nothing from b1 after the heal")
    if "short_stall_reconnects" in r:
        parts.append("%s reconnects for the 0.8 s stall" % r["short_stall_reconnects"])
    if "long_stall_redials" in r:
        parts.append("%s connections redialled for the long stall" % r["long_stall_redials"])
    if "long_stall_b1_again_s" in r:
        parts.append("c1 took from b1 again %ss after the long stall" % r["long_stall_b1_again_s"])
    if r.get("reset_back_s"):
        parts.append("all clients back %ss after each reset" % r["reset_back_s"])
    if r.get("pynsq_deliveries") is not None:
        parts.append("pynsq consumer took %s" % r["pynsq_deliveries"])
    if "soak" in r:
        parts.append("RSS/threads/fds %s" % r["soak"])
    if "log_errors" in r:
        parts.append("%d log errors%s" % (r["log_errors"], (" (%s)" % " / ".join(r["log_error_lines"]))
                                          if r.get("log_error_lines") else ""))
    return "; ".join(parts)


def report(results):
    lines = ["| scenario | ours | Go 1.3 |", "|---|---|---|"]
    for scenario in ORDER:
        if scenario in results:
            row = results[scenario]
            lines.append("| %s | %s | %s |" % (scenario, fmt_cell(row.get("ours")), fmt_cell(row.get("go"))))
    return "\n".join(lines)


def main_cli(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", action="append", default=[],
                        help="one of %s, or all (repeatable)" % ", ".join(ORDER))
    parser.add_argument("--short", action="store_true", help="the short variants (seconds, not minutes)")
    parser.add_argument("--go", metavar="DIR", help="also run Go's nsqd and nsqlookupd from DIR")
    parser.add_argument("--no-ours", action="store_true", help="only Go's")
    parser.add_argument("--minutes", type=float, help="the soak's length")
    parser.add_argument("--report", action="store_true", help="print a markdown table at the end")
    parser.add_argument("--json", metavar="FILE", help="write every result to FILE")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, histories)")
    parser.add_argument("--clean-stale", action="store_true",
                        help="remove the namespaces of earlier runs whose process is gone (a SIGKILLed run), then exit")
    args = parser.parse_args(argv)
    if args.clean_stale:
        for name in clean_stale():
            print("removed", name)
        return 0
    scenarios = ORDER if "all" in args.scenario else args.scenario
    for s in scenarios:
        if s not in SCENARIOS:
            parser.error("no scenario %r" % s)
    if not scenarios:
        parser.error("give --scenario")
    ok, why = can_make_namespaces()
    if not ok:
        print("cannot make network namespaces: %s" % why, file=sys.stderr)
        return 2
    runner = Runner(keep=args.keep)

    def on_signal(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    impls = ([] if args.no_ours else ["ours"]) + (["go"] if args.go else [])
    results = {}
    try:
        for scenario in scenarios:
            for impl in impls:
                try:
                    r = runner.run(scenario, impl, os.path.abspath(args.go) if args.go else None, args.short,
                                   args.minutes)
                except KeyboardInterrupt:
                    raise
                except Exception as e:  # noqa: BLE001 - one scenario's failure is reported, the rest run
                    r = {"error": repr(e)}
                results.setdefault(scenario, {})[impl] = r
                print("  %s %s: %s" % (scenario, impl, fmt_cell(r)), flush=True)
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        if args.keep:
            print("work directory:", runner.root)
        runner.close()
    if args.report:
        print()
        print(report(results))
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    modes = {"_producer": client_producer, "_consumer": client_consumer, "_watch": client_watch,
             "_http": client_http, "_proxy": client_proxy, "_pynsq_consumer": client_pynsq_consumer}
    if argv and argv[0] in modes:
        p = argparse.ArgumentParser(prog="faults.py " + argv[0])
        p.add_argument("--history")
        p.add_argument("--nsqd", default="")
        p.add_argument("--lookupd", default="")
        p.add_argument("--count", type=int, default=1000)
        p.add_argument("--rate", type=float, default=100)
        p.add_argument("--window", type=int, default=4)
        p.add_argument("--timeout", type=float, default=5.0)
        p.add_argument("--heartbeat-ms", type=int, default=1000)
        p.add_argument("--dpub-every", type=int, default=0)
        p.add_argument("--name", default="c")
        p.add_argument("--poll", type=float, default=1.0)
        p.add_argument("--max-in-flight", type=int, default=10)
        p.add_argument("--work-ms", type=float, default=0)
        p.add_argument("--concurrency", type=int, default=4)
        p.add_argument("--req-every", type=int, default=0)
        p.add_argument("--url")
        p.add_argument("--interval", type=float, default=0.1)
        p.add_argument("--method", default="GET")
        p.add_argument("--data")
        p.add_argument("--wait", type=float, default=10)
        p.add_argument("--retry-http-errors", action="store_true")
        p.add_argument("--repeat", type=int, default=0)
        p.add_argument("--listen")
        p.add_argument("--target")
        p.add_argument("--delay-ms", type=float, default=0)
        p.add_argument("--jitter-ms", type=float, default=0)
        p.add_argument("--loss", type=float, default=0)
        p.add_argument("--rto-ms", type=float, default=200)
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--bandwidth-kbps", type=float, default=0)
        return modes[argv[0]](p.parse_args(argv[1:]))
    return main_cli(argv)


if __name__ == "__main__":
    sys.exit(main() or 0)
