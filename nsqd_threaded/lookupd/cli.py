"""The ``nsqlookupd-threaded`` command: nsqlookupd 1.3's flags and config file, then run until signalled.

Flag names, defaults and config-file keys are Go nsqlookupd's
(:mod:`.options`); the command is built as nsqd's is
(:mod:`nsqd_threaded.command`): Go's ``-name=value`` and bare
boolean ``-name`` forms, flag > config file > default, unknown config keys
warned about, and every startup failure one ``FATAL`` line.
"""

from .. import command
from .nsqlookupd import NSQLookupd
from .options import SETTINGS, LookupdOptions

LOG_PREFIX = "[nsqlookupd] "


def go_style_args(args):
    """Go ``flag`` syntax -> click's, for nsqlookupd's flags."""
    return command.go_style_args(args, SETTINGS)


def version_line():
    return command.version_line("nsqlookupd-threaded")


def resolve(params):
    """Click's parsed parameters -> ``(LookupdOptions, warnings)``: flag > config file > default."""
    return command.resolve(params, SETTINGS, LookupdOptions, "nsqlookupd", LOG_PREFIX)


def fatal(message):
    """``FATAL: message`` in nsqlookupd's log format, then exit 1."""
    command.fatal(message, LOG_PREFIX)


def serve(options, warnings=()):
    """Run an NSQLookupd until SIGTERM or SIGINT, then stop it."""
    lookupd = NSQLookupd(options)
    for warning in warnings:
        lookupd.log.warn("%s", warning)
    command.run_until_signalled(
        lookupd, lambda e: fatal("failed to instantiate nsqlookupd - %s" % command.error_text(e))
    )


main = command.GoFlagCommand(
    "nsqlookupd-threaded",
    SETTINGS,
    resolve,
    serve,
    help="NSQ's nsqlookupd 1.3 in pure Python.  Flags are nsqlookupd's: -name=value or --name value.",
    context_settings={"max_content_width": 100},
)
