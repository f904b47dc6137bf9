"""The ``nsqadmin-threaded`` command: Go nsqadmin 1.3's flags and config file, then run until signalled.

The app shell's command (:class:`nsqd_threaded.command.AppCommand`): Go's
``-name=value`` and bare boolean forms, flag > config file > default, flags
of features not built (graphite, ``--dev-static-dir``) refused, every
startup failure one ``FATAL`` line.
"""

from .. import command
from .nsqadmin import NSQAdmin
from .options import SETTINGS, AdminOptions

LOG_PREFIX = "[nsqadmin] "

main = command.AppCommand(
    "nsqadmin-threaded",
    SETTINGS,
    AdminOptions,
    NSQAdmin,
    log_prefix=LOG_PREFIX,
    daemon="nsqadmin",
    help="NSQ's nsqadmin 1.3 in pure Python: the cluster's web UI and JSON API.  Flags are nsqadmin's: "
    "-name=value or --name value.  Graphite is not supported (--graphite-url is refused): topic and "
    "channel pages draw the last minutes of rates from polled stats instead.",
)

resolve = main.resolve
fatal = main.fatal
serve = main.serve
