"""ForkServer: child brokers forked from a process that has already imported the package.

A ``BrokerProcess`` spent most of its start in a new interpreter importing the
package (the broker itself binds its listeners in a few milliseconds), and most
of its stop in the interpreter's shutdown after the broker had stopped.  A fork
server pays both once per test process: it is a child process that imports the
command, starts NO thread, and forks one broker process per request.  Each
broker process is then what an exec'd one was: its own pid (that
:meth:`ForkedProcess.kill` SIGKILLs), its own stderr, its own memory (nothing
is shared with the test process, which is not its parent: the fork server is),
and it is reaped by the fork server, which reports the exit status to the test
process.  A broker process ends with ``os._exit`` once its command returns,
after the atexit handlers (where coverage saves what it measured in it):
the broker's stop has already flushed and closed everything it wrote.

What a broker process still does itself is kept small, because in a forked
process every page it touches is copied first: the fork server parses each
command line before it forks (:func:`_parse_ahead`), and it froze what it had
allocated out of the cyclic gc (whose passes would touch all of it).

The requests go over a ``SOCK_SEQPACKET`` socket pair, one message each
(``send_fds``: the arguments, environment and working directory as JSON, with
two descriptors: the write end of the broker's stderr pipe, and the fork
server's end of a status socket pair whose other end the test process keeps).
On the status socket the fork server writes ``pid N`` after the fork and
``exit STATUS CPU`` (a ``waitpid`` status, and the user + system seconds it used)
once it has reaped the broker process.
When the test process goes away (even by SIGKILL) the request socket reads
EOF: the fork server SIGKILLs the broker processes it still has, reaps them and
exits, so nothing outlives the test process.

Python fixes a process's start-up state at fork: ``env`` replaces
``os.environ`` in the broker process but modules read it when the fork server
imported them.  A custom ``BrokerProcess(command=...)`` is exec'd as before.
"""

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time


__all__ = ["ForkServer", "ForkedProcess"]

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MAX_REQUEST = 1 << 20
_READY = b"ready"


