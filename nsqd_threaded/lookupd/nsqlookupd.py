"""NSQLookupd: one nsqlookupd (TCP for nsqd peers, HTTP for clients) in this process.

::

    with NSQLookupd(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as lookupd:
        lookupd.tcp_address     # ("127.0.0.1", 41234): the real ports
        lookupd.http_url        # "http://127.0.0.1:41235"

    with NSQLookupd.local() as lookupd:   # the same, for tests (broadcast address 127.0.0.1)
        ...

Threads (all named, all joined by :meth:`stop`):

* ``nsqlookupd-tcp`` accepts peers; each peer gets ``nsqlookupd-peer[ip:port]``;
* ``nsqlookupd-http`` accepts HTTP connections; each gets ``nsqlookupd-http[ip:port]``.

Nothing is module-global: any number of instances can run in one process.
"""

import os

from ..command import ListeningApp
from ..internal.gocompat import is_abstract_socket
from .http import LookupdHTTPServer
from .options import LookupdOptions
from ..internal.clock import Clock, TimeSkippingDisabled, parse_skip_ns
from .registration_db import RegistrationDB
from .tcp import LookupdTCPServer


class NSQLookupd(ListeningApp):
    """One lookup daemon.  :meth:`start` binds both listeners (or raises), :meth:`stop` undoes everything."""

    program = "nsqlookupd"
    servers = ("_tcp", "_http")
    listen_order = ("HTTP", "TCP")
    _tcp = None

    def __init__(self, options=None, logger=None, **overrides):
        self._setup(options, LookupdOptions, logger, overrides)
        # The lookupd's time (producer inactivity, tombstones): real time, which
        # --time-skipping lets advance() move forward.
        self.clock = Clock(self.options.time_skipping)
        self.db = RegistrationDB(self.clock)

    @classmethod
    def local(cls, logger=None, **overrides):
        """An instance for tests: 127.0.0.1, ephemeral ports, broadcast address 127.0.0.1 (not started)."""
        overrides.setdefault("tcp_address", "127.0.0.1:0")
        overrides.setdefault("http_address", "127.0.0.1:0")
        overrides.setdefault("broadcast_address", "127.0.0.1")
        return cls(logger=logger, **overrides)

    def _open(self, listeners):
        self._tcp = listeners.open("tcp-address", LookupdTCPServer, self.options.tcp_address, self,
                                   kind="TCP", thread_name="nsqlookupd-tcp")
        self._http = listeners.open("http-address", LookupdHTTPServer, self.options.http_address, self,
                                    kind="HTTP", thread_name="nsqlookupd-http")

    # -- time skipping ----------------------------------------------------------------

    def next_deadline_in(self, tombstones_only=False):
        """Seconds of the clock until a producer goes inactive or a tombstone expires; None if none will.

        ``tombstones_only``: leave the producers out (they ping, e.g. the brokers of a test's cluster)."""
        options = self.options
        inactivity = None if tombstones_only else options.inactive_producer_timeout
        return self.db.next_deadline_in(inactivity, options.tombstone_lifetime)

    def listeners(self):
        """The listeners serving now (TCP, HTTP): what a test's time skipping looks at for work under way."""
        return [s for s in (self._tcp, self._http) if s is not None]

    def advance(self, seconds=None):
        """Time skipping: move the clock forward by ``seconds`` (a number or a Go duration), or
        (None) to the next deadline; returns the seconds skipped (0.0 when nothing is pending).

        Producers and tombstones are filtered by age when they are looked at,
        so what fell due is expired once the clock has moved.  Raises
        :class:`~nsqd_threaded.internal.clock.TimeSkippingDisabled` without ``--time-skipping``.
        """
        if not self.clock.skipping:
            raise TimeSkippingDisabled("time skipping is off (start nsqlookupd with --time-skipping)")
        if seconds is None:
            seconds = self.next_deadline_in()
            if seconds is None:
                return 0.0
        elif isinstance(seconds, str):
            seconds = parse_skip_ns(seconds) / 1e9
        self.clock.skip(seconds)
        return seconds

    # -- addresses (the HTTP ones are ListeningApp's) ---------------------------------

    @property
    def tcp_address(self):
        """``(host, port)`` the TCP listener is bound to (the real port when 0 was asked), or its socket path."""
        return self._tcp.bound_address

    @property
    def tcp_port(self):
        """The TCP listener's port; -1 on a unix socket (what nsqd's /info says for one)."""
        port = self._tcp.port
        return -1 if port is None else port

    @property
    def http_port(self):
        """The HTTP listener's port; -1 on a unix socket."""
        port = self._http.port
        return -1 if port is None else port

    @property
    def http_socket(self):
        """The HTTP listener's unix socket, absolute (or ``@name``), None on TCP: what a peer on our
        unix socket is told in the IDENTIFY reply, to query us from another working directory."""
        path = self._http.socket_path
        if path is None or is_abstract_socket(path):
            return path
        return os.path.abspath(path)

    @property
    def tcp_addr(self):
        """``"host:port"`` (or the socket path) of the TCP listener, as nsqd's ``--lookupd-tcp-address`` takes it."""
        return self._tcp.describe()
