"""``python -m nsqd_threaded`` and the single-file build: one entry point for every command.

The arguments are nsqd's flags, unchanged.  A first argument naming a
command picks another one (nsqd takes no positional arguments, so none is
ambiguous):

* ``nsqlookupd [FLAGS]``: the ``nsqlookupd-threaded`` command; so is any
  invocation whose program name starts with ``nsqlookupd`` (a symlink
  ``nsqlookupd.pyz -> nsqd-threaded.pyz``);
* ``nsqadmin [FLAGS]``: the ``nsqadmin-threaded`` command (the web UI); so is
  any invocation whose program name starts with ``nsqadmin``;
* ``nsqd [FLAGS]``: nsqd, stated explicitly;
* the operator tools (:mod:`nsqd_threaded.tools`), by their short name or
  Go's: ``tail``/``nsq_tail``, ``to-nsq``/``to_nsq``, ``stat``/``nsq_stat``,
  ``to-file``/``nsq_to_file``, ``to-http``/``nsq_to_http``, ``relay``/``nsq_to_nsq``; so is any invocation whose program name is a
  tool's Go name (a symlink ``nsq_tail -> nsqd-threaded.pyz``);
* ``versions``: this package's version, the versions of what it runs with
  (for the ``.pyz``, what it bundles) and the interpreter's;
* ``--help`` (or ``help``) alone: the list of commands, then nsqd's flags.

Any other first argument that is not a flag is a mistyped command (nsqd
takes no positional argument): it is refused with the list of commands,
exit 2, as a bad flag is.
"""

import difflib
import os
import platform
import sys


def versions(bundle=None):
    """``name version`` lines: the bundle's manifest when given, else the installed distributions."""
    if bundle is None:
        from importlib import metadata

        from .settings.options import VERSION

        bundle = {"nsqd-threaded": VERSION}
        for name in ("click", "sortedcontainers"):
            try:
                bundle[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                bundle[name] = "(not installed)"
    lines = ["%s %s" % item for item in bundle.items()]
    lines.append("python %s (%s)" % (platform.python_version(), platform.python_implementation()))
    return lines


def commands_help():
    """What ``--help`` prints before nsqd's flags: every command of this entry point."""
    from . import tools

    lines = [
        "Usage: python3 nsqd-threaded.pyz [COMMAND] [FLAGS]   (or python -m nsqd_threaded)",
        "",
        "Commands (no command: nsqd):",
        "  nsqd          the message broker (nsqd-threaded)",
        "  nsqlookupd    the lookup daemon (nsqlookupd-threaded)",
        "  nsqadmin      the web UI (nsqadmin-threaded)",
    ]
    what = {"nsq_tail": "print a topic's messages", "to_nsq": "publish stdin, one message per line",
            "nsq_stat": "a topic/channel's stats every interval", "nsq_to_file": "archive topics to rotating files",
            "nsq_to_http": "send each message to HTTP endpoints", "nsq_to_nsq": "relay topics to other nsqd"}
    for go_name, (_, short) in tools.COMMANDS.items():
        lines.append("  %-13s %s (also %s; %s-threaded)" % (short, what[go_name], go_name, go_name))
    lines += ["  versions      the versions of this package, its dependencies and Python", "",
              "COMMAND --help shows a command's flags.  nsqd's flags:", ""]
    return "\n".join(lines)


def command_names():
    """Every first argument that names a command (short and Go names of the tools included)."""
    from . import tools

    names = ["nsqd", "nsqlookupd", "nsqadmin"]
    for go_name, (_, short) in tools.COMMANDS.items():
        names += [short, go_name]
    return names + ["versions", "help"]


def no_such_command(name):
    """The three lines (usage, error, hint) for a first argument that names no command; exit status 2."""
    names = command_names()
    close = difflib.get_close_matches(name, names, n=1)
    hint = " (did you mean %s?)" % close[0] if close else ""
    sys.stderr.write("Usage: nsqd-threaded [COMMAND] [FLAGS]   (commands: %s)\n" % ", ".join(names[:-1]))
    sys.stderr.write("Error: no such command %r%s; without a command the flags are nsqd's.\n" % (name, hint))
    sys.stderr.write("Try 'nsqd-threaded --help' for the commands and nsqd's flags.\n")
    return 2


def main(argv=None, bundle=None):
    """Dispatch on the first argument (see the module docstring); ``bundle`` is the .pyz's manifest."""
    args = sys.argv[1:] if argv is None else list(argv)
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    command = args[0] if args else ""
    from . import tools

    tool = tools.command_for(command) if command else None
    if tool is None and program:
        tool = program.split(".")[0].replace("-threaded", "")
        tool = tool if tool in tools.COMMANDS else None  # only Go's names, never a short one
        if tool is not None:
            command = ""  # the program name picked it: every argument is the tool's
    if tool is not None:
        name = tool + "-threaded"
        tools.load(tool)(args[1:] if command else args, prog_name=name)
    elif command in ("--help", "-help", "-h", "help") and len(args) == 1:
        print(commands_help())
        from .cli import main as nsqd

        nsqd(["--help"], prog_name="nsqd-threaded")
    elif command == "nsqlookupd" or program.startswith("nsqlookupd"):
        from .lookupd.cli import main as nsqlookupd

        nsqlookupd(args[1:] if command == "nsqlookupd" else args, prog_name="nsqlookupd-threaded")
    elif command == "nsqadmin" or program.startswith("nsqadmin"):
        from .admin.cli import main as nsqadmin

        nsqadmin(args[1:] if command == "nsqadmin" else args, prog_name="nsqadmin-threaded")
    elif command == "versions" and len(args) == 1:
        print("\n".join(versions(bundle)))
    elif command and not command.startswith("-") and command not in command_names():
        sys.exit(no_such_command(command))
    else:
        from .cli import main as nsqd

        nsqd(args[1:] if command == "nsqd" else args, prog_name="nsqd-threaded")


if __name__ == "__main__":
    main()
