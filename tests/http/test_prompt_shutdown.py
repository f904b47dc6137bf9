"""PromptShutdownMixIn: a shutdown that comes before the accept thread has started its loop, and the
accept loop's bursts."""

import socket
import socketserver
import threading

import pytest

from nsqd_threaded.server.listener import ACCEPT_BURST, PromptShutdownMixIn


class Server(PromptShutdownMixIn, socketserver.TCPServer):
    pass


def test_serve_forever_after_shutdown_and_close_returns_without_touching_the_socket():
    # A broker stopped right after start() can get here when its accept thread is slow to be
    # scheduled (seen on PyPy): the loop must not register a closed socket with its selector.
    server = Server(("127.0.0.1", 0), socketserver.BaseRequestHandler)
    server.shutdown()  # the loop never ran: returns at once
    server.server_close()
    errors = []

    def serve():
        try:
            server.serve_forever()
        except Exception as e:  # what the accept thread would have died of
            errors.append(e)

    t = threading.Thread(target=serve, name="late-accept", daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive()
    assert errors == []


def test_shutdown_waits_for_a_running_loop():
    server = Server(("127.0.0.1", 0), socketserver.BaseRequestHandler)
    t = threading.Thread(target=server.serve_forever, name="accept", daemon=True)
    t.start()
    server._serving.wait(timeout=10)
    server.shutdown()
    assert server._served.is_set()  # shutdown returned only once the loop had ended
    t.join(timeout=10)
    server.server_close()


class EchoLine(socketserver.StreamRequestHandler):
    def handle(self):
        self.wfile.write(self.rfile.readline())


class ThreadingServer(PromptShutdownMixIn, socketserver.ThreadingTCPServer):
    daemon_threads = True
    request_queue_size = 4 * ACCEPT_BURST


@pytest.mark.timeout(60)
def test_a_burst_longer_than_one_wake_up_is_all_accepted_and_each_socket_blocks():
    # The listening socket does not block (one wake-up accepts up to ACCEPT_BURST connections); what
    # it accepts must: each handler here waits in a blocking readline for a line its client sends
    # only once every client has connected.
    server = ThreadingServer(("127.0.0.1", 0), EchoLine)
    t = threading.Thread(target=server.serve_forever, name="accept", daemon=True)
    t.start()
    clients = []
    try:
        for _ in range(3 * ACCEPT_BURST):
            clients.append(socket.create_connection(server.server_address[:2], timeout=30))
        for i, c in enumerate(clients):
            c.sendall(b"%d\n" % i)
        for i, c in enumerate(clients):
            with c.makefile("rb") as f:
                assert f.readline() == b"%d\n" % i
    finally:
        for c in clients:
            c.close()
        server.shutdown()
        server.server_close()
        t.join(timeout=10)
