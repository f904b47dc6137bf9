"""The ``nsqd-threaded`` command: nsqd's flags and config file, then run until signalled.

Flags are Go nsqd's, spelled and defaulted the same, so a Go nsqd command
line works unchanged: Go's ``-name=value`` and bare boolean ``-name`` forms
are rewritten into click's before parsing (:func:`go_style_args`).  Flags of
features that are not built yet are refused rather than ignored, unless they
only restate what the broker does anyway (``--snappy=false``).  Every startup
failure is one ``FATAL`` line naming what to fix, never a traceback.
"""

import platform
import signal

import click

from .settings import config
from .logger import Logger
from .broker.nsqd import NSQD
from .settings.options import LOG_LEVELS, SETTINGS, UNSUPPORTED, VERSION, OptionError, Options, check_data_path


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


class NotSupported(click.ClickException):
    """A flag or config key of a feature not built yet: one line, exit 2 like a bad flag."""

    exit_code = 2


class GoFlagCommand(click.Command):
    """A click command that first rewrites Go ``flag`` syntax."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, go_style_args(args))


def go_style_args(args):
    """Rewrite Go ``flag`` syntax into click's: ``-name[=v]`` -> ``--name[=v]``, bare bool -> ``=true``.

    The value after a non-boolean flag given without ``=`` is copied as is,
    so ``--log-prefix -x`` keeps ``-x``.  Unknown flags pass through for
    click to report.
    """
    kinds = {s.flag: s.kind for s in SETTINGS if s.flag}
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


def version_line():
    return "nsqd-threaded v%s (python %s)" % (VERSION, platform.python_version())


def given_flags(params):
    """Click's parsed parameters -> ``{Setting: value}`` for the flags given (repeatable ones flattened)."""
    flags = {}
    for setting in SETTINGS:
        if setting.flag is None:
            continue
        value = params.get(_param_name(setting))
        if value in (None, ()):
            continue
        if setting.multiple:
            value = [item for parsed in value for item in parsed]
        flags[setting] = value
    return flags


def parse(args):
    """Parse a command line: ``(flags, params)``; raises what click raises (Exit for --help)."""
    ctx = main.make_context("nsqd-threaded", list(args))
    return given_flags(ctx.params), ctx.params


def resolve(params):
    """Click's parsed parameters -> ``(Options, warnings)``: flag > config file > default.

    Raises NotSupported for an unbuilt feature, and exits 1 with nsqd's
    FATAL line for an unusable config file or a value Options rejects.
    """
    try:
        values, warnings = config.resolve(given_flags(params), params.get("config"))
    except config.NotSupportedError as e:
        raise NotSupported(str(e)) from None
    except config.ConfigError as e:
        fatal(str(e))
    try:
        options = Options(**values).validate()
    except OptionError as e:
        fatal("failed to instantiate nsqd - %s" % e)
    return options, warnings


def fatal(message):
    """Log ``FATAL: message`` in nsqd's format and exit 1, as nsqd's logFatal does."""
    Logger().log(LOG_LEVELS["fatal"], "%s", message)
    raise click.exceptions.Exit(1)


def serve(options, warnings=()):
    """Run a broker until SIGTERM or SIGINT, then stop it gracefully."""
    problem = check_data_path(options.data_path)
    if problem:
        fatal("failed to instantiate nsqd - %s" % problem)
    nsqd = NSQD(options)
    for warning in warnings:
        nsqd.log.warn("%s", warning)
    # Block the signals in every thread (threads inherit the mask) and take them
    # synchronously with sigwait: no handler runs at an arbitrary bytecode.
    signals = {signal.SIGTERM, signal.SIGINT}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        try:
            nsqd.start()
        except Exception as e:  # any startup failure is one FATAL line, never a traceback
            fatal(_start_failure(e))
        signum = signal.sigwait(signals)
        nsqd.log.info("%s: shutting down", signal.Signals(signum).name)
        nsqd.stop()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _start_failure(exc):
    """nsqd's FATAL wording: lock and listen errors come from instantiating it,
    nsqd.dat errors from loading metadata afterwards."""
    if isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror if exc.filename is None else "%s: %s" % (exc.filename, exc.strerror)
    elif isinstance(exc, (OSError, RuntimeError, ValueError)):
        text = str(exc)
    else:
        text = "%s: %s" % (type(exc).__name__, exc)
    text = " ".join(text.split())  # one line
    if text.startswith("failed to parse metadata"):
        return "failed to load metadata - %s" % text
    return "failed to instantiate nsqd - %s" % text


def _run(**params):
    if params.get("version"):
        click.echo(version_line())
        return
    serve(*resolve(params))


def _help(setting):
    """nsqd's help text with its default as Go prints it (zero values left out).

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


def _param_name(setting):
    return setting.field or setting.flag.replace("-", "_")


def _option(setting):
    return click.Option(
        ["--" + setting.flag, _param_name(setting)],
        type=GoValue(setting.kind),
        multiple=setting.multiple,
        default=None,
        metavar="[=BOOL]" if setting.kind.bare else None,
        help=_help(setting),
    )


main = GoFlagCommand(
    "nsqd-threaded",
    params=[_option(s) for s in SETTINGS if s.flag],
    callback=_run,
    help="NSQ's nsqd 1.3 message broker, in pure Python.  Flags are nsqd's: "
    "-name=value or --name value; booleans --name or --name=false.",
    context_settings={"max_content_width": 100},
)