class ForkServer:
    """The test process's handle on one fork server (started on first use by :meth:`spawn`).

    :meth:`shared` is the one every ``BrokerProcess`` of this process uses; a
    ``ForkServer()`` of one's own works too, and :meth:`close` ends it (its
    broker processes with it).  ``_lock`` guards ``_proc`` and ``_requests``
    (one request at a time on the socket, and a single start).
    """

    _shared = None  # the process-wide one; see shared()
    _shared_lock = threading.Lock()  # guards _shared

    def __init__(self, executable=None, start_timeout=30.0):
        self.executable = executable or sys.executable
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._proc = None
        self._requests = None
        self._owner_pid = os.getpid()
        self._closes_at_exit = False

    @classmethod
    def shared(cls):
        """This process's fork server: one per test process, started by the first broker that needs it.

        The one process-wide object here, and on purpose: a fork server costs an
        interpreter start, and it holds nothing a broker could see (each broker is a
        fresh fork).  A forked test process (its pid differs) gets its own."""
        with cls._shared_lock:
            server = cls._shared
            if server is None or server._owner_pid != os.getpid():
                server = cls._shared = cls()
            return server

    @staticmethod
    def available():
        """Whether this platform has what a fork server needs (Linux: fork, descriptors over
        ``SOCK_SEQPACKET`` unix sockets); elsewhere ``BrokerProcess`` executes its command."""
        return (sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(socket, "send_fds")
                and hasattr(socket, "SOCK_SEQPACKET"))

    @property
    def pid(self):
        """The fork server's pid, or None before it started."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self):
        return self._proc is not None and self._proc.poll() is None

    def spawn(self, args, env=None, cwd=None):
        """Fork a process that runs the ``nsqd-threaded`` command with ``args``: a :class:`ForkedProcess`."""
        request = json.dumps({"args": list(args), "env": dict(os.environ if env is None else env),
                              "cwd": cwd or os.getcwd()}).encode()
        if len(request) > _MAX_REQUEST:
            raise ValueError("fork server request too large (%d bytes)" % len(request))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        err_read, err_write = os.pipe()
        try:
            with self._lock:
                self._start_locked()
                try:
                    socket.send_fds(self._requests, [request], [theirs.fileno(), err_write])
                except OSError as e:
                    raise RuntimeError("the fork server (pid %s) is gone: %s" % (self.pid, e)) from None
        except BaseException:
            ours.close()
            os.close(err_read)
            raise
        finally:
            theirs.close()
            os.close(err_write)
        child = ForkedProcess(ours, os.fdopen(err_read, "rb"))
        try:
            child.read_pid(self.start_timeout)
        except BaseException:
            child.close()
            raise
        return child

    def start(self):
        """Start the fork server unless it runs (:meth:`spawn` does it when needed); returns it."""
        with self._lock:
            self._start_locked()
        return self

    def _start_locked(self):
        if self.running:
            return
        self._close_locked()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
        try:
            self._proc = subprocess.Popen(
                [self.executable, "-c", "from nsqd_threaded.testing.forkserver import serve; serve()"],
                stdin=theirs.fileno(), stdout=subprocess.DEVNULL, env=env, close_fds=True,
            )
        finally:
            theirs.close()
        self._requests = ours
        ready, _, _ = select.select([ours], [], [], self.start_timeout)
        answer = ours.recv(64) if ready else b""
        if answer != _READY:
            self._close_locked()
            raise RuntimeError("the fork server did not start in %gs (answered %r)" % (self.start_timeout, answer))
        # At exit: EOF on its request socket ends it (its brokers too), and it is reaped here.
        if not self._closes_at_exit:
            atexit.register(self.close)
            self._closes_at_exit = True

    def close(self):
        """End the fork server: it SIGKILLs the broker processes it still has, reaps them, exits."""
        with self._lock:
            self._close_locked()

    def _close_locked(self):
        if self._requests is not None:
            self._requests.close()
            self._requests = None
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.wait(self.start_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class ForkedProcess:
    """A broker process forked by a :class:`ForkServer`, with the part of ``subprocess.Popen`` that
    ``BrokerProcess`` uses: ``pid``, ``stderr``, ``returncode``, :meth:`poll`, :meth:`wait`,
    :meth:`send_signal`, :meth:`kill`.

    The exit status arrives on the status socket from the fork server (which reaped it).
    ``_lock`` guards ``_status``, ``_buffer`` and ``returncode``."""

    def __init__(self, status_socket, stderr):
        self._status = status_socket
        self.stderr = stderr
        self._buffer = b""
        self._lock = threading.Lock()
        self.pid = None
        self.returncode = None
        self.cpu_seconds = None  # its user + system CPU time, once it has exited

    def _read_line(self, timeout):
        """The next line from the fork server, or None at ``timeout`` (None: wait as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            if self._status is None:
                return None
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._status], [], [], remaining)
            if not ready:
                return None
            data = self._status.recv(4096)
            if not data:  # the fork server ended without a status: it was killed
                self._status.close()
                self._status = None
                if self.pid is not None:
                    _kill_orphan(self.pid, remaining)
                self._buffer += b"exit -1\n"
                continue
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def read_pid(self, timeout):
        with self._lock:
            line = self._read_line(timeout)
        if line is None or not line.startswith("pid "):
            raise RuntimeError("the fork server did not fork (answered %r)" % line)
        self.pid = int(line.split()[1])

    def _collect(self, timeout):
        with self._lock:
            if self.returncode is None:
                line = self._read_line(timeout)
                if line is not None:
                    fields = line.split()
                    status = int(fields[1])
                    self.cpu_seconds = float(fields[2]) if len(fields) > 2 else None
                    self.returncode = _exit_code(status) if status >= 0 else -signal.SIGKILL
                    if self._status is not None:
                        self._status.close()
                        self._status = None
            return self.returncode

    def poll(self):
        """The exit code once it has exited, else None (without waiting, as Popen's: not even for a
        thread in :meth:`wait`)."""
        if not self._lock.acquire(False):
            return self.returncode
        self._lock.release()
        return self._collect(0)

    def wait(self, timeout=None):
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired("nsqd (forked, pid %s)" % self.pid, timeout)
        return code

    def send_signal(self, sig):
        """Signal it unless it has been reaped (its pid might be another process's by then)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def close(self):
        """Kill it if it runs; close the status socket and stderr."""
        if self.pid is not None:
            self.kill()
            self.wait()
        with self._lock:
            if self._status is not None:
                self._status.close()
                self._status = None
        self.stderr.close()


def _kill_orphan(pid, timeout):
    """SIGKILL a broker process whose fork server died before it, and wait (up to ``timeout``, with a
    pidfd where there is one) until it is gone: its ports are then free for a restart."""
    try:
        waiter = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    except OSError:
        return  # already gone
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if waiter is not None:
        try:
            select.select([waiter], [], [], 10.0 if timeout is None else max(timeout, 1.0))
        finally:
            os.close(waiter)


def _exit_code(status):
    """A ``waitpid`` status as ``Popen.returncode`` has it: the exit code, or minus the signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


