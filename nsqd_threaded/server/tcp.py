"""The TCP listener: protocol V2 connections served from epoll by a few threads, or one thread each."""

import socket
import socketserver

from .listener import Listener
from .netpoll import new_net_poller
from .protocol_v2 import handle_connection, thread_refusal


class _ConnectionHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        if sock.family != socket.AF_UNIX:  # (a unix socket has no Nagle to turn off)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handle_connection(self.server.nsqd, sock, self.client_address, self.server.limits)


class TCPServer(Listener):
    """Accepts protocol V2 connections for one NSQD.

    Where there is epoll (and without ``--connection-threads``) its
    :class:`~nsqd_threaded.server.netpoll.NetPoller` serves them: a connection
    holds a thread only while it has work.  Otherwise each connection gets a
    thread ``nsqd-conn[ip:port]`` of its own.

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
        self.poller = None
        super().__init__(address, _ConnectionHandler, nsqd.log)
        if not nsqd.options.connection_threads:
            self.poller = new_net_poller(nsqd, self.limits)
            if self.poller is not None:
                if self.socket_path is None:
                    # Nagle off for every connection at once: on Linux (the poller's platform) an
                    # accepted socket inherits TCP_NODELAY from its listener, which spares the accept
                    # thread a setsockopt per connection, and the interpreter lock a hand-off with it.
                    self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.poller.start(self)

    def process_request(self, request, client_address):
        if self.poller is None:
            super().process_request(request, client_address)
            return
        if self.register_connection(request):
            self.poller.add(request, client_address)  # (TCP_NODELAY: the listener's, inherited)

    def server_close(self):
        super().server_close()
        if self.poller is not None:
            self.poller.stop()  # (the connections were shut down: it tears down what is left)

    def refusal(self):
        return thread_refusal()
