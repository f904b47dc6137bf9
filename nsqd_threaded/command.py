"""The app shell: what every command (nsqd, nsqlookupd, nsqadmin and the tools) shares.

A command is a table of :class:`~nsqd_threaded.settings.options.Setting`
entries (Go's flag names, defaults and units; repeated flags) and an app
factory; :class:`AppCommand` turns them into a click command that

* first rewrites Go ``flag`` syntax (:func:`go_style_args`), so a Go command
  line works unchanged;
* resolves flag > ``--config`` TOML file > default (:func:`resolve`) into the
  options class (made from the table: a daemon's by
  :func:`~nsqd_threaded.settings.options.options_class`, a tool's by :func:`table_options`);
* reports every startup failure as one ``FATAL`` line in the app's log format
  (:func:`fatal`), never a traceback;
* runs the app (:func:`run_until_signalled`): SIGTERM or SIGINT stop it
  gracefully, SIGHUP calls its ``reload()`` when it has one, and an app that
  finishes by itself (its ``done`` event) ends the command with its
  ``exit_code``.

So an app is its own logic only: ``start()``, ``stop()``, a ``log``, and
optionally ``reload()``, ``done`` and ``exit_code``.  :class:`Listeners`
holds the start/stop of a daemon's listening servers.
"""

import dataclasses
import signal
import socket
import threading

import click

from .broker.stats import runtime_name
from .internal.gocompat import go_quote
from .internal.logger import Logger
from .settings import config
from .settings.options import LOG_LEVELS, UNSUPPORTED, VERSION, OptionError, check_settings, table_fields


class GoValue(click.ParamType):
    """A click type around one setting kind's Go-syntax parser (:class:`~nsqd_threaded.settings.options.Kind`)."""

    def __init__(self, kind):
        self.name = kind.name
        self._parse = kind.parse

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class GoFlagCommand(click.Command):
    """A daemon's command over its settings table; it first rewrites Go ``flag`` syntax.

    Run, it prints :meth:`version_line` for ``--version``, else calls
    ``serve(*resolve(params))``.
    """

    def __init__(self, name, settings, resolve, serve, **kwargs):
        self.settings = settings

        def run(**params):
            if params.get("version"):
                click.echo(self.version_line())
                return
            serve(*resolve(params))

        super().__init__(name, params=[option(s) for s in settings if s.flag], callback=run, **kwargs)

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, go_style_args(args, self.settings))

    def version_line(self):
        return version_line(go_name(self.name))


def go_style_args(args, settings):
    """Rewrite Go ``flag`` syntax into click's: ``-name[=v]`` -> ``--name[=v]``, bare bool -> ``=true``.

    The value after a non-boolean flag given without ``=`` is copied as is,
    so ``--log-prefix -x`` keeps ``-x``.  Unknown flags pass through for
    click to report.
    """
    kinds = {s.flag: s.kind for s in settings if s.flag}
    out = []
    rest = iter(args)
    for arg in rest:
        if arg == "--":
            out.append(arg)
            out.extend(rest)
            break
        if not arg.startswith("-") or arg == "-" or arg.startswith("---"):
            out.append(arg)
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        name, eq, value = body.partition("=")
        if name in ("h", "help") and not eq:
            out.append("--help")
        elif name in kinds and kinds[name].bare:
            out.append("--%s=%s" % (name, value if eq else "true"))
        elif name in kinds:
            out.append("--" + body)
            if not eq:
                following = next(rest, None)
                if following is not None:
                    out.append(following)
        else:
            out.append(arg)
    return out


def given_flags(params, settings):
    """Click's parsed parameters -> ``{Setting: value}`` for the flags given (repeatable ones flattened)."""
    flags = {}
    for setting in settings:
        if setting.flag is None:
            continue
        value = params.get(param_name(setting))
        if value in (None, ()):
            continue
        if setting.multiple:
            value = [item for parsed in value for item in parsed]
        flags[setting] = value
    return flags


def param_name(setting):
    return setting.field or setting.flag.replace("-", "_")


def help_text(setting):
    """A setting's help with its default as Go prints it (zero values left out, a string quoted as ``%q``:
    to_nsq's delimiter shows as ``"\\n"``).

    An unbuilt feature shows the value in effect (``--snappy``: false), which
    is the only one it accepts, besides off or empty.
    """
    text = setting.help
    default = setting.default
    if setting.status == UNSUPPORTED:
        if default not in ("", ()):
            text += " (default %s)" % setting.kind.format(default)
        return text + " [not supported yet]"
    if default not in (None, "", (), 0, False):
        formatted = setting.kind.format(default)
        text += " (default %s)" % (go_quote(formatted) if setting.kind.type is str else formatted)
    return text


