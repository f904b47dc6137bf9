"""Real brokers for test suites: in this process (:class:`Broker`) or as a child process (:class:`BrokerProcess`).

::

    from nsqd_threaded.testing import Broker

    with Broker("--msg-timeout=1s", mem_queue_size=100) as nsqd:
        nsqd.tcp_address            # ("127.0.0.1", 40213): the real ephemeral port
        nsqd.http_url               # "http://127.0.0.1:40214"
    # every broker thread joined, every socket and file closed, the data directory removed

A broker takes nsqd's own flags (Go spelling, ``--name=value`` or ``-name value``) as
positional arguments and :class:`~nsqd_threaded.settings.options.Options` fields as keyword arguments
(keywords win; a duration may be given as seconds or as a Go string such as ``"250ms"``).
Unless told otherwise it listens on ``127.0.0.1`` port 0 (TCP and HTTP) and keeps its data in
a new temporary directory that :meth:`~Broker.stop` removes.

Nothing here is module-global: any number of brokers of either kind can run at once.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref

from .internal.gocompat import is_socket_path, join_host_port, parse_duration, split_host_port
from .internal.httpclient import request
from .server.nsqd import NSQD
from .settings.options import BY_FIELD, DURATION, STR_LIST, Options

__all__ = ["Broker", "BrokerProcess", "Cluster", "Lookupd", "LogBuffer", "resolve_options"]

TEMP_PREFIX = "nsqd-threaded-"
LOCALHOST = "127.0.0.1"

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- options ---------------------------------------------------------------------


def resolve_options(flags=(), options=None):
    """The Options fields set by nsqd ``flags`` and then by the ``options`` mapping (which wins).

    Only what was given is returned (a dict), so callers can supply their own
    defaults.  ``flags`` are parsed and resolved exactly as the ``nsqd-threaded``
    command does it (``--config`` files included).  Raises ValueError for a bad
    flag or value, an unknown option name, or a feature that is not built yet;
    the values themselves are checked later by :meth:`Options.validate`.
    """
    return _resolve(flags, options).values


def _resolve(flags, options):
    """:func:`resolve_options`, with the warnings (deprecated flags, unknown config keys) kept."""
    from .settings import config

    values, warnings = {}, []
    if flags:
        values, warnings = config.resolve(*_parse_flags(list(flags)))
    for name, value in (options or {}).items():
        setting = BY_FIELD.get(name)
        if setting is None:
            raise ValueError("unknown nsqd option %r (see nsqd_threaded.settings.options.Options)" % name)
        if setting.kind is DURATION and isinstance(value, str):
            value = parse_duration(value)
        values[name] = value
    return config.Resolved(values, warnings)


def _parse_flags(flags):
    """``(flags, config_file)`` for :func:`config.resolve`, with the command's own parser; ValueError if bad."""
    from . import cli

    click = cli.click  # the click that built the command (not a re-imported copy)

    if any(not isinstance(f, str) for f in flags):
        raise ValueError("nsqd flags must be strings, got %r" % (flags,))
    try:
        given, params = cli.parse(flags)
    except click.exceptions.Exit:
        raise ValueError("nsqd flags %r ask for help, not for a broker" % (flags,)) from None
    except click.ClickException as e:
        raise ValueError("bad nsqd flags %r: %s" % (flags, e.format_message())) from None
    if params.get("version"):
        raise ValueError("--version does not start a broker")
    return given, params.get("config")


def _values_to_flags(values):
    """Options fields -> ``--flag=value`` strings for a child process."""
    flags = []
    for name, value in values.items():
        setting = BY_FIELD.get(name)
        if setting is None or setting.flag is None:
            raise ValueError("option %r has no nsqd flag, so a child process cannot be given it" % name)
        if setting.kind is STR_LIST:  # one flag per item: an item may contain a comma
            flags.extend("--%s=%s" % (setting.flag, v) for v in value)
        else:
            flags.append("--%s=%s" % (setting.flag, setting.kind.format(value)))
    return flags


# -- logs ------------------------------------------------------------------------


