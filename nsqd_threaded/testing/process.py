"""BrokerProcess: nsqd-threaded (or any nsqd command) as a child process, for crash and restart tests."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref

from .flags import resolve_options, values_to_flags
from .forkserver import ForkServer
from .served import LOCALHOST, TEMP_PREFIX, ServedBroker, logged_address
from .waiting import messages_over_http, wait_over_http
from .skipping import http_advance, http_next_deadline_in, http_time

__all__ = ["BrokerProcess"]

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BrokerProcess(ServedBroker):
    """``nsqd-threaded`` as a child process, for tests that crash or restart the broker.

    ``BrokerProcess(*flags, command=None, tmp_dir=None, env=None, log_stream=None,
    start_timeout=10.0, stop_timeout=10.0, **options)``.  ``command`` defaults to
    ``[sys.executable, "-m", "nsqd_threaded"]``, which is not exec'd but forked by this
    process's :class:`~nsqd_threaded.testing.forkserver.ForkServer` (the same command,
    already imported: see there); any nsqd-compatible command works and is exec'd
    (readiness is read from its ``TCP: listening on`` / ``HTTP: listening on`` log
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
        self._flags = list(flags) + values_to_flags({k: self._values[k] for k in options})
        self._default_command = not command  # ours: the test-only flags below are given (another may lack them)
        self.command = list(command) if command else [sys.executable, "-m", "nsqd_threaded"]
        self._forked = not command and ForkServer.available()  # the default command is forked
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
        if self._default_command:  # a test broker, as Broker's
            if "channel_peek" not in self._values:
                args.append("--channel-peek=true")  # for messages()
            if "time_skipping" not in self._values:
                args.append("--time-skipping=true")  # for advance()
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
        if self._forked:
            proc = ForkServer.shared().spawn(args[len(self.command):], env)
        else:
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
        self._tcp_address = logged_address(tcp.group(1))
        self._http_address = logged_address(http.group(1)) if self._http_enabled else None

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

    # -- looking inside -------------------------------------------------------------

    def wait_until(self, topic, channel=None, timeout=10.0, **expected):
        """:meth:`Broker.wait_until <nsqd_threaded.testing.Broker.wait_until>` across the process
        boundary: asks ``/stats`` over HTTP every few milliseconds until it matches or
        ``timeout`` passes (a broker that does not answer, restarting, is "not yet")."""
        return wait_over_http(self, topic, channel, timeout, expected)

    def messages(self, topic, channel):
        """:meth:`Broker.messages <nsqd_threaded.testing.Broker.messages>` over HTTP
        (``GET /channel/peek``, which the default command serves; whole bodies)."""
        return messages_over_http(self, topic, channel)
    # -- time skipping -----------------------------------------------------------

    def advance(self, seconds=None):
        """:meth:`Broker.advance` over ``POST /debug/time/skip`` (the child runs with ``--time-skipping``).
        RuntimeError for a broker that cannot skip time (another ``command``, such as Go's nsqd)."""
        return http_advance(self._http_address, seconds, repr(self))

    def sync(self, timeout=10.0):
        """:meth:`Broker.sync` over ``POST /debug/sync`` (a child run with ``--time-skipping``): call it
        before :meth:`kill` for a crash that loses and duplicates nothing acknowledged (``--durable``)."""
        status, body = self.http("POST", "/debug/sync", timeout=timeout + 10)
        if status != 200:
            raise RuntimeError("/debug/sync answered %d: %r" % (status, body))

    def now(self):
        """:meth:`Broker.now` over ``GET /debug/time``."""
        return http_time(self._http_address, repr(self))["now_ns"] / 1e9

    def next_deadline_in(self):
        """:meth:`Broker.next_deadline_in` over ``GET /debug/time``."""
        return http_next_deadline_in(self._http_address, repr(self))

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
