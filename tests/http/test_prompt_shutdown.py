"""PromptShutdownMixIn: a shutdown that comes before the accept thread has started its loop."""

import socket
import socketserver
import threading

from nsqd_threaded.server.listener import PromptShutdownMixIn

from support.wire import wait_for


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

    t = threading.Thread(target=serve, name="late-accept")
    t.start()
    t.join(timeout=10)
    assert not t.is_alive()
    assert errors == []


def test_shutdown_waits_for_a_running_loop():
    server = Server(("127.0.0.1", 0), socketserver.BaseRequestHandler)
    t = threading.Thread(target=server.serve_forever, name="accept")
    t.start()
    server._serving.wait(timeout=10)
    server.shutdown()
    assert server._served.is_set()  # shutdown returned only once the loop had ended
    t.join(timeout=10)
    server.server_close()


def test_a_queued_burst_is_accepted_in_batches_as_blocking_sockets():
    # The listening socket is non-blocking (each wake-up accepts until the queue is empty):
    # every queued connection is served once, and each accepted socket still blocks.
    seen = []

    class Recorder(socketserver.BaseRequestHandler):
        def handle(self):
            seen.append((self.request.recv(16), self.request.getblocking(), self.request.gettimeout()))

    class Burst(Server):
        request_queue_size = 256

    server = Burst(("127.0.0.1", 0), Recorder)
    n = 150
    clients = [socket.create_connection(server.server_address) for _ in range(n)]
    for i, c in enumerate(clients):
        c.sendall(b"%d" % i)
    t = threading.Thread(target=server.serve_forever, name="accept")
    t.start()
    try:
        wait_for(lambda: len(seen) == n, timeout=30, what="every queued connection served")
        assert sorted(int(data) for data, _, _ in seen) == list(range(n))
        assert {(blocking, timeout) for _, blocking, timeout in seen} == {(True, None)}
    finally:
        server.shutdown()
        t.join(10)
        server.server_close()
        for c in clients:
            c.close()
