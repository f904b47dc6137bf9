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
* ``versions``: this package's version, the versions of what it runs with
  (for the ``.pyz``, what it bundles) and the interpreter's.
"""

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


def main(argv=None, bundle=None):
    """Dispatch on the first argument (see the module docstring); ``bundle`` is the .pyz's manifest."""
    args = sys.argv[1:] if argv is None else list(argv)
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    command = args[0] if args else ""
    if command == "nsqlookupd" or program.startswith("nsqlookupd"):
        from .lookupd.cli import main as nsqlookupd

        nsqlookupd(args[1:] if command == "nsqlookupd" else args, prog_name="nsqlookupd-threaded")
    elif command == "nsqadmin" or program.startswith("nsqadmin"):
        from .admin.cli import main as nsqadmin

        nsqadmin(args[1:] if command == "nsqadmin" else args, prog_name="nsqadmin-threaded")
    elif command == "versions" and len(args) == 1:
        print("\n".join(versions(bundle)))
    else:
        from .cli import main as nsqd

        nsqd(args[1:] if command == "nsqd" else args, prog_name="nsqd-threaded")


if __name__ == "__main__":
    main()
