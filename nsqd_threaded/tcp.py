"""The TCP listener: a ``socketserver.ThreadingTCPServer``, one thread per connection."""

import socket
import socketserver
import threading

from .protocol_v2 import handle_connection
from .servers import BrokerServerMixIn, split_address


class _ConnectionHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.current_thread().name = "nsqd-conn[%s:%s]" % self.client_address[:2]
        handle_connection(self.server.nsqd, sock, self.client_address)


class TCPServer(BrokerServerMixIn, socketserver.ThreadingTCPServer):
    """Accepts protocol V2 connections for one NSQD.

    The stock ThreadingMixIn records every connection thread and
    ``server_close()`` joins them; :meth:`close_connections` first wakes them.
    """

    allow_reuse_address = True
    daemon_threads = False
    block_on_close = True
    request_queue_size = 128
    log_name = "TCP"

    def __init__(self, address, nsqd):
        host, port = split_address(address)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.nsqd = nsqd
        self.log = nsqd.log
        super().__init__((host, port), _ConnectionHandler)
