"""The ``nsqadmin-threaded`` command: Go nsqadmin 1.3's flags and config file, then run until signalled.

Built as nsqlookupd's is (:mod:`nsqd_threaded.command`): Go's
``-name=value`` and bare boolean forms, flag > config file > default, flags
of features not built (graphite, ``--dev-static-dir``) refused, every
startup failure one ``FATAL`` line.
"""

from .. import command
from .nsqadmin import NSQAdmin
from .options import SETTINGS, AdminOptions

LOG_PREFIX = "[nsqadmin] "


def resolve(params):
    """Click's parsed parameters -> ``(AdminOptions, warnings)``: flag > config file > default."""
    return command.resolve(params, SETTINGS, AdminOptions, "nsqadmin", LOG_PREFIX)


def fatal(message):
    command.fatal(message, LOG_PREFIX)


def serve(options, warnings=()):
    """Run an NSQAdmin until SIGTERM or SIGINT, then stop it."""
    admin = NSQAdmin(options)
    for warning in warnings:
        admin.log.warn("%s", warning)
    command.run_until_signalled(
        admin, lambda e: fatal("failed to instantiate nsqadmin - %s" % command.error_text(e))
    )


main = command.GoFlagCommand(
    "nsqadmin-threaded",
    SETTINGS,
    resolve,
    serve,
    help="NSQ's nsqadmin 1.3 in pure Python: the cluster's web UI and JSON API.  Flags are nsqadmin's: "
    "-name=value or --name value.  Graphite is not supported (--graphite-url is refused): topic and "
    "channel pages draw the last minutes of rates from polled stats instead.",
    context_settings={"max_content_width": 100},
)
