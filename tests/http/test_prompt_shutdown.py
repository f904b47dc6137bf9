"""PromptShutdownMixIn: a shutdown that comes before the accept thread has started its loop."""

import socketserver
import threading

from nsqd_threaded.server.listener import PromptShutdownMixIn


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
