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

import dataclasses
import socket
import threading

from ..command import ListeningApp, Listeners
from ..internal.logger import Logger
from ..settings.options import VERSION
from .http import LookupdHTTPServer
from .options import LookupdOptions
from .registration_db import RegistrationDB
from .tcp import LookupdTCPServer

class NSQLookupd(ListeningApp):
    """One lookup daemon.  :meth:`start` binds both listeners (or raises), :meth:`stop` undoes everything.

    ``_state_lock`` guards the started/stopped state so that concurrent
    start()/stop() calls run once each.
    """

    def __init__(self, options=None, logger=None, **overrides):
        options = dataclasses.replace(options or LookupdOptions(), **overrides)
        options.validate()
        self.options = options
        self.version = VERSION
        self.hostname = socket.gethostname()
        self.log = logger or Logger(prefix=options.log_prefix, level=options.log_level)
        self.db = RegistrationDB()
        self._state_lock = threading.Lock()  # guards _tcp, _http, _listeners, _stopped
        self._tcp = None
        self._http = None
        self._listeners = None
        self._stopped = False

    @classmethod
    def local(cls, logger=None, **overrides):
        """An instance for tests: 127.0.0.1, ephemeral ports, broadcast address 127.0.0.1 (not started)."""
        overrides.setdefault("tcp_address", "127.0.0.1:0")
        overrides.setdefault("http_address", "127.0.0.1:0")
        overrides.setdefault("broadcast_address", "127.0.0.1")
        return cls(logger=logger, **overrides)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self):
        """Bind both listeners and start serving; an OSError names the failed address."""
        with self._state_lock:
            if self._listeners is not None or self._stopped:
                raise RuntimeError("NSQLookupd can be started once")
            self.log.info("nsqlookupd-threaded v%s", self.version)
            listeners = Listeners(self.log)
            try:
                self._tcp = listeners.open("tcp-address", LookupdTCPServer, self.options.tcp_address, self,
                                           kind="TCP", thread_name="nsqlookupd-tcp")
                self._http = listeners.open("http-address", LookupdHTTPServer, self.options.http_address, self,
                                            kind="HTTP", thread_name="nsqlookupd-http")
            except BaseException:
                listeners.close_unstarted()
                self._tcp = self._http = None
                raise
            listeners.start(order=["HTTP", "TCP"])
            self._listeners = listeners
        return self

    def stop(self):
        """Close listeners and every connection, then join every thread.  Idempotent."""
        with self._state_lock:
            if self._stopped:
                return
            self._stopped = True
            listeners = self._listeners
        if listeners is not None:
            listeners.stop()

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
    def tcp_addr(self):
        """``"host:port"`` (or the socket path) of the TCP listener, as nsqd's ``--lookupd-tcp-address`` takes it."""
        return self._tcp.describe()
