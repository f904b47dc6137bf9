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
        self.db = RegistrationDB()

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
