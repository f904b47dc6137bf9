"""NSQ 1.3's operator tools in pure Python, each Go's app of the same name on the package's client.

* :mod:`.nsq_tail`: print a topic's messages;
* :mod:`.to_nsq`: publish stdin, one message per line (or per ``--delimiter``);
* :mod:`.nsq_stat`: a topic/channel's numbers across the cluster, every interval;
* :mod:`.nsq_to_file`: archive topics to rotating (optionally gzipped) files;
* :mod:`.nsq_to_http`: send each message to HTTP endpoints (POST, or GET with a URL template);
* :mod:`.nsq_to_nsq`: relay topics to other nsqd, FINed once the destination acknowledged.

Each is a settings table (Go's flag names and defaults) and an app
(``start``/``stop``/``done``) run by the app shell,
:class:`nsqd_threaded.command.AppCommand`; :data:`COMMANDS` maps each Go
name to its module, for the console scripts and ``python -m nsqd_threaded``.
"""

# Go's name -> (module, the short subcommand name of python -m nsqd_threaded).
COMMANDS = {
    "nsq_tail": ("nsq_tail", "tail"),
    "to_nsq": ("to_nsq", "to-nsq"),
    "nsq_stat": ("nsq_stat", "stat"),
    "nsq_to_file": ("nsq_to_file", "to-file"),
    "nsq_to_http": ("nsq_to_http", "to-http"),
    "nsq_to_nsq": ("nsq_to_nsq", "relay"),
}


def command_for(name):
    """The Go tool name a subcommand or program name means (``tail``, ``nsq_tail``, ``nsq-tail``), or None."""
    name = name.replace("-", "_")
    for go_name, (_, short) in COMMANDS.items():
        if name in (go_name, short.replace("-", "_")):
            return go_name
    return None


def load(go_name):
    """The click command of a tool."""
    import importlib

    return importlib.import_module("%s.%s" % (__name__, COMMANDS[go_name][0])).main