def option(setting):
    """The click option of a setting with a flag."""
    return click.Option(
        ["--" + setting.flag, param_name(setting)],
        type=GoValue(setting.kind),
        multiple=setting.multiple,
        default=None,
        metavar="[=BOOL]" if setting.kind.bare else None,
        help=help_text(setting),
    )


def resolve(params, settings, options_class, daemon, log_prefix):
    """Click's parsed parameters -> ``(options, warnings)``: flag > config file > default.

    Exits 2 with one line for an unbuilt feature (a
    :class:`~nsqd_threaded.settings.config.NotSupportedError`), as for a bad flag, and exits 1 with the daemon's
    FATAL line for an unusable config file or a value ``options_class`` rejects.
    """
    try:
        values, warnings = config.resolve(given_flags(params, settings), params.get("config"), settings)
    except config.NotSupportedError as e:
        refused = click.ClickException(str(e))  # one line (a UsageError would print the usage too)
        refused.exit_code = 2
        raise refused from None
    except config.ConfigError as e:
        fatal(str(e), log_prefix)
    try:
        options = options_class(**values).validate()
    except OptionError as e:
        fatal("failed to instantiate %s - %s" % (daemon, e) if daemon else str(e), log_prefix)
    return options, warnings


def go_name(program):
    """The Go program a command stands for: ``nsq_tail-threaded`` -> ``nsq_tail``."""
    return program[:-len("-threaded")] if program.endswith("-threaded") else program


def version_line(name, daemon=False):
    """Go's version line: ``nsq_tail v1.3.0`` for a tool, ``nsqd v1.3.0 (built w/cpython3.11.7)`` for a daemon.

    The daemons' ``built w/`` part names the interpreter as ``/stats?format=text``
    does (:func:`~nsqd_threaded.broker.stats.runtime_name`); client libraries'
    test harnesses parse the line (``^[a-z]+ v\\d+\\.\\d+\\.\\d+ \\(built w/[a-z0-9.-]+\\)``).
    """
    line = "%s v%s" % (name, VERSION)
    return "%s (built w/%s)" % (line, runtime_name()) if daemon else line


def fatal(message, prefix):
    """Log ``FATAL: message`` with the daemon's log prefix and exit 1, as Go's logFatal does."""
    Logger(prefix=prefix).log(LOG_LEVELS["fatal"], "%s", message)
    raise click.exceptions.Exit(1)


def run_until_signalled(app, start_failure):
    """Start ``app`` and run it until SIGTERM or SIGINT (then ``app.stop()``) or until it is done; the exit code.

    A failed start is ``start_failure(exc)``'s FATAL line (exit 1).  The
    signals are blocked in every thread (threads inherit the mask) and taken
    synchronously with sigwait: no handler runs at an arbitrary bytecode.
    SIGHUP calls ``app.reload()`` when the app has one (otherwise it keeps its
    default action, as for Go's daemons).  An app with a ``done`` event may
    finish by itself (nsq_tail's ``-n``, to_nsq at the end of its input): a
    ``shell-done`` thread then wakes the main thread with SIGUSR1.  The code
    returned is the app's ``exit_code`` (0 when it has none).
    """
    reload = getattr(app, "reload", None)
    done = getattr(app, "done", None)
    signals = {signal.SIGTERM, signal.SIGINT}
    if reload is not None:
        signals.add(signal.SIGHUP)
    if done is not None:
        signals.add(signal.SIGUSR1)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    watcher = None
    # guards `ending`: once the main thread took a stop signal the watcher must not send SIGUSR1
    ending_lock = threading.Lock()
    ending = []
    try:
        try:
            app.start()
        except Exception as e:  # any startup failure is one FATAL line, never a traceback
            start_failure(e)
        if done is not None:
            main_thread = threading.get_ident()

            def wake_main():
                done.wait()
                with ending_lock:
                    if not ending:
                        ending.append("done")
                        signal.pthread_kill(main_thread, signal.SIGUSR1)

            watcher = threading.Thread(target=wake_main, name="shell-done")
            watcher.start()
        while True:
            signum = signal.sigwait(signals)
            if signum == signal.SIGHUP:
                app.log.info("SIGHUP: reloading")
                reload()
                continue
            with ending_lock:
                if not ending:
                    ending.append(signum)  # a stop signal came before the app was done
                cause = ending[0]
            break
        if cause != "done":
            app.log.info("%s: shutting down", signal.Signals(cause).name)
        app.stop()  # after "done" too: it joins what is left (stop is idempotent)
        if done is not None:
            done.set()  # the watcher returns
            watcher.join()
            if signal.SIGUSR1 in signal.sigpending():
                signal.sigwait({signal.SIGUSR1})  # never delivered once the mask is restored
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return getattr(app, "exit_code", 0) or 0


