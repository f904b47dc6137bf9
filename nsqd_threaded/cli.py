"""The ``nsqd-threaded`` command: nsqd's flags and config file, then run until signalled.

Flags are Go nsqd's, spelled and defaulted the same, so a Go nsqd command
line works unchanged: Go's ``-name=value`` and bare boolean ``-name`` forms
are rewritten into click's before parsing (:func:`go_style_args`).  Flags of
features that are not built yet are refused rather than ignored.
"""

import platform
import signal

import click

from . import config
from .config import DEPRECATED, SETTINGS, SUPPORTED, UNSUPPORTED
from .durations import format_duration, parse_duration
from .logger import Logger
from .nsqd import NSQD
from .options import LOG_LEVELS, VERSION, Options, OptionError

_BOOL_KINDS = ("bool", "tlsrequired")  # bare --name means true; a value needs "="

_DEPRECATION = {
    "verbose": "--verbose is deprecated and has no effect, use --log-level",
    "worker-id": "--worker-id is deprecated and has no effect, use --node-id",
}


class GoValue(click.ParamType):
    """A click type around one of the Go-syntax parsers in :mod:`config`."""

    def __init__(self, name, parse):
        self.name = name
        self._parse = parse

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


_TYPES = {
    "str": click.STRING,
    "strlist": click.STRING,
    "int": GoValue("integer", config.parse_go_int),
    "duration": GoValue("duration", parse_duration),
    "bool": GoValue("bool", config.parse_go_bool),
    "loglevel": GoValue("level", config.parse_log_level),
    "tlsrequired": GoValue("tls-required", config.parse_tls_required),
    "floatlist": GoValue("float-list", config.parse_float_list),
}


class NotSupported(click.ClickException):
    """A flag or config key of a feature not built yet: one line, exit 2 like a bad flag."""

    exit_code = 2

    def __init__(self, setting, source=None):
        message = "--%s is not supported yet" % setting.flag
        if source:
            message += " (%s)" % source
        super().__init__(message)


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
    kinds = {s.flag: s.kind for s in SETTINGS}
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
        elif kinds.get(name) in _BOOL_KINDS:
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


def resolve(params):
    """Click's parsed parameters -> ``(Options, warnings)``: flag > config file > default.

    Raises NotSupported for an unbuilt feature, and exits 1 with nsqd's
    FATAL line for an unusable config file or a value Options rejects.
    """
    given = {s: params[s.field] for s in SETTINGS if params.get(s.field) not in (None, ())}
    for setting, value in given.items():
        if setting.kind == "floatlist":  # repeatable and comma-separated: one flat list
            given[setting] = [v for item in value for v in item]
        elif setting.multiple:
            given[setting] = list(value)
    for setting in given:
        if setting.status == UNSUPPORTED:
            raise NotSupported(setting)
    path = params.get("config")
    chosen = _read_config(path) if path else {}
    chosen.update(given)
    values = {s.field: v for s, v in chosen.items() if s.status == SUPPORTED}
    options = Options(**values)
    try:
        options.validate()
    except OptionError as e:
        fatal("failed to instantiate nsqd - %s" % e)
    warnings = [_DEPRECATION[s.flag] for s in given if s.status == DEPRECATED]
    return options, warnings


def _read_config(path):
    """The supported settings a config file sets; refuses keys of unbuilt features."""
    try:
        values = config.resolve(config.load(path))
    except (OSError, ValueError) as e:
        fatal("failed to load config file %s - %s" % (path, e))
    for setting, value in values.items():
        if setting.status == UNSUPPORTED and not config.is_inert(setting, value):
            raise NotSupported(setting, "%s in %s" % (setting.key, path))
    return {s: v for s, v in values.items() if s.status == SUPPORTED}


def fatal(message):
    """Log ``FATAL: message`` in nsqd's format and exit 1, as nsqd's logFatal does."""
    Logger().log(LOG_LEVELS["fatal"], "%s", message)
    raise click.exceptions.Exit(1)


def serve(options, warnings=()):
    """Run a broker until SIGTERM or SIGINT, then stop it gracefully."""
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
        except (OSError, RuntimeError, ValueError) as e:
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
    else:
        text = str(exc)
    if text.startswith("failed to parse metadata"):
        return "failed to load metadata - %s" % text
    return "failed to instantiate nsqd - %s" % text


def _run(**params):
    if params.get("version"):
        click.echo(version_line())
        return
    serve(*resolve(params))


def _help(setting):
    """nsqd's help text, with its default as Go prints it (zero values left out)."""
    text = setting.help
    default = config.default(setting)
    if default and default != "false":
        if setting.kind == "duration":
            text += " (default %s)" % format_duration(default)
        elif setting.kind == "bool":
            text += " (default true)"
        elif setting.kind == "int":
            text += " (default %d)" % default
        else:
            text += ' (default "%s")' % default
    if setting.status == UNSUPPORTED:
        text += " [not supported yet]"
    return text


def _option(setting):
    metavar = "[=BOOL]" if setting.kind in _BOOL_KINDS else None
    return click.Option(
        ["--" + setting.flag, setting.field],
        type=_TYPES[setting.kind],
        multiple=setting.multiple,
        default=None,
        metavar=metavar,
        help=_help(setting),
    )


main = GoFlagCommand(
    "nsqd-threaded",
    params=[_option(s) for s in SETTINGS],
    callback=_run,
    help="NSQ's nsqd 1.3 message broker, in pure Python.  Flags are nsqd's: "
    "-name=value or --name value; booleans --name or --name=false.",
    context_settings={"max_content_width": 100},
)
