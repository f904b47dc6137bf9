"""nsqlookupd's settings: one table of :class:`~nsqd_threaded.settings.options.Setting`
entries, and :class:`LookupdOptions` built from it, as nsqd's Options are.

Flag names, defaults and config-file keys are Go nsqlookupd 1.3's, plus the
broker's HTTP deadlines (``--http-read-timeout``, ``--http-idle-timeout``),
since nsqlookupd serves its HTTP API on the same edge.  Durations are float
seconds.
"""

import socket

from ..settings.options import (
    BOOL,
    COMMAND_SETTINGS,
    DURATION,
    STR,
    Setting,
    check_settings,
    daemon_settings,
    options_class,
)

# Table order is LookupdOptions' field order (keyword-free construction keeps working).
SETTINGS = (
    # A bad address fails NSQLookupd.start(), naming the flag.
    Setting("tcp-address", STR, "0.0.0.0:4160", "address to listen on for TCP clients (<addr>:<port> for "
            "TCP/IP or <path> for unix socket)"),
    Setting("http-address", STR, "0.0.0.0:4161", "address to listen on for HTTP clients (<addr>:<port> for "
            "TCP/IP or <path> for unix socket)"),
    Setting("broadcast-address", STR, None, "address of this lookupd node, (default to the OS hostname)",
            factory=socket.gethostname),
    Setting("inactive-producer-timeout", DURATION, 300.0, "duration of time a producer will remain in "
            "the active list since its last ping"),
    Setting("tombstone-lifetime", DURATION, 45.0, "duration of time a producer will remain tombstoned "
            "if registration remains"),
    *daemon_settings("nsqlookupd"),
    *COMMAND_SETTINGS,
    Setting("time-skipping", BOOL, False, "(not in Go nsqlookupd) let POST /debug/time/skip move this "
            "lookupd's clock forward, for test suites: inactive producers and tombstones expire at once"),
)


@options_class(SETTINGS)
class LookupdOptions:
    """nsqlookupd's options (flag ``--tcp-address`` is field ``tcp_address``)."""

    def validate(self):
        """Raise OptionError (a ValueError) naming the flag for an unusable value; returns self."""
        check_settings(self, SETTINGS)
        return self