class LogBuffer:
    """A thread-safe, in-memory log sink (a write-only text stream), optionally teed to ``tee``.

    ``_cond`` (with its lock) guards ``_parts`` and ``_size``; writers notify it so
    a reader can wait for a line to appear (:meth:`wait_for`).
    """

    def __init__(self, tee=None):
        self._cond = threading.Condition(threading.Lock())
        self._parts = []
        self._size = 0
        self._closed = False
        self.tee = tee

    def write(self, text):
        with self._cond:
            self._parts.append(text)
            self._size += len(text)
            self._cond.notify_all()
        if self.tee is not None:
            try:
                self.tee.write(text)
                self.tee.flush()
            except (OSError, ValueError):
                pass
        return len(text)

    def flush(self):
        pass

    def tell(self):
        """The current length in characters: pass it to :meth:`getvalue` to read only what follows."""
        with self._cond:
            return self._size

    def getvalue(self, start=0):
        with self._cond:
            if len(self._parts) > 1:
                self._parts = ["".join(self._parts)]
            text = self._parts[0] if self._parts else ""
        return text[start:]

    def close(self):
        """No more writes will come (a child's stderr reached EOF): wakes :meth:`wait_for`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self):
        with self._cond:
            return self._closed

    def reopen(self):
        """Expect writes again (the next child process)."""
        with self._cond:
            self._closed = False

    def wait_for(self, predicate, timeout):
        """Wait until ``predicate(text)`` is true or the buffer is closed; returns its last value."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if len(self._parts) > 1:
                    self._parts = ["".join(self._parts)]
                result = predicate(self._parts[0] if self._parts else "")
                remaining = deadline - time.monotonic()
                if result or self._closed or remaining <= 0:
                    return result
                self._cond.wait(remaining)


# -- in-process broker -----------------------------------------------------------


class _Served:
    """What every running daemon here shows a test: its bound addresses, its log, its HTTP API.

    The owner sets ``_tcp_address``, ``_http_address`` (``(host, port)``, a unix socket
    path, or None) and ``_log`` (a :class:`LogBuffer`).
    """

    # -- addresses -------------------------------------------------------------

    @property
    def tcp_address(self):
        """The bound TCP ``(host, port)`` or socket path (the last one, once stopped)."""
        return self._tcp_address

    @property
    def http_address(self):
        """The bound HTTP ``(host, port)`` or socket path, or None when HTTP is disabled."""
        return self._http_address

    @property
    def tcp_addr(self):
        """``"host:port"`` of the TCP listener (what pynsq and go-nsq take), or its socket path."""
        return _address_text(self._tcp_address)

    @property
    def http_addr(self):
        return _address_text(self._http_address)

    @property
    def http_url(self):
        """``http://host:port``; None when HTTP is disabled or on a unix socket (no URL names one)."""
        if not self._http_address or isinstance(self._http_address, str):
            return None
        return "http://" + self.http_addr

    # -- logs and HTTP ---------------------------------------------------------

    @property
    def log(self):
        """Everything the daemon has logged so far."""
        return self._log.getvalue()

    def log_position(self):
        return self._log.tell()

    def log_since(self, position):
        return self._log.getvalue(position)

    def http(self, method, path, body=None, timeout=10.0):
        """One request to the HTTP API: ``(status, body bytes)``."""
        return _http(self._http_address, method, path, body, timeout)


class _ServedBroker(_Served):
    """A served nsqd: its settings, log, data directory and addresses; also its /stats."""

    def _init_broker(self, values, log_stream, tmp_dir):
        """``__init__``'s common part: resolved ``values``, the log, where the data directory goes."""
        self._values = values
        self._log = LogBuffer(log_stream)
        self._tmp_dir = tmp_dir
        self._lock = threading.Lock()
        self._own_data_path = "data_path" not in values  # a temporary one, made at start
        self.data_path = values.get("data_path")
        self._tcp_address = None
        self._http_address = None

    def __enter__(self):
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stats(self, **params):
        """``/stats?format=json`` (plus ``topic=``, ``channel=`` ... params) as a dict."""
        return _stats(self._http_address, params)


