"""The ``nsqd-threaded`` command: nsqd's flags and config file, then run until signalled.

Flags are Go nsqd's, spelled and defaulted the same, so a Go nsqd command
line works unchanged: Go's ``-name=value`` and bare boolean ``-name`` forms
are rewritten into click's before parsing (:func:`go_style_args`).  Every
command's shell is :class:`nsqd_threaded.command.AppCommand`.  Flags of
features that are not built yet are refused rather than ignored, unless they
only restate what the broker does anyway (``--snappy=false``).  Every startup
failure is one ``FATAL`` line naming what to fix, never a traceback.
"""

import click  # noqa: F401 (testing/flags.py catches the exceptions of this click)

from . import command
from .internal.process import tune_gc, widen_futex_hash
from .server.nsqd import NSQD
from .settings.options import BY_FIELD, SETTINGS, Options, check_data_path


def _prepare(options):
    """Before the broker exists: its data path must be usable; then the process-wide tuning
    (this process is the broker's).  The futex hash is widened here, while the process has
    one thread: the broker would do it after its first threads, where the kernel takes some
    30 ms to move their waiters to the new table."""
    problem = check_data_path(options.data_path)
    if problem:
        fatal("failed to instantiate nsqd - %s" % problem)
    tune_gc()
    widen_futex_hash()


def _start_failure(exc):
    """nsqd's FATAL wording: lock and listen errors come from instantiating it,
    nsqd.dat errors from loading metadata afterwards."""
    text = command.error_text(exc)
    if text.startswith("failed to parse metadata"):
        return "failed to load metadata - %s" % text
    return "failed to instantiate nsqd - %s" % text


main = command.AppCommand(
    "nsqd-threaded",
    SETTINGS,
    Options,
    NSQD,
    log_prefix=BY_FIELD["log_prefix"].default,
    daemon="nsqd",
    prepare=_prepare,
    start_failure=_start_failure,
    help="NSQ's nsqd 1.3 message broker, in pure Python.  Flags are nsqd's: "
    "-name=value or --name value; booleans --name or --name=false.",
)


def go_style_args(args):
    """Go ``flag`` syntax -> click's, for nsqd's flags (:func:`~nsqd_threaded.command.go_style_args`)."""
    return command.go_style_args(args, SETTINGS)


def version_line():
    """``nsqd v1.3.0 (built w/cpython3.11.7)``, Go's nsqd's line."""
    return main.version_line()


def given_flags(params):
    """Click's parsed parameters -> ``{Setting: value}`` for the flags given (repeatable ones flattened)."""
    return command.given_flags(params, SETTINGS)


def parse(args):
    """Parse a command line: ``(flags, params)``; raises what click raises (Exit for --help)."""
    return main.parse(args)


def resolve(params):
    """Click's parsed parameters -> ``(Options, warnings)``: flag > config file > default.

    Exits 2 for an unbuilt feature (NotSupportedError), and exits 1 with nsqd's
    FATAL line for an unusable config file or a value Options rejects.
    """
    return main.resolve(params)


def fatal(message):
    """Log ``FATAL: message`` in nsqd's format and exit 1, as nsqd's logFatal does."""
    command.fatal(message, BY_FIELD["log_prefix"].default)


def serve(options, warnings=()):
    """Run a broker until SIGTERM or SIGINT, then stop it gracefully."""
    main.serve(options, warnings)