# -- in the fork server --------------------------------------------------------------------------


def serve():
    """The fork server's main loop (``python -c "...; serve()"``, the request socket on stdin)."""
    import gc

    from nsqd_threaded import cli  # what every broker process would import

    # A command line parsed once here warms what the first parse fills in (click's, the settings');
    # then everything allocated so far is frozen out of the cyclic gc, whose collections would
    # otherwise touch (and so copy) every page of it in each broker process.
    cli.resolve(cli.parse(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"])[1])
    if hasattr(gc, "freeze"):  # CPython 3.7+ (PyPy has none)
        gc.collect()
        gc.freeze()
    if threading.active_count() != 1:
        raise SystemExit("fork server: importing the package started a thread; cannot fork safely")
    requests = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's ^C is for the test process
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # and the finally below ends the brokers
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    os.set_blocking(wake_read, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_write)
    children = {}  # pid -> the status socket of each broker process not yet reaped
    requests.sendall(_READY)
    try:
        while True:
            _reap(children, wait=False)
            try:
                ready, _, _ = select.select([requests, wake_read], [], [])
            except InterruptedError:
                continue
            if wake_read in ready:
                try:
                    while os.read(wake_read, 4096):
                        pass
                except BlockingIOError:
                    pass
            if requests in ready:
                try:
                    message, fds, _, _ = socket.recv_fds(requests, _MAX_REQUEST, 2)
                except InterruptedError:
                    continue
                if not message:
                    break  # the test process is gone
                _fork_one(json.loads(message), fds, children, (requests.fileno(), wake_read, wake_write))
    finally:
        signal.set_wakeup_fd(-1)
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while children:
            _reap(children, wait=True)


def _reap(children, wait):
    """Collect exited broker processes and report each status (``wait``: for one, blocking)."""
    while children:
        try:
            pid, status, usage = os.wait4(-1, 0 if wait else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        sock = children.pop(pid, None)
        if sock is not None:
            try:
                sock.sendall(b"exit %d %.6f\n" % (status, usage.ru_utime + usage.ru_stime))
            except OSError:
                pass  # the test process stopped listening
            sock.close()
        if wait:
            return


def _fork_one(request, fds, children, server_fds):
    status_fd, stderr_fd = fds
    status = socket.socket(fileno=status_fd)
    parsed = _parse_ahead(request["args"])
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            status.close()
            for fd in server_fds:
                os.close(fd)
            for sock in children.values():
                sock.close()
            code = _run_broker(request, parsed, stderr_fd)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 70
        os._exit(code)
    os.close(stderr_fd)
    children[pid] = status
    try:
        status.sendall(b"pid %d\n" % pid)
    except OSError:
        pass


def _parse_ahead(args):
    """The nsqd command line parsed here, before the fork: a click context, or None to leave it all
    to the broker process's ``cli.main`` (help, a flag click rejects: it then says what the command
    says).  Parsing is the largest part of a broker process's own start
    (click builds an object per flag): in a forked process it also copies every page it touches."""
    from nsqd_threaded import cli

    if not args or args[0] in ("--help", "-help", "-h"):
        return None
    try:
        return cli.main.make_context("nsqd-threaded", list(args))
    except BaseException:  # click's Exit (help), UsageError ...: the broker process says it itself
        return None


def _run_parsed(ctx):
    """``cli.main`` from a context :func:`_parse_ahead` made: click's standalone handling of what runs."""
    import click

    try:
        with ctx:
            ctx.command.invoke(ctx)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(0)


def _run_broker(request, parsed, stderr_fd):
    """In the broker process: its stdio, environment and signals as an exec'd one would have, the command, exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.dup2(stderr_fd, 2)
    os.close(stderr_fd)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.close(null)
    env = request["env"]
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():  # only what differs: each change is a putenv, each page touched a copy
        if os.environ.get(name) != value:
            os.environ[name] = value
    os.chdir(request["cwd"])
    from nsqd_threaded import cli

    sys.argv = ["nsqd-threaded"] + request["args"]
    code = 0
    try:
        if parsed is not None:
            _run_parsed(parsed)
        else:
            cli.main(request["args"], prog_name="nsqd-threaded")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            sys.stderr.write("%s\n" % e.code)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # coverage, when the suite runs under it, saves this process's data here
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    return code
