"""The ``nsqlookupd-threaded`` command: nsqlookupd 1.3's flags and config file, then run until signalled.

Flag names, defaults and config-file keys are Go nsqlookupd's
(:mod:`.options`); the command is the app shell's
(:class:`nsqd_threaded.command.AppCommand`): Go's ``-name=value`` and bare
boolean ``-name`` forms, flag > config file > default, unknown config keys
warned about, and every startup failure one ``FATAL`` line.
"""

from .. import command
from .nsqlookupd import NSQLookupd
from .options import SETTINGS, LookupdOptions

LOG_PREFIX = "[nsqlookupd] "

main = command.AppCommand(
    "nsqlookupd-threaded",
    SETTINGS,
    LookupdOptions,
    NSQLookupd,
    log_prefix=LOG_PREFIX,
    daemon="nsqlookupd",
    help="NSQ's nsqlookupd 1.3 in pure Python.  Flags are nsqlookupd's: -name=value or --name value.",
)

go_style_args = main.go_style_args
version_line = main.version_line
resolve = main.resolve
fatal = main.fatal
serve = main.serve
