"""Dialing a stream peer by TCP address or unix socket path, for every client in the package."""

import socket
import struct

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


def timeval(seconds):
    """A struct timeval for SO_RCVTIMEO/SO_SNDTIMEO (None: no timeout)."""
    if seconds is None:
        return struct.pack("@ll", 0, 0)
    sec, usec = divmod(max(1, int(seconds * 1e6)), 1000000)
    return struct.pack("@ll", sec, usec)


def kernel_timeouts(sock, seconds):
    """Make ``sock`` blocking, each recv and send bounded by ``seconds`` (None or 0: unbounded) in the kernel.

    A Python socket timeout polls before every recv and send: two system calls,
    and two hand-overs of the GIL, per read or write.  SO_RCVTIMEO/SO_SNDTIMEO
    bound them with none; a recv or send that runs out raises BlockingIOError
    (a send may have sent part of its bytes).
    """
    sock.settimeout(None)
    tv = timeval(seconds or None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