class Broker(_ServedBroker):
    """A complete nsqd (:class:`~nsqd_threaded.NSQD`) in this process, for a test.

    ``Broker(*flags, log_stream=None, tmp_dir=None, **options)``: ``flags`` are nsqd
    flags, ``options`` are :class:`~nsqd_threaded.settings.options.Options` fields.  The log is
    kept in memory (:attr:`log`) and also written to ``log_stream`` if given.  The
    temporary data directory is created in ``tmp_dir`` (default: the system's).

    ``_lock`` serializes start/stop/restart.
    """

    def __init__(self, *flags, log_stream=None, tmp_dir=None, **options):
        values, self._warnings = _resolve(flags, options)
        self._init_broker(values, log_stream, tmp_dir)
        self.nsqd = None  # the NSQD (kept after stop() for inspection)
        self.running = False

    # -- lifecycle -------------------------------------------------------------

    def start(self):
        """Start the broker; returns self.  Raises what NSQD.start raises (nothing is left behind)."""
        with self._lock:
            if self.running:
                raise RuntimeError("broker already running")
            made = False
            if self._own_data_path and self.data_path is None:
                self.data_path = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=self._tmp_dir)
                made = True
            try:
                self._start_nsqd(self._options())
            except BaseException:
                if made:
                    shutil.rmtree(self.data_path, ignore_errors=True)
                    self.data_path = None
                raise
        return self

    def _options(self, tcp_address=None, http_address=None):
        values = {"tcp_address": "%s:0" % LOCALHOST, "http_address": "%s:0" % LOCALHOST}
        values.update(self._values)
        values["data_path"] = self.data_path
        if tcp_address is not None:
            values["tcp_address"] = tcp_address
        if http_address is not None:
            values["http_address"] = http_address
        return Options(**values)

    def _start_nsqd(self, options):
        nsqd = NSQD(options, log_stream=self._log)
        for warning in self._warnings:
            nsqd.log.warn("%s", warning)
        nsqd.start()
        self.nsqd = nsqd
        self._tcp_address = nsqd.tcp_address
        self._http_address = nsqd.http_address
        self.running = True

    def stop(self):
        """Stop the broker (every thread joined, every socket closed) and remove its temporary data."""
        with self._lock:
            try:
                if self.running:
                    self.running = False
                    self.nsqd.stop()
            finally:
                if self._own_data_path and self.data_path is not None:
                    shutil.rmtree(self.data_path, ignore_errors=True)
                    self.data_path = None

    def restart(self):
        """Stop and start again on the same ports with the same data directory (nsqd.dat survives)."""
        with self._lock:
            if not self.running:
                raise RuntimeError("broker is not running")
            self.running = False
            self.nsqd.stop()
            http = _address_text(self._http_address) or ""
            self._start_nsqd(self._options(_address_text(self._tcp_address), http))
        return self

    def __repr__(self):
        state = "running" if self.running else "stopped"
        return "<Broker tcp=%s http=%s %s>" % (self.tcp_addr, self.http_addr, state)



# -- child-process broker --------------------------------------------------------


