"""What the ``nsqd-threaded`` and ``nsqlookupd-threaded`` commands share.

Each command is a table of :class:`~nsqd_threaded.settings.options.Setting`
entries turned into a click command that first rewrites Go ``flag`` syntax
(:func:`go_style_args`), so a Go command line works unchanged.  Startup
failures are one ``FATAL`` line in the daemon's log format (:func:`fatal`),
never a traceback; :func:`run_until_signalled` runs a started daemon until
SIGTERM or SIGINT.
"""

import platform
import signal

import click

from .internal.logger import Logger
from .settings import config
from .settings.options import LOG_LEVELS, UNSUPPORTED, VERSION, OptionError


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

    Run, it prints :func:`version_line` for ``--version``, else calls
    ``serve(*resolve(params))``.
    """

    def __init__(self, name, settings, resolve, serve, **kwargs):
        self.settings = settings

        def run(**params):
            if params.get("version"):
                click.echo(version_line(name))
                return
            serve(*resolve(params))

        super().__init__(name, params=[option(s) for s in settings if s.flag], callback=run, **kwargs)

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, go_style_args(args, self.settings))


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
    """A setting's help with its default as Go prints it (zero values left out).

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
        text += ' (default "%s")' % formatted if setting.kind.type is str else " (default %s)" % formatted
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
        fatal("failed to instantiate %s - %s" % (daemon, e), log_prefix)
    return options, warnings


def version_line(program):
    return "%s v%s (python %s)" % (program, VERSION, platform.python_version())


def fatal(message, prefix):
    """Log ``FATAL: message`` with the daemon's log prefix and exit 1, as Go's logFatal does."""
    Logger(prefix=prefix).log(LOG_LEVELS["fatal"], "%s", message)
    raise click.exceptions.Exit(1)


def run_until_signalled(daemon, start_failure):
    """Start ``daemon``, wait for SIGTERM or SIGINT, then stop it.

    A failed start is ``start_failure(exc)``'s FATAL line (exit 1).  The
    signals are blocked in every thread (threads inherit the mask) and taken
    synchronously with sigwait: no handler runs at an arbitrary bytecode.
    """
    signals = {signal.SIGTERM, signal.SIGINT}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        try:
            daemon.start()
        except Exception as e:  # any startup failure is one FATAL line, never a traceback
            start_failure(e)
        signum = signal.sigwait(signals)
        daemon.log.info("%s: shutting down", signal.Signals(signum).name)
        daemon.stop()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def error_text(exc):
    """An exception as one line: an OSError's strerror (with its file), else its message."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror if exc.filename is None else "%s: %s" % (exc.filename, exc.strerror)
    elif isinstance(exc, (OSError, RuntimeError, ValueError)):
        text = str(exc)
    else:
        text = "%s: %s" % (type(exc).__name__, exc)
    return " ".join(text.split())