def error_text(exc):
    """An exception as one line: an OSError's strerror (with its file), else its message."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror if exc.filename is None else "%s: %s" % (exc.filename, exc.strerror)
    elif isinstance(exc, (OSError, RuntimeError, ValueError)):
        text = str(exc)
    else:
        text = "%s: %s" % (type(exc).__name__, exc)
    return " ".join(text.split())


# -- the shell: one command over a table and an app ---------------------------------------


class AppCommand(GoFlagCommand):
    """The command of one app: its settings table, its options class and its factory.

    ``AppCommand(program, settings, options_class, make_app, *, log_prefix, daemon=None,
    prepare=None, start_failure=None, help=None)``

    * ``make_app(options)`` builds the app (``start``/``stop``/``log``; see the
      module docstring); ``prepare(options)`` runs before it (process-wide
      tuning, checks that end in :meth:`fatal`);
    * ``daemon`` names the app in FATAL lines (``failed to instantiate
      nsqlookupd - ...``); without it a rejected option's message stands alone,
      as Go's tools print theirs;
    * ``start_failure(exc)`` words a failed start (default: as for an
      unusable option).

    The command exits with the app's ``exit_code``.  :meth:`resolve`,
    :meth:`serve`, :meth:`fatal` and :meth:`parse` are the pieces, for
    tests and for the test brokers that build options the way the command does.
    """

    def __init__(self, program, settings, options_class, make_app, *, log_prefix, daemon=None,
                 prepare=None, start_failure=None, help=None, **kwargs):
        self.program = program
        # Making the app: options, then the process checks, then the app.
        self.options_class = options_class
        self.prepare = prepare
        self.make_app = make_app
        # Saying why it failed.
        self.start_failure = start_failure or self._default_failure
        self.daemon = daemon
        self.log_prefix = log_prefix
        kwargs.setdefault("context_settings", {"max_content_width": 100})
        super().__init__(program, settings, self.resolve, self.serve, help=help, **kwargs)

    def _default_failure(self, exc):
        text = error_text(exc)
        return "failed to instantiate %s - %s" % (self.daemon, text) if self.daemon else text

    def resolve(self, params):
        """Click's parsed parameters -> ``(options, warnings)``: flag > config file > default."""
        return resolve(params, self.settings, self.options_class, self.daemon, self.log_prefix)

    def fatal(self, message):
        """``FATAL: message`` in the app's log format, then exit 1."""
        fatal(message, self.log_prefix)

    def go_style_args(self, args):
        return go_style_args(args, self.settings)

    def version_line(self):
        """``--version``'s line: Go's program name (the daemon's, else the tool's), as Go prints it."""
        return version_line(self.daemon or go_name(self.program), daemon=self.daemon is not None)

    def parse(self, args):
        """Parse a command line: ``(flags, params)``; raises what click raises (Exit for --help)."""
        ctx = self.make_context(self.program, list(args))
        return given_flags(ctx.params, self.settings), ctx.params

    def serve(self, options, warnings=()):
        """Build the app, log the warnings, run it until signalled or done; exit with its code."""
        if self.prepare is not None:
            self.prepare(options)
        try:
            app = self.make_app(options)
        except (OSError, ValueError, RuntimeError) as e:
            self.fatal(self.start_failure(e))
        for warning in warnings:
            app.log.warn("%s", warning)
        code = run_until_signalled(app, lambda e: self.fatal(self.start_failure(e)))
        if code:
            raise click.exceptions.Exit(code)


def table_options(name, settings, validate=None, doc=None):
    """An options dataclass made from a settings table: one field per setting with a field, in order.

    Each field has the setting's type and default (a list default for a
    repeatable flag, ``factory`` where the table has one).  ``validate()``
    runs each setting's check, then ``validate(options)`` (which raises
    :class:`~nsqd_threaded.settings.options.OptionError`), and returns the
    options.  The tools' options are made this way: the table is their only
    statement.
    """
    def check(self):
        check_settings(self, settings)
        if validate is not None:
            validate(self)
        return self

    cls = dataclasses.make_dataclass(name, table_fields(settings), namespace={"validate": check})
    cls.__doc__ = doc or "%s: one field per setting of its table." % name
    return cls


