"""The TCP listener: one thread per protocol V2 connection, in the socketserver style."""

import socket
import socketserver

from .protocol_v2 import handle_connection, thread_refusal
from .listener import Listener


class _ConnectionHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        if sock.family != socket.AF_UNIX:  # (a unix socket has no Nagle to turn off)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handle_connection(self.server.nsqd, sock, self.client_address, self.server.limits)


class TCPServer(Listener):
    """Accepts protocol V2 connections for one NSQD, each in a thread ``nsqd-conn[ip:port]``.

    Thread stacks keep the interpreter's default size: only touched pages are
    resident, so a smaller ``threading.stack_size`` saves address space, not
    memory, and it is process-wide, so setting it would also shrink the stacks
    of threads the embedding program starts meanwhile.
    """

    request_queue_size = 4096  # the kernel caps it at net.core.somaxconn, as Go's listen does
    log_name = "TCP"
    thread_name = "nsqd-conn"

    def __init__(self, address, nsqd):
        self.nsqd = nsqd
        super().__init__(address, _ConnectionHandler, nsqd.log)

    def refusal(self):
        return thread_refusal()
