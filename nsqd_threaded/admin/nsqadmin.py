"""NSQAdmin: one nsqadmin (web UI and JSON API over a cluster) in this process.

::

    with NSQAdmin(http_address="127.0.0.1:0", lookupd_http_addresses=[lookupd_addr]) as admin:
        admin.http_url      # "http://127.0.0.1:41235"

Threads (all named, all joined by :meth:`stop`): ``nsqadmin-http`` accepts
connections, each served by ``nsqadmin-http[ip:port]``; each question to the
cluster runs on up to :data:`~.cluster.MAX_QUERY_THREADS` threads
``nsqadmin-lookupd[addr]`` / ``nsqadmin-nsqd[addr]`` joined before it answers;
``nsqadmin-notify`` posts notifications when an endpoint is set.
"""

import dataclasses
import socket
import threading

from ..command import ListeningApp, Listeners
from ..internal.logger import Logger
from ..settings.options import VERSION
from .cluster import ClusterInfo, HTTPClient
from .http import HTTPServer
from .options import AdminOptions
from .actions import Notifier


class NSQAdmin(ListeningApp):
    """One admin app.  :meth:`start` binds its listener (or raises), :meth:`stop` undoes everything.

    ``_state_lock`` guards the started/stopped state so that concurrent
    start()/stop() calls run once each.
    """

    def __init__(self, options=None, logger=None, **overrides):
        options = dataclasses.replace(options or AdminOptions(), **overrides)
        options.validate()
        self.options = options
        self.version = VERSION
        self.hostname = socket.gethostname()
        self.log = logger or Logger(prefix=options.log_prefix, level=options.log_level)
        self.client = HTTPClient(options.http_client_connect_timeout, options.http_client_request_timeout,
                                 "nsqadmin-threaded/%s" % VERSION)
        self.cluster = ClusterInfo(self.client, options.lookupd_http_addresses, options.nsqd_http_addresses)
        self.notifier = None
        if options.notification_http_endpoint:
            self.notifier = Notifier(options.notification_http_endpoint, self.client, self.log)
        self._state_lock = threading.Lock()  # guards _http, _listeners, _stopped
        self._http = None
        self._listeners = None
        self._stopped = False

    def start(self):
        with self._state_lock:
            if self._http is not None or self._stopped:
                raise RuntimeError("NSQAdmin can be started once")
            self.log.info("nsqadmin-threaded v%s", self.version)
            listeners = Listeners(self.log)
            self._http = listeners.open("http-address", HTTPServer, self.options.http_address, self,
                                        kind="HTTP", thread_name="nsqadmin-http")
            if self.notifier is not None:
                self.notifier.start()
            listeners.start()
            self._listeners = listeners
        return self

    def stop(self):
        """Close the listener and every connection, join every thread.  Idempotent."""
        with self._state_lock:
            if self._stopped:
                return
            self._stopped = True
            listeners = self._listeners
        if listeners is not None:
            listeners.stop()
            if self.notifier is not None:
                self.notifier.stop()
