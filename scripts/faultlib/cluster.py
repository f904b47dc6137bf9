"""A scenario's cluster: processes in the hosts' namespaces (ours or Go's nsqd and nsqlookupd, the
clients, the proxies), their fault controls, and the progress read back from their histories."""

import os
import signal
import subprocess
import sys
import time

from .checker import archived, check
from .history import now, read_history
from .network import Network, run_cmd
from .topology import (ARCHIVE_CHANNEL, CHANNEL, FAULTS_SCRIPT, LOOKUPD_HTTP, LOOKUPD_TCP, NSQD_HTTP, NSQD_TCP,
                       PROXY_TCP, REPO, TOPIC)


def find_nsq_to_file(go_dir):
    """Go's ``nsq_to_file``: in ``go_dir`` (``--go``), else in ``$NSQ_GO_BIN``; None when neither has it."""
    for d in (go_dir, os.environ.get("NSQ_GO_BIN")):
        if d:
            path = os.path.join(d, "nsq_to_file")
            if os.access(path, os.X_OK):
                return path
    return None


PROXY_START_TIMEOUT = 20.0  # seconds a fault proxy may take to listen (an interpreter start, on a busy CI host)


def _says_listening(log):
    """Whether a fault proxy's output has its ``listening HOST:PORT`` line yet."""
    try:
        with open(log, "rb") as f:
            return any(line.startswith(b"listening ") for line in f)
    except FileNotFoundError:
        return False


def _tail(log, lines=5):
    try:
        with open(log, errors="replace") as f:
            return " | ".join(line.strip() for line in f.readlines()[-lines:])
    except FileNotFoundError:
        return "(no output)"


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
        self.archiver = None  # Go's nsq_to_file, once want_archiver() found it
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
        return [sys.executable, FAULTS_SCRIPT, mode] + [str(a) for a in args]

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
        # Back only once it listens (it prints so): a client started next would otherwise be refused
        # while the proxy's interpreter starts, and a refused dial costs pynsq's Reader 10 s (its
        # connect_to_nsqd tries an address at most once per 10 s, failed or not).
        log, deadline = self.path("proxy-%s.log" % host), time.monotonic() + PROXY_START_TIMEOUT
        while not _says_listening(log):
            if not self.procs["proxy-" + host].alive() or time.monotonic() >= deadline:
                raise RuntimeError("the proxy of %s did not listen: %s" % (host, _tail(log)))
            time.sleep(0.02)

    def proxy_accepts(self, host):
        """How many connections the proxy of ``host`` has accepted so far."""
        return sum(1 for e in read_history(self.path("proxy-%s.jsonl" % host)) if e["ev"] == "accept")

    def proxy_resets(self, host):
        """How many times the proxy of ``host`` has reset its connections so far."""
        return sum(1 for e in read_history(self.path("proxy-%s.jsonl" % host)) if e["ev"] == "reset")

    def back_after_reset(self, host, resets_before, clients):
        """``{client host: seconds}``: which of ``clients`` the proxy of ``host`` accepted a connection
        from after its reset number ``resets_before`` + 1 (recorded before it resets anything), and how
        long after it the first one; {} while that reset is not done yet."""
        events = read_history(self.path("proxy-%s.jsonl" % host))
        resets = [e["t"] for e in events if e["ev"] == "reset"]
        if len(resets) <= resets_before:
            return {}
        t0 = resets[resets_before]
        by_address = {self.net.address(h): h for h in clients}
        back = {}
        for e in events:
            if e["ev"] == "accept" and e["t"] >= t0:
                who = by_address.get(e["peer"].rsplit(":", 1)[0])
                if who is not None and who not in back:
                    back[who] = round(e["t"] - t0, 2)
        return back

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
        """The topic and the consumers' channel on ``host`` (and the archiver's, when one will run)."""
        base = "http://%s:%d" % (self.net.address(host), NSQD_HTTP)
        channels = (CHANNEL, ARCHIVE_CHANNEL) if self.archiver else (CHANNEL,)
        for url in ["/topic/create?topic=" + TOPIC] + ["/channel/create?topic=%s&channel=%s" % (TOPIC, ch)
                                                        for ch in channels]:
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

    def want_archiver(self):
        """Whether Go's nsq_to_file will run in this cluster (its binary was found); call it before
        :meth:`create_topic`, so that its channel exists from the first message."""
        self.archiver = find_nsq_to_file(self.go_dir)
        return self.archiver is not None

    def start_archiver(self, host="a1"):
        """Go's nsq_to_file (go-nsq's Consumer) on its own channel, through lookupd (polled every second,
        1 s heartbeats as the other clients), writing every body as a line under ``archive-<host>/``."""
        if host not in self.net.hosts:
            self.net.add_host(host)
        out = self.path("archive-" + host)
        os.makedirs(out, exist_ok=True)
        return self.start("archiver-" + host, host, [
            self.archiver, "--topic=" + TOPIC, "--channel=" + ARCHIVE_CHANNEL,
            "--lookupd-http-address=%s:%d" % (self.net.address("l1"), LOOKUPD_HTTP),
            "--output-dir=" + out, "--work-dir=" + out, "--sync-interval=500ms", "--max-in-flight=50",
            "--consumer-opt=heartbeat_interval,1s", "--consumer-opt=lookupd_poll_interval,1s"])

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

    def archived_all(self):
        """Every acked message in the archiver's files (synced every 500 ms)."""
        acked = {str(e["seq"]) for e in self.events("producer-") if e["ev"] == "pub" and e["ok"]}
        return acked <= set(archived(self.dir) or ())

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
        if any(name.startswith("archiver-") for name in self.procs):
            self.wait_for("the archive", self.archived_all, drain_timeout)
        time.sleep(0.5)  # the last FINs
        for name, proc in self.procs.items():
            if name.startswith(("consumer-", "archiver-", "watch", "producer-")) and proc.alive():
                proc.stop(timeout=8.0)
        return check(self)
