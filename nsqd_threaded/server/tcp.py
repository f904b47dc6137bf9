"""The TCP listener: one thread per protocol V2 connection, in the socketserver style."""

import socket
import socketserver

from .protocol_v2 import handle_connection
from .base import ConnectionRegistryMixIn, ConnectionThreadsMixIn, address_family, split_address


class _ConnectionHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handle_connection(self.server.nsqd, sock, self.client_address)


class TCPServer(ConnectionRegistryMixIn, ConnectionThreadsMixIn, socketserver.TCPServer):
    """Accepts protocol V2 connections for one NSQD.

    Each connection is registered (:class:`ConnectionRegistryMixIn`) before its
    thread ``nsqd-conn[ip:port]`` starts (:class:`ConnectionThreadsMixIn`);
    NSQD.stop calls :meth:`close_connections`, which ends those threads, then
    ``server_close()``, which joins them.

    Thread stacks keep the interpreter's default size: only touched pages are
    resident, so a smaller ``threading.stack_size`` saves address space, not
    memory, and it is process-wide, so setting it would also shrink the stacks
    of threads the embedding program starts meanwhile.
    """

    allow_reuse_address = True
    request_queue_size = 4096  # the kernel caps it at net.core.somaxconn, as Go's listen does
    log_name = "TCP"
    thread_name = "nsqd-conn"

    def __init__(self, address, nsqd):
        host, port = split_address(address)
        self.address_family = address_family(host)
        self.nsqd = nsqd
        self.log = nsqd.log
        super().__init__((host, port), _ConnectionHandler)