class Listeners:
    """The listening servers of one daemon, each served by a named thread: opened, started, stopped together.

    ``open(flag, server_class, address, *args)`` binds (a bad address raises
    ValueError, a failed bind OSError, both naming the flag); :meth:`start`
    serves each on a thread named after it and logs ``KIND: listening on``;
    :meth:`stop` shuts down the accept loops, closes every connection, joins
    every thread and logs ``KIND: closing``.  Owned and called by one
    daemon's start/stop (which serialize themselves), so it needs no lock.
    """

    def __init__(self, log):
        self.log = log
        self.servers = []  # (kind, server, thread name)
        self._threads = []

    def open(self, flag, server_class, address, *args, kind, thread_name):
        try:
            server = server_class(address, *args)
        except ValueError as e:
            raise ValueError("--%s: %s" % (flag, e)) from None
        except OSError as e:
            raise OSError(e.errno, "--%s: listen (%s) failed - %s" % (flag, address, e.strerror or e)) from None
        self.servers.append((kind, server, thread_name))
        return server

    def close_unstarted(self):
        """Close what :meth:`open` bound when the start failed halfway."""
        for _, server, _ in self.servers:
            server.server_close()
        self.servers = []

    def start(self, order=None):
        """Serve every server; ``order`` lists kinds to start (and log) first."""
        ranked = sorted(self.servers, key=lambda entry: (order or []).index(entry[0])
                        if entry[0] in (order or []) else len(order or []))
        for kind, server, name in ranked:
            self.log.info("%s: listening on %s", kind, server.describe())
            thread = threading.Thread(target=server.serve_forever, name=name)
            thread.start()
            self._threads.append(thread)

    def stop(self):
        servers = [server for _, server, _ in self.servers]
        for server in servers:
            server.shutdown()  # the accept loop returns at once (PromptShutdownMixIn)
        for server in servers:
            server.close_connections()
        for server in servers:
            server.server_close()  # joins the connection threads
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()
        for kind, server, _ in self.servers:
            self.log.info("%s: closing %s", kind, server.describe())


class ListeningApp:
    """What a daemon made of listeners shares: its setup, start and stop, ``with``, its HTTP addresses.

    A subclass names its program (``program``), the attributes holding its
    servers (``servers``, ``_http`` among them) and the kinds to start first
    (``listen_order``), calls :meth:`_setup` from ``__init__``, and binds its
    servers in :meth:`_open`.  :meth:`start` binds every listener (an
    OSError names the failed address) and serves them; :meth:`stop` closes
    the listeners and every connection and joins every thread (idempotent).
    ``_state_lock`` guards the started/stopped state (``_listeners``,
    ``_stopped``, the server attributes) so that concurrent start()/stop()
    calls run once each.

    ``with app:`` starts it and stops it; ``http_address`` is ``(host, port)``
    as bound (the real port when 0 was asked), ``http_addr`` ``"host:port"``
    (as pynsq's ``lookupd_http_addresses`` takes it), ``http_url`` its URL.
    """

    program = None  # Go's name of the daemon, for the start-up line ("nsqlookupd")
    servers = ("_http",)  # the attributes _open sets to its servers
    listen_order = None  # kinds whose listeners start (and log) first
    _http = None

    def _setup(self, options, defaults, logger, overrides):
        """``__init__``'s common part: ``defaults()`` with ``overrides`` (checked), the version, host and log."""
        options = dataclasses.replace(options or defaults(), **overrides)
        options.validate()
        self.options = options
        self.version = VERSION
        self.hostname = socket.gethostname()
        self.log = logger or Logger(prefix=options.log_prefix, level=options.log_level)
        self._state_lock = threading.Lock()  # guards _listeners, _stopped and the server attributes
        self._listeners = None
        self._stopped = False

    def _open(self, listeners):
        """Bind this app's servers with ``listeners.open`` and keep them in the ``servers`` attributes."""
        raise NotImplementedError

    def _serving(self):
        """Called once the listeners are bound, before they serve (start helper threads here)."""

    def _stopped_serving(self):
        """Called once the listeners are closed and their threads joined (join helper threads here)."""

    def start(self):
        """Bind every listener and start serving; an OSError names the failed address."""
        with self._state_lock:
            if self._listeners is not None or self._stopped:
                raise RuntimeError("%s can be started once" % type(self).__name__)
            self.log.info("%s", version_line(self.program, daemon=True))
            listeners = Listeners(self.log)
            try:
                self._open(listeners)
            except BaseException:
                listeners.close_unstarted()
                for name in self.servers:
                    setattr(self, name, None)
                raise
            self._serving()
            listeners.start(order=self.listen_order)
            self._listeners = listeners
        return self

    def stop(self):
        """Close the listeners and every connection, then join every thread.  Idempotent."""
        with self._state_lock:
            if self._stopped:
                return
            self._stopped = True
            listeners = self._listeners
        if listeners is not None:
            listeners.stop()
            self._stopped_serving()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def http_address(self):
        """``(host, port)`` the HTTP listener is bound to, or its socket path (a str)."""
        return self._http.bound_address

    @property
    def http_addr(self):
        """``"host:port"`` (or the socket path) of the HTTP listener, as pynsq's ``lookupd_http_addresses`` takes it."""
        return self._http.describe()

    @property
    def http_url(self):
        """``http://host:port`` (a unix socket has no URL: ValueError)."""
        if self._http.socket_path is not None:
            raise ValueError("the HTTP listener is the unix socket %s (no URL)" % self._http.socket_path)
        return "http://" + self.http_addr
