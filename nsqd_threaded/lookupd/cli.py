"""The ``nsqlookupd-threaded`` command: nsqlookupd 1.3's flags and config file, then run until signalled.

Flag names, defaults and config-file keys are Go nsqlookupd's, and Go's
``-name=value`` / bare boolean ``-name`` forms are accepted
(:func:`go_style_args`).  Precedence: flag, then config file, then default.
"""

import dataclasses
import platform
import signal

import click

from ..settings import config
from ..gocompat import format_duration, parse_duration
from ..logger import Logger
from ..settings.options import VERSION
from .nsqlookupd import LOG_LEVELS, LookupdOptions, NSQLookupd

FATAL = 5


def _parse_log_level(text):
    if text.lower() not in LOG_LEVELS:
        raise ValueError("invalid log level %r (debug, info, warn, error, fatal)" % text)
    return text.lower()


class _GoValue(click.ParamType):
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


def _parse_go_bool(text):
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError("invalid boolean %r" % text)


_DURATION = _GoValue("duration", parse_duration)
_BOOL = _GoValue("bool", _parse_go_bool)
_LEVEL = _GoValue("level", _parse_log_level)

_DEFAULTS = LookupdOptions(broadcast_address="")

# (flag, kind, help) in nsqlookupd's order; kind "option" flags are LookupdOptions fields.
FLAGS = (
    ("config", str, "path to config file"),
    ("version", _BOOL, "print version string"),
    ("log-level", _LEVEL, "set log verbosity: debug, info, warn, error, or fatal (default INFO)"),
    ("log-prefix", str, 'log message prefix (default "[nsqlookupd] ")'),
    ("verbose", _BOOL, "[deprecated] has no effect, use --log-level"),
    ("tcp-address", str, '<addr>:<port> to listen on for TCP clients (default "0.0.0.0:4160")'),
    ("http-address", str, '<addr>:<port> to listen on for HTTP clients (default "0.0.0.0:4161")'),
    ("broadcast-address", str, "address of this lookupd node, (default to the OS hostname)"),
    (
        "inactive-producer-timeout",
        _DURATION,
        "duration of time a producer will remain in the active list since its last ping (default %s)"
        % format_duration(_DEFAULTS.inactive_producer_timeout),
    ),
    (
        "tombstone-lifetime",
        _DURATION,
        "duration of time a producer will remain tombstoned if registration remains (default %s)"
        % format_duration(_DEFAULTS.tombstone_lifetime),
    ),
)
_BOOL_FLAGS = {"version", "verbose"}
_FLAG_NAMES = {name for name, _, _ in FLAGS}
_OPTION_FIELDS = {f.name: f for f in dataclasses.fields(LookupdOptions)}


def go_style_args(args):
    """Go ``flag`` syntax -> click's: ``-name[=v]`` -> ``--name[=v]``, a bare boolean -> ``--name=true``."""
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
        elif name in _BOOL_FLAGS:
            out.append("--%s=%s" % (name, value if eq else "true"))
        elif name in _FLAG_NAMES:
            out.append("--" + body)
            if not eq:
                following = next(rest, None)
                if following is not None:
                    out.append(following)  # the value, even if it starts with "-"
        else:
            out.append(arg)
    return out


def version_line():
    return "nsqlookupd-threaded v%s (python %s)" % (VERSION, platform.python_version())


def fatal(message):
    """``FATAL: message`` in nsqlookupd's log format, then exit 1."""
    Logger(prefix="[nsqlookupd] ").log(FATAL, "%s", message)
    raise click.exceptions.Exit(1)


def _coerce(key, value):
    """A config-file value -> the option's value (durations: a Go string or integer milliseconds)."""
    kind = _OPTION_FIELDS[key].type
    if kind in (float, "float"):
        if isinstance(value, str):
            return parse_duration(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value / 1000.0
        raise ValueError('want a duration string like "45s" or integer milliseconds, got %r' % (value,))
    if not isinstance(value, str):
        raise ValueError("want a string, got %r" % (value,))
    return _parse_log_level(value) if key == "log_level" else value


def _read_config(path):
    try:
        doc = config.load(path)
    except (OSError, ValueError) as e:
        fatal("failed to load config file %s - %s" % (path, e))
    values = {}
    for key, value in doc.items():
        if key not in _OPTION_FIELDS:
            continue  # nsqlookupd ignores keys it has no option for
        try:
            values[key] = _coerce(key, value)
        except ValueError as e:
            if key == "log_level":
                fatal("failed parsing log_level %s" % value)
            fatal("failed to load config file %s - %s: %s" % (path, key, e))
    return values


def resolve(params):
    """Click's parameters -> LookupdOptions: flag > config file > default."""
    values = _read_config(params["config"]) if params.get("config") else {}
    for field in _OPTION_FIELDS:
        if params.get(field) is not None:
            values[field] = params[field]
    return LookupdOptions(**values)


def serve(options):
    """Run an NSQLookupd until SIGTERM or SIGINT, then stop it."""
    lookupd = NSQLookupd(options)
    # Signals are blocked in every thread (threads inherit the mask) and taken
    # synchronously with sigwait, so no handler runs at an arbitrary bytecode.
    signals = {signal.SIGTERM, signal.SIGINT}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        try:
            lookupd.start()
        except (OSError, ValueError) as e:
            fatal("failed to instantiate nsqlookupd - %s" % (e.strerror if isinstance(e, OSError) and e.strerror else e))
        signum = signal.sigwait(signals)
        lookupd.log.info("%s: shutting down", signal.Signals(signum).name)
        lookupd.stop()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _run(**params):
    if params.get("version"):
        click.echo(version_line())
        return
    serve(resolve(params))


def _option(flag, kind, help_text):
    return click.Option(
        ["--" + flag, flag.replace("-", "_")],
        type=kind,
        default=None,
        metavar="[=BOOL]" if flag in _BOOL_FLAGS else None,
        help=help_text,
    )


class _GoFlagCommand(click.Command):
    def parse_args(self, ctx, args):
        return super().parse_args(ctx, go_style_args(args))


main = _GoFlagCommand(
    "nsqlookupd-threaded",
    params=[_option(*f) for f in FLAGS],
    callback=_run,
    help="NSQ's nsqlookupd 1.3 in pure Python.  Flags are nsqlookupd's: -name=value or --name value.",
    context_settings={"max_content_width": 100},
)