class BrokerProcess(_ServedBroker):
    """``nsqd-threaded`` as a child process, for tests that crash or restart the broker.

    ``BrokerProcess(*flags, command=None, tmp_dir=None, env=None, log_stream=None,
    start_timeout=10.0, stop_timeout=10.0, **options)``.  ``command`` defaults to
    ``[sys.executable, "-m", "nsqd_threaded"]`` (any nsqd-compatible command works:
    readiness is read from its ``TCP: listening on`` / ``HTTP: listening on`` log
    lines).  :meth:`start` returns once both listeners are bound; :meth:`kill` is a
    crash (SIGKILL, data directory kept); :meth:`restart` starts it again on the same
    ports; :meth:`stop` is a graceful SIGTERM and removes the temporary data.

    ``_lock`` serializes start/stop/kill/restart.
    """

    _TCP_RE = re.compile(r"TCP: listening on (\S+)")
    _HTTP_RE = re.compile(r"HTTP: listening on (\S+)")

    def __init__(
        self,
        *flags,
        command=None,
        tmp_dir=None,
        env=None,
        log_stream=None,
        start_timeout=10.0,
        stop_timeout=10.0,
        **options
    ):
        self._init_broker(resolve_options(flags, options), log_stream, tmp_dir)  # checks the flags first
        self._flags = list(flags) + _values_to_flags({k: self._values[k] for k in options})
        self.command = list(command) if command else [sys.executable, "-m", "nsqd_threaded"]
        self._env = env
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._http_enabled = self._values.get("http_address", "x") != ""
        self.proc = None
        self._reader = None
        self._finalizer = None

    # -- lifecycle -------------------------------------------------------------

    def start(self):
        """Spawn the broker and wait until it listens (not a sleep: its log says so)."""
        with self._lock:
            if self.running:
                raise RuntimeError("broker process already running")
            made = self._own_data_path and self.data_path is None
            try:
                self._spawn()
            except BaseException:
                self._reap(signal.SIGKILL)
                if made and self.data_path is not None:
                    shutil.rmtree(self.data_path, ignore_errors=True)
                    self.data_path = None
                raise
        return self

    def _args(self):
        args = list(self.command)
        if "tcp_address" not in self._values:
            port = self._tcp_address[1] if self._tcp_address else 0
            args.append("--tcp-address=%s:%d" % (LOCALHOST, port))
        if "http_address" not in self._values:
            port = self._http_address[1] if self._http_address else 0
            args.append("--http-address=%s:%d" % (LOCALHOST, port))
        if self._own_data_path:
            args.append("--data-path=%s" % self.data_path)
        return args + self._flags

    def _spawn(self):
        if self._own_data_path and self.data_path is None:
            self.data_path = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=self._tmp_dir)
        env = dict(os.environ if self._env is None else self._env)
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
        args = self._args()
        offset = self._log.tell()
        self._log.reopen()
        self._log.write("--- started: %s\n" % " ".join(args))
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self.proc = proc
        self._finalizer = weakref.finalize(self, _kill_quietly, proc)
        self._reader = threading.Thread(
            target=_pump_lines, args=(proc.stderr, self._log), name="nsqd-process-log[%d]" % proc.pid, daemon=True
        )
        self._reader.start()

        def ready(text):
            text = text[offset:]
            tcp = self._TCP_RE.search(text)
            http = self._HTTP_RE.search(text) if self._http_enabled else True
            return (tcp, http) if tcp and http else None

        found = self._log.wait_for(ready, self.start_timeout)
        if not found:
            if self._log.closed:  # its stderr ended: it is exiting
                try:
                    proc.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    pass
            status = proc.poll()
            why = "exited with status %s" % status if status is not None else "not ready in %gs" % self.start_timeout
            raise RuntimeError("nsqd process %s; its log:\n%s" % (why, self._log.getvalue(offset)))
        tcp, http = found
        self._tcp_address = _logged_address(tcp.group(1))
        self._http_address = _logged_address(http.group(1)) if self._http_enabled else None

    def _reap(self, sig):
        """Signal the process (if alive), wait for it, join the log reader."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join()
            self._reader = None
            self._log.write("--- exited with status %s\n" % proc.returncode)
        proc.stderr.close()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def kill(self):
        """Crash the broker: SIGKILL, nothing flushed.  The data directory stays for :meth:`restart`."""
        with self._lock:
            self._reap(signal.SIGKILL)

    def terminate(self):
        """Graceful shutdown (SIGTERM); the data directory stays for :meth:`restart`."""
        with self._lock:
            self._reap(signal.SIGTERM)

    def restart(self, kill=False):
        """Stop (SIGTERM, or SIGKILL when ``kill``) and start again on the same ports and data directory."""
        with self._lock:
            self._reap(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self._spawn()
            except BaseException:
                self._reap(signal.SIGKILL)
                raise
        return self

    def stop(self):
        """SIGTERM and wait (SIGKILL after ``stop_timeout``); remove the temporary data directory."""
        with self._lock:
            try:
                self._reap(signal.SIGTERM)
            finally:
                if self._own_data_path and self.data_path is not None:
                    shutil.rmtree(self.data_path, ignore_errors=True)
                    self.data_path = None

    def __repr__(self):
        pid = self.proc.pid if self.proc else None
        state = "running" if self.running else "stopped"
        return "<BrokerProcess pid=%s tcp=%s http=%s %s>" % (pid, self.tcp_addr, self.http_addr, state)

    # -- state -----------------------------------------------------------------

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    @property
    def returncode(self):
        return self.proc.poll() if self.proc else None



def _pump_lines(stream, buf):
    """Copy a child's stderr into ``buf`` line by line until EOF (the log-reader thread)."""
    try:
        for raw in iter(stream.readline, b""):
            buf.write(raw.decode("utf-8", "replace"))
    except (OSError, ValueError):
        pass
    finally:
        buf.close()


