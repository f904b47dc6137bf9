"""The bottom layer of the benchmarks: broker processes and what /proc says about them.

* :class:`BrokerProc`: a broker (Go's nsqd, ours from some tree, or the floor probe)
  as a child process on an ephemeral 127.0.0.1 port in a fresh data directory;
* :func:`cpu_seconds`: a process's user + system CPU time, from ``/proc/PID/stat``;
* :func:`listening_address`: the port a process listens on, from ``/proc``;
* :class:`Quiet`: is the machine quiet enough to measure (load average, and the CPU
  other processes use while none of ours runs);
* :func:`run_workers`: N load-generator processes started at one instant.
"""

import http.client
import json
import multiprocessing
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from . import ROOT

FLOOR_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor.py")
# The floor probe's servers: floor.py's mode for each BrokerProc kind.
FLOOR_MODES = {"floor": "serve", "floor-consumers": "serve-consumers"}


class BrokerProc:
    """One broker child process on an ephemeral port, in a fresh data dir.

    ``kind`` is ``go`` (``argv0`` is the nsqd binary), ``floor`` or ``floor-consumers``
    (``argv0`` is a Python interpreter running floor.py ``serve`` or ``serve-consumers``)
    or anything else: this project's broker under the interpreter ``argv0``, imported
    from the tree ``root``.

    ``http``: the broker also listens for HTTP on 127.0.0.1 (``http_address``;
    not the floor), for the phases that create, inspect or empty channels.

    ``wrapper``: a command that runs the broker (such as valgrind's), given the interpreter
    or binary itself, not a shim that execs it (valgrind would follow the shim only).
    """

    def __init__(self, kind, argv0, flags=(), root=ROOT, http=False, wrapper=()):
        self.kind = kind
        self.http_address = None
        self.data = tempfile.mkdtemp(prefix="nsqd-bench-%s-" % kind)
        env = dict(os.environ)
        cwd = None
        if kind == "go":
            cmd = [argv0]
        elif kind in FLOOR_MODES:
            cmd = [argv0, FLOOR_SCRIPT, FLOOR_MODES[kind]]
            flags = ()  # the floor has no options: it keeps everything in memory
        else:
            cmd = [argv0, "-m", "nsqd_threaded"]
            env["PYTHONPATH"] = root
            # ``-m`` puts the working directory first on sys.path, ahead of PYTHONPATH,
            # so a baseline tree's broker must start there to import that tree's package.
            cwd = root
        if kind not in FLOOR_MODES:
            if http:  # a port chosen here: /proc cannot tell which of two listeners is HTTP
                self.http_address = "127.0.0.1:%d" % free_port()
            cmd += ["--tcp-address=127.0.0.1:0", "--http-address=" + (self.http_address or ""),
                    "--data-path=" + self.data, "--log-level=warn"]
        if wrapper:
            cmd = list(wrapper) + [os.path.realpath(cmd[0])] + cmd[1:]
        self.proc = subprocess.Popen(cmd + list(flags), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=env, cwd=cwd)
        self._stderr = threading.Thread(target=self.proc.stderr.read, name="bench-stderr-%s" % kind, daemon=True)
        self._stderr.start()
        deadline = time.monotonic() + (300 if wrapper else 30)
        self.address = None
        while self.address is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("%s broker did not start" % kind)
            self.address = listening_address(self.proc.pid, exclude=self.http_address)
            if self.address is not None and self.http_address is not None and \
                    listening_address(self.proc.pid, exclude=self.address) != self.http_address:
                self.address = None  # the HTTP listener is not up yet
            if self.address is None:
                time.sleep(0.02)  # polling /proc for the listener, bounded by the deadline
        self.pid = self.proc.pid

    def cpu_seconds(self):
        return cpu_seconds(self.pid)

    def cpu_split(self):
        return cpu_split(self.pid)

    def http(self, method, path):
        """An HTTP request to the broker (``http=True``); returns the body, raises on a status >= 300."""
        host, port = self.http_address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        if resp.status >= 300:
            raise RuntimeError("%s %s: %d %s" % (method, path, resp.status, body[:200]))
        return body

    def stats(self, topic):
        """``/stats`` of one topic as a dict (Go's and ours; None if it does not exist)."""
        doc = json.loads(self.http("GET", "/stats?format=json&include_clients=false&topic=" + topic))
        doc = doc.get("data", doc)  # (an enveloped answer, as older nsqd sent)
        for t in doc.get("topics") or ():
            if t["topic_name"] == topic:
                return t
        return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.join(10)
        shutil.rmtree(self.data, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def cpu_seconds(pid):
    """User + system CPU time of a process so far, from /proc (clock-tick resolution)."""
    return sum(cpu_split(pid))


def cpu_split(pid):
    """``(user, system)`` CPU seconds of a process so far, from /proc (clock-tick resolution): the
    system part is the kernel's work for it (its syscalls: here mostly the sockets' sends and recvs)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def free_port():
    """An ephemeral 127.0.0.1 port free now (for a listener whose port /proc cannot single out)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_address(pid, exclude=None):
    """The TCP port a process listens on, from /proc (no log parsing, any log level);
    ``exclude``: an address to skip (a second listener)."""
    try:
        inodes = set()
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            m = re.match(r"socket:\[(\d+)\]", link)
            if m:
                inodes.add(m.group(1))
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:
                    address = "127.0.0.1:%d" % int(parts[1].split(":")[1], 16)
                    if address != exclude:
                        return address
    except OSError:
        return None
    return None


def interpreter(python):
    """``CPython 3.11.7``-style name of an interpreter."""
    return subprocess.run([python, "-c", "import platform;print(platform.python_implementation(), "
                           "platform.python_version())"], capture_output=True, text=True).stdout.strip()


# -- is the machine quiet? ----------------------------------------------------------


def load_average():
    """The 1-minute load average."""
    return os.getloadavg()[0]


def host_busy_seconds():
    """CPU seconds the whole machine has spent busy so far, every CPU together (/proc/stat: all
    but idle and iowait).  Its difference over a span, divided by the span, is cores kept busy."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def busy_cores(window=1.0):
    """CPU the whole machine used over ``window`` seconds, in cores (from /proc/stat)."""
    busy0 = host_busy_seconds()
    t0 = time.monotonic()
    time.sleep(window)  # the sampling window itself
    busy1 = host_busy_seconds()
    return max(0.0, (busy1 - busy0) / (time.monotonic() - t0))


class Quiet:
    """The quiet-machine check made before every phase.

    The 1-minute load average alone cannot tell: the harness's own previous phase
    (two busy processes for several seconds) lifts it above 1 within a minute of
    back-to-back phases, and it falls with a one-minute time constant.  So before each
    phase, while no broker or load of ours runs, two readings are taken:

    * ``load``: the 1-minute load average (recorded; it gates the run's start, when
      nothing of ours has run yet);
    * ``others``: the cores the rest of the machine keeps busy during one second
      (``/proc/stat``): what other processes take from the measurement, now.

    A phase measured with ``others`` above ``max_others`` (or started with the load
    average above ``max_load`` before the first phase) is LOADED.
    """

    def __init__(self, max_load=1.0, max_others=0.25, window=1.0):
        self.max_load = max_load
        self.max_others = max_others
        self.window = window
        self.start_load = load_average()
        self.readings = []  # (load, others) before each phase

    def check(self):
        """Read the machine now; True if it is quiet enough for the next phase."""
        load, others = load_average(), busy_cores(self.window)
        self.readings.append((load, others))
        return others <= self.max_others and self.start_load <= self.max_load

    def start_is_quiet(self):
        return self.start_load <= self.max_load

    def summary(self):
        if not self.readings:
            return "load average %.2f at the start" % self.start_load
        return ("load average %.2f at the start, %.2f-%.2f before the phases; other processes' CPU before the "
                "phases %.2f-%.2f cores" % (self.start_load, min(r[0] for r in self.readings),
                                            max(r[0] for r in self.readings), min(r[1] for r in self.readings),
                                            max(r[1] for r in self.readings)))


# -- load-generator processes ----------------------------------------------------------


class StartGate:
    """The instant N worker processes start their load: once every one is ready (connected).

    A fixed instant would leave a worker that a loaded machine forks or schedules late
    with little or none of its window (a short run then measures nothing).  Made in the
    parent before the workers; each worker calls :meth:`wait` when ready, the parent
    :meth:`open` once the workers are started.
    """

    def __init__(self, workers):
        self.workers = workers
        self._ready = multiprocessing.Semaphore(0)  # one release per ready worker
        self._start = multiprocessing.Value("d", 0.0)  # the start instant (time.time()), 0.0 until open()

    def wait(self):
        """In a worker: report ready, and return the start instant once it has come."""
        self._ready.release()
        while not self._start.value:
            time.sleep(0.001)  # polling the gate: the parent sets it once every worker is ready
        start = self._start.value
        while time.time() < start:
            time.sleep(0.001)
        return start

    def open(self, timeout=60.0):
        """In the parent: wait for every worker, then set the start instant (just ahead)."""
        for _ in range(self.workers):
            if not self._ready.acquire(timeout=timeout):
                raise RuntimeError("a load worker was not ready within %gs" % timeout)
        self._start.value = time.time() + 0.02


def run_workers(target, args, runfor, connections=None):
    """Run ``target(*args, runfor, gate, result_queue)`` in N processes; returns their results.

    Each worker gets ready (connects), then ``start = gate.wait()``, loads until
    ``start + runfor`` and puts its result: every worker starts at the same instant,
    once all are ready (:class:`StartGate`).
    """
    connections = connections or os.cpu_count() or 1
    result = multiprocessing.Queue()
    gate = StartGate(connections)
    procs = [
        multiprocessing.Process(target=target, args=tuple(args) + (runfor, gate, result))
        for _ in range(connections)
    ]
    for p in procs:
        p.start()
    gate.open()
    results = [result.get(timeout=runfor + 60) for _ in procs]
    for p in procs:
        p.join()
    return results


# -- drain benchmarks: the same job on several brokers, alternately -------------------------


def drain_rounds(brokers, rounds, messages, run):
    """Run ``run(kind, argv0, root)`` for each ``(kind, argv0, root)`` broker, alternating the order
    from round to round; ``run`` returns ``(seconds, broker CPU us per message, ...)``.  Prints each
    run, then a table of medians (msg/s, CPU) with the ratio to the first broker; returns the results."""
    quiet = Quiet()
    print("load average at start: %.2f" % quiet.start_load, flush=True)
    results = {kind: [] for kind, _, _ in brokers}
    for rnd in range(rounds):
        for kind, argv0, root in (brokers if rnd % 2 == 0 else brokers[::-1]):
            row = run(kind, argv0, root)
            results[kind].append(row)
            print("round %d %-4s %.2f s (%.0f msg/s), %.1f us broker CPU/msg%s"
                  % (rnd + 1, kind, row[0], messages / row[0], row[1],
                     "".join(", %s" % extra for extra in row[2:])), file=sys.stderr, flush=True)
    first = brokers[0][0]
    reference = messages / statistics.median(r[0] for r in results[first])
    print("%-5s %12s %14s %10s" % ("", "msg/s", "CPU us/msg", "of " + first))
    for kind, rows in results.items():
        rate = messages / statistics.median(r[0] for r in rows)
        print("%-5s %12.0f %14.1f %10.2f" % (kind, rate, statistics.median(r[1] for r in rows), rate / reference))
    return results
