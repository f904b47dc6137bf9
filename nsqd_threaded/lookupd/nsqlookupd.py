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

from ..internal.logger import Logger
from ..settings.options import VERSION
from .http import LookupdHTTPServer
from .options import LookupdOptions
from .registration_db import RegistrationDB
from .tcp import LookupdTCPServer

class NSQLookupd:
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
        self._state_lock = threading.Lock()  # guards _tcp, _http, _threads, _stopped
        self._tcp = None
        self._http = None
        self._threads = []
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
            if self._tcp is not None or self._stopped:
                raise RuntimeError("NSQLookupd can be started once")
            self.log.info("nsqlookupd-threaded v%s", self.version)
            try:
                self._tcp = self._listen(LookupdTCPServer, "tcp-address", self.options.tcp_address)
                self._http = self._listen(LookupdHTTPServer, "http-address", self.options.http_address)
            except BaseException:
                if self._tcp is not None:
                    self._tcp.server_close()
                self._tcp = self._http = None
                raise
            for name, server, kind in (("nsqlookupd-http", self._http, "HTTP"), ("nsqlookupd-tcp", self._tcp, "TCP")):
                self.log.info("%s: listening on %s", kind, server.describe())
                thread = threading.Thread(target=server.serve_forever, name=name)
                thread.start()
                self._threads.append(thread)
        return self

    def _listen(self, server_class, flag, address):
        try:
            return server_class(address, self)
        except ValueError as e:
            raise ValueError("--%s: %s" % (flag, e)) from None
        except OSError as e:
            raise OSError(e.errno, "--%s: listen (%s) failed - %s" % (flag, address, e.strerror or e)) from None

    def stop(self):
        """Close listeners and every connection, then join every thread.  Idempotent."""
        with self._state_lock:
            if self._stopped:
                return
            self._stopped = True
            servers = [s for s in (self._tcp, self._http) if s is not None]
            threads, self._threads = self._threads, []
        for server in servers:
            server.shutdown()  # the accept loop returns at once (PromptShutdownMixIn)
        for server in servers:
            server.close_connections()
        for server in servers:
            server.server_close()  # joins the connection threads
        for thread in threads:
            thread.join()
        for server in servers:
            self.log.info("%s: closing %s", "TCP" if server is self._tcp else "HTTP", server.describe())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- addresses ---------------------------------------------------------------------

    @property
    def tcp_address(self):
        """``(host, port)`` the TCP listener is bound to (the real port when 0 was asked), or its socket path."""
        return self._tcp.bound_address

    @property
    def http_address(self):
        """``(host, port)`` the HTTP listener is bound to, or its socket path (a str)."""
        return self._http.bound_address

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

    @property
    def http_addr(self):
        """``"host:port"`` (or the socket path) of the HTTP listener, as pynsq's ``lookupd_http_addresses`` takes it."""
        return self._http.describe()

    @property
    def http_url(self):
        """``http://host:port`` (a unix socket has no URL: ValueError)."""
        if self._http.socket_path is not None:
            raise ValueError("the HTTP listener is the unix socket %s (no URL)" % self._http.socket_path)
        return "http://" + self.http_addr