def _kill_quietly(proc):
    """At interpreter exit: never leave a child broker behind."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


# -- HTTP helpers ----------------------------------------------------------------


def _address_text(address):
    """``(host, port)`` -> ``"host:port"``; a socket path stays itself; None stays None."""
    if not address:
        return None
    return address if isinstance(address, str) else join_host_port(*address)


def _logged_address(text):
    """A ``listening on`` log line's address -> ``(host, port)``, or the socket path."""
    if is_socket_path(text):
        return text
    host, port = split_host_port(text)
    return host, port


def _http(address, method, path, body, timeout):
    if address is None:
        raise RuntimeError("HTTP is disabled on this broker")
    if isinstance(body, str):
        body = body.encode()
    host, port = (address, None) if isinstance(address, str) else address  # a str: a unix socket path
    status, _, data = request(method, host, port, path, body,
                              connect_timeout=timeout, deadline=time.monotonic() + timeout)
    return status, data


def _stats(address, params):
    from urllib.parse import urlencode

    query = dict(params, format="json")
    status, body = _http(address, "GET", "/stats?" + urlencode(query), None, 10.0)
    if status != 200:
        raise RuntimeError("/stats answered %d: %r" % (status, body))
    return json.loads(body)


# -- nsqlookupd and a cluster ----------------------------------------------------


class Lookupd(_Served):
    """An nsqlookupd (:class:`~nsqd_threaded.lookupd.NSQLookupd`) in this process, for a test.

    ``Lookupd(log_stream=None, log_level="info", **overrides)``: ``overrides`` are
    :class:`~nsqd_threaded.lookupd.LookupdOptions` fields (durations in seconds, e.g.
    ``inactive_producer_timeout=1``).  It listens on ``127.0.0.1`` port 0 (TCP and HTTP)
    and gives peers the broadcast address ``127.0.0.1``; its log is kept in memory
    (:attr:`log`) and also written to ``log_stream`` if given.  The object is single-use
    as NSQLookupd is: :meth:`restart` makes a new one on the same ports.
    """

    log_name = "nsqlookupd"  # the pytest plugin's "Captured nsqlookupd log" sections

    def __init__(self, log_stream=None, log_level="info", **overrides):
        self._log = LogBuffer(log_stream)
        self._log_level = log_level
        self._overrides = overrides
        self.lookupd = None  # the NSQLookupd (kept after stop() for inspection)
        self.running = False
        self._tcp_address = self._http_address = None

    def start(self):
        from .internal.logger import Logger
        from .lookupd import NSQLookupd

        overrides = dict(self._overrides)
        if self._tcp_address is not None:  # a restart: the same ports
            overrides.setdefault("tcp_address", _address_text(self._tcp_address))
            overrides.setdefault("http_address", _address_text(self._http_address))
        lookupd = NSQLookupd.local(logger=Logger("[nsqlookupd] ", self._log_level, self._log), **overrides)
        lookupd.start()
        self.lookupd = lookupd
        self._tcp_address, self._http_address = lookupd.tcp_address, lookupd.http_address
        self.running = True
        return self

    def stop(self):
        if self.running:
            self.running = False
            self.lookupd.stop()

    def restart(self):
        """Stop, then start a new NSQLookupd on the same ports (its registrations start empty)."""
        self.stop()
        return self.start()

    def __enter__(self):
        return self.start() if not self.running else self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return "<Lookupd tcp=%s http=%s %s>" % (self.tcp_addr, self.http_addr, "running" if self.running else "stopped")

    @property
    def db(self):
        """The registration DB, for assertions."""
        return self.lookupd.db


    def get(self, path):
        """``GET path`` as a dict (the v1 API); RuntimeError unless 200."""
        status, body = _http(self._http_address, "GET", path, None, 10.0)
        if status != 200:
            raise RuntimeError("%s answered %d: %r" % (path, status, body))
        return json.loads(body)

    def lookup(self, topic):
        """The ``"host:port"`` of each producer ``/lookup?topic=`` lists (sorted; [] if the topic is unknown)."""
        from urllib.parse import quote

        status, body = _http(self._http_address, "GET", "/lookup?topic=" + quote(topic, safe=""), None, 10.0)
        if status == 404:
            return []
        if status != 200:
            raise RuntimeError("/lookup answered %d: %r" % (status, body))
        return sorted(_producer_addr(p) for p in json.loads(body)["producers"])

    def nodes(self):
        """The ``"host:port"`` (TCP) of each nsqd ``/nodes`` lists, sorted."""
        return sorted(_producer_addr(p) for p in self.get("/nodes")["producers"])


