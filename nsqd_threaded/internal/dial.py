"""Dialing a stream peer by TCP address or unix socket path, for every client in the package."""

import socket

from .gocompat import is_socket_path, unix_sockaddr


def dial(address, timeout):
    """A connected stream socket to ``address``: ``(host, port)``, or a unix socket path (a str,
    see :func:`~nsqd_threaded.internal.gocompat.is_socket_path`).

    ``timeout`` (seconds, None for none) bounds the connect and stays set on
    the socket.  Raises OSError (``socket.timeout`` when it runs out).
    """
    if is_socket_path(address):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(unix_sockaddr(address))
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection(address, timeout)


def nodelay(sock):
    """Turn Nagle off on a TCP socket (a unix socket has none)."""
    if sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
