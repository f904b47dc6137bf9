"""NSQAdmin: one nsqadmin (web UI and JSON API over a cluster) in this process.

::

    with NSQAdmin(http_address="127.0.0.1:0", lookupd_http_addresses=[lookupd_addr]) as admin:
        admin.http_url      # "http://127.0.0.1:41235"

Threads (all named, all joined by :meth:`stop`): ``nsqadmin-http`` accepts
connections, each served by ``nsqadmin-http[ip:port]``; each question to the
cluster runs on up to :data:`~.cluster.MAX_QUERY_THREADS` threads
``nsqadmin-lookupd[addr]`` / ``nsqadmin-nsqd[addr]`` joined before it answers;
``nsqadmin-notify`` posts notifications when an endpoint is set;
``nsqadmin-sampler`` samples the nodes for the charts (unless
``--chart-sample-interval`` is 0).
"""

import dataclasses
import threading

from ..command import ListeningApp
from ..internal.httpclient import client_ssl_context
from ..settings.options import VERSION
from .cluster import ClusterInfo, HTTPClient
from .http import AdminHTTPServer
from .options import AdminOptions
from .actions import Notifier
from .sampler import Sampler


class NSQAdmin(ListeningApp):
    """One admin app.  :meth:`start` binds its listener (or raises), :meth:`stop` undoes everything.

    ``options`` is replaced whole, never changed in place, when
    ``PUT /config/<opt>`` changes a setting (:meth:`change_options`); readers
    take one reference and keep it.
    """

    program = "nsqadmin"

    def __init__(self, options=None, logger=None, **overrides):
        self._setup(options, AdminOptions, logger, overrides)
        options = self.options
        self.client = HTTPClient(options.http_client_connect_timeout, options.http_client_request_timeout,
                                 "nsqadmin-threaded/%s" % VERSION)
        self.cluster = ClusterInfo(self.client, options.lookupd_http_addresses, options.nsqd_http_addresses)
        self.notifier = None
        if options.notification_http_endpoint:
            self.notifier = Notifier(options.notification_http_endpoint, self.client, self.log)
        # no graphite is built (--graphite-url is refused): the charts are always nsqadmin's own samples
        self.sampler = None
        if options.chart_sample_interval > 0:
            self.sampler = Sampler(self.cluster, options.chart_sample_interval, self.log)
        self._config_lock = threading.Lock()  # serializes change_options (read, replace, apply)

    def _open(self, listeners):
        self.client.ssl_context = self._ssl_context()
        self._http = listeners.open("http-address", AdminHTTPServer, self.options.http_address, self,
                                    kind="HTTP", thread_name="nsqadmin-http")

    def _serving(self):
        if self.notifier is not None:
            self.notifier.start()
        if self.sampler is not None:
            self.sampler.start()

    def _stopped_serving(self):
        if self.sampler is not None:
            self.sampler.stop()
        if self.notifier is not None:
            self.notifier.stop()

    def _ssl_context(self):
        """The HTTP client's TLS settings (``--http-client-tls-*``), or ValueError saying which file failed."""
        opts = self.options
        try:
            context = client_ssl_context(opts.http_client_tls_root_ca_file,
                                         insecure_skip_verify=opts.http_client_tls_insecure_skip_verify)
        except OSError as e:  # ssl.SSLError included
            raise ValueError("failed to read TLS root CA file %s - %s"
                             % (opts.http_client_tls_root_ca_file, e)) from None
        if opts.http_client_tls_cert:
            try:
                context.load_cert_chain(opts.http_client_tls_cert, opts.http_client_tls_key)
            except OSError as e:
                raise ValueError("failed to LoadX509KeyPair %s, %s - %s"
                                 % (opts.http_client_tls_cert, opts.http_client_tls_key, e)) from None
        return context

    def change_options(self, **changes):
        """Replace ``options`` with ``changes`` applied (``PUT /config``), and apply them; returns the new options."""
        with self._config_lock:
            options = dataclasses.replace(self.options, **changes)
            self.options = options
            if "lookupd_http_addresses" in changes:
                self.cluster.lookupds = list(options.lookupd_http_addresses)
            if "log_level" in changes:
                self.log.set_level(options.log_level)
            return options