def _producer_addr(producer):
    return join_host_port(producer["broadcast_address"], producer["tcp_port"])


class Cluster:
    """One :class:`Lookupd` and ``n`` brokers registered with it, for a test.

    ``Cluster(n=3, *flags, processes=False, lookupd=None, tmp_dir=None, log_stream=None,
    start_timeout=10.0, **options)``: ``flags`` and ``options`` go to every broker (as for
    :class:`Broker`), which also gets ``--lookupd-tcp-address`` and the broadcast address
    ``127.0.0.1``; ``processes=True`` makes them :class:`BrokerProcess` (to ``kill()``);
    ``lookupd`` is a dict of :class:`Lookupd` keyword arguments.  :meth:`start` returns
    once the lookupd lists every broker in ``/nodes``; :meth:`stop` stops the brokers,
    then the lookupd.
    """

    def __init__(self, n=3, *flags, processes=False, lookupd=None, tmp_dir=None, log_stream=None,
                 start_timeout=10.0, **options):
        if n < 1:
            raise ValueError("a cluster needs at least one broker")
        self.n = n
        self.processes = processes
        self.start_timeout = start_timeout
        self.lookupd = Lookupd(log_stream=log_stream, **(lookupd or {}))
        self.brokers = []
        # What each broker is made with; start() adds the lookupd's address (known once it listens).
        self._broker_flags = flags
        self._broker_options = dict(options, tmp_dir=tmp_dir, log_stream=log_stream)

    def start(self):
        self.lookupd.start()
        try:
            options = dict(self._broker_options)
            options.setdefault("nsqlookupd_tcp_addresses", [self.lookupd.tcp_addr])
            options.setdefault("broadcast_address", LOCALHOST)
            kind = BrokerProcess if self.processes else Broker
            for _ in range(self.n):
                broker = kind(*self._broker_flags, **options)
                self.brokers.append(broker)
                broker.start()
            self.wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_registered(self, brokers=None, timeout=None):
        """Wait until the lookupd's ``/nodes`` lists ``brokers`` (default: every running one)."""
        brokers = [b for b in self.brokers if b.running] if brokers is None else brokers
        wanted = {b.tcp_addr for b in brokers}
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while not wanted <= set(self.lookupd.nodes()):
            if time.monotonic() > deadline:
                raise RuntimeError("brokers %s not registered with the lookupd within the timeout (it lists %s)"
                                   % (sorted(wanted), self.lookupd.nodes()))
            time.sleep(0.005)  # polling with a deadline: nothing to wait on across processes

    def stop(self):
        errors = []
        for broker in reversed(self.brokers):
            try:
                broker.stop()
            except Exception as e:  # stop the others anyway
                errors.append(e)
        self.lookupd.stop()
        if errors:
            raise errors[0]

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def __getitem__(self, i):
        return self.brokers[i]

    def __iter__(self):
        return iter(self.brokers)

    def __len__(self):
        return len(self.brokers)

    def __repr__(self):
        return "<Cluster lookupd=%s brokers=%s>" % (self.lookupd.http_addr, [b.tcp_addr for b in self.brokers])

    @property
    def tcp_addrs(self):
        """Every broker's ``"host:port"`` (TCP), as a Producer or pynsq's nsqd_tcp_addresses take them."""
        return [b.tcp_addr for b in self.brokers]

    @property
    def lookupd_http_addrs(self):
        """``["host:port"]`` of the lookupd's HTTP API, as a Consumer or pynsq's lookupd_http_addresses take it."""
        return [self.lookupd.http_addr]
