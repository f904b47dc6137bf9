"""The TCP listener for nsqd peers: one thread per peer connection, in the socketserver style.

Each connection thread runs :func:`serve_peer`: magic, then one command at a
time (parsing and encoding live in :mod:`.wire`).  When the connection ends,
for whatever reason, the peer is removed as producer from every registration.
"""

import socket
import socketserver

from ..internal.gocompat import join_host_port
from ..wire.protocol_v2 import decode_size
from ..server.listener import Listener
from ..wire import protocol_v1
from .registration_db import CLIENT, PeerInfo, Registration
from ..wire.protocol_v1 import V1Error


class PeerConnection:
    """The state of one V1 connection (owned by its connection thread)."""

    def __init__(self, lookupd, sock, address):
        self.lookupd = lookupd
        self.db = lookupd.db
        self.log = lookupd.log
        self.sock = sock
        self.id = join_host_port(*address[:2])
        self.rfile = sock.makefile("rb")
        self.peer = None  # PeerInfo once identified

    def __str__(self):
        return self.id

    def serve(self):
        try:
            self._serve()
        finally:
            # Closed here, not left to the GC: the socket only really closes
            # (and the peer sees EOF) once its file object is closed too.
            self.rfile.close()

    def _serve(self):
        log = self.log
        log.info("TCP: new client(%s)", self.id)
        magic = self.rfile.read(4)
        if len(magic) < 4:
            log.error("failed to read protocol version - EOF")
            return
        log.info("CLIENT(%s): desired protocol magic '%s'", self.id, magic.decode("utf-8", "replace"))
        if magic != protocol_v1.MAGIC_V1:
            self.sock.sendall(protocol_v1.BAD_PROTOCOL)
            log.error("client(%s) bad protocol magic '%s'", self.id, magic.decode("utf-8", "replace"))
            return
        try:
            self._loop()
        finally:
            log.info("PROTOCOL(V1): [%s] exiting ioloop", self.id)
            self._unregister_all()

    def _loop(self):
        while True:
            line = self.rfile.readline(protocol_v1.MAX_LINE + 1)
            if not line.endswith(b"\n"):
                if len(line) > protocol_v1.MAX_LINE:
                    self.log.error("[%s] - command line longer than %d bytes", self.id, protocol_v1.MAX_LINE)
                return  # EOF (a partial last line is dropped, as nsqlookupd does)
            params = protocol_v1.parse_line(line)
            try:
                response = self._exec(params)
            except V1Error as e:
                self.log.error("[%s] - %s", self.id, e)
                self.sock.sendall(e.response())
                return  # every V1 error is fatal
            self.sock.sendall(response)

    def _exec(self, params):
        command = params[0]
        if command == "PING":
            return self.ping()
        if command == "IDENTIFY":
            return self.identify()
        if command == "REGISTER":
            return self.register(params[1:])
        if command == "UNREGISTER":
            return self.unregister(params[1:])
        raise V1Error("E_INVALID", "invalid command %s" % command)

    def ping(self):
        if self.peer is not None:  # a PING may come before IDENTIFY
            self.peer.touch()
        return protocol_v1.OK

    def identify(self):
        if self.peer is not None:
            raise V1Error("E_INVALID", "cannot IDENTIFY again")
        raw = self.rfile.read(4)
        if len(raw) < 4:
            raise V1Error("E_BAD_BODY", "IDENTIFY failed to read body size")
        size = decode_size(raw)
        protocol_v1.check_identify_size(size)
        body = self.rfile.read(size)
        if len(body) < size:
            raise V1Error("E_BAD_BODY", "IDENTIFY failed to read body")
        peer = PeerInfo(self.id, protocol_v1.decode_peer_info(body), self.db.clock)
        self.log.info(
            "CLIENT(%s): IDENTIFY Address:%s TCP:%d HTTP:%d Version:%s",
            self.id,
            peer.broadcast_address,
            peer.tcp_port,
            peer.http_port,
            peer.version,
        )
        self.peer = peer
        if self.db.add_producer(CLIENT, peer):
            self.log.info("DB: client(%s) REGISTER category:client key: subkey:", self.id)
        lookupd = self.lookupd
        return protocol_v1.identify_response(
            lookupd.options.broadcast_address, lookupd.hostname, lookupd.tcp_port, lookupd.http_port, lookupd.version,
            # only to a peer on our unix socket: it is on this host, where the path means the same
            http_socket=lookupd.http_socket if self.sock.family == socket.AF_UNIX else None,
        )

    def register(self, params):
        if self.peer is None:
            raise V1Error("E_INVALID", "client must IDENTIFY")
        topic, channel = protocol_v1.topic_channel("REGISTER", params)
        if channel:
            self._add(Registration("channel", topic, channel))
        self._add(Registration("topic", topic, ""))
        return protocol_v1.OK

    def _add(self, reg):
        if self.db.add_producer(reg, self.peer):
            self.log.info("DB: client(%s) REGISTER category:%s key:%s subkey:%s", self.id, *reg)

    def unregister(self, params):
        if self.peer is None:
            raise V1Error("E_INVALID", "client must IDENTIFY")
        topic, channel = protocol_v1.topic_channel("UNREGISTER", params)
        db = self.db
        if channel:
            self._remove(Registration("channel", topic, channel))
            return protocol_v1.OK
        # A topic unregistration: nsqd unregisters the channels first, so any
        # channel still holding this peer is unexpected.
        for reg in db.find_registrations("channel", topic, "*"):
            if db.remove_producer(reg, self.id)[0]:
                self.log.warn("client(%s) unexpected UNREGISTER category:%s key:%s subkey:%s", self.id, *reg)
        self._remove(Registration("topic", topic, ""))
        return protocol_v1.OK

    def _remove(self, reg):
        """Remove this peer from ``reg``; an ephemeral registration left without producers goes too."""
        removed, left = self.db.remove_producer(reg, self.id)
        if removed:
            self.log.info("DB: client(%s) UNREGISTER category:%s key:%s subkey:%s", self.id, *reg)
        if left == 0 and (reg.subkey or reg.key).endswith("#ephemeral"):
            self.db.remove_registration(reg)

    def _unregister_all(self):
        if self.peer is None:
            return
        for reg in self.db.lookup_registrations(self.id):
            if self.db.remove_producer(reg, self.id)[0]:
                self.log.info("DB: client(%s) UNREGISTER category:%s key:%s subkey:%s", self.id, *reg)


class _PeerHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        if sock.family != socket.AF_UNIX:  # (a unix socket has no Nagle to turn off)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        PeerConnection(self.server.lookupd, sock, self.client_address).serve()


class LookupdTCPServer(Listener):
    """Accepts nsqd peers for one NSQLookupd, each in a thread ``nsqlookupd-peer[ip:port]``.

    A peer that resets or is shut down by stop() is logged at debug.
    """

    log_name = "TCP"
    thread_name = "nsqlookupd-peer"

    def __init__(self, address, lookupd):
        self.lookupd = lookupd
        super().__init__(address, _PeerHandler, lookupd.log)
