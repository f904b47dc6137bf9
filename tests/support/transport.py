"""Certificates made at test time (openssl CLI) and raw-socket helpers for the TLS/compression tests."""

import json
import os
import shutil
import ssl
import struct
import subprocess
import zlib

import pytest

from nsqd_threaded.wire import protocol_v2
from nsqd_threaded.wire.codec.snappy import FrameDecoder, FrameEncoder

from support.wire import Conn


class Certs:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (paths), and another CA."""

    def __init__(self, root):
        self.root = root
        self.ca = os.path.join(root, "ca.pem")
        self.server_cert = os.path.join(root, "server.pem")
        self.server_key = os.path.join(root, "server.key")
        self.client_cert = os.path.join(root, "client.pem")
        self.client_key = os.path.join(root, "client.key")
        self.other_ca = os.path.join(root, "other-ca.pem")

    def client_context(self, ca=None, client_cert=False, maximum_version=None):
        context = ssl.create_default_context(cafile=ca or self.ca)
        if client_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        if maximum_version is not None:
            context.maximum_version = maximum_version
        return context


def _openssl(root, *args):
    subprocess.run(("openssl",) + args, cwd=root, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=60)


def make_certs(root):
    """A CA, a server certificate for 127.0.0.1, a client certificate and another CA.

    With the extensions a strict verifier wants (Python 3.13's default
    contexts set VERIFY_X509_STRICT): key usage on the CAs, key identifiers
    and extended key usage on the leaves.
    """
    for name, cn in (("ca", "nsqd-test-ca"), ("other-ca", "another-ca")):
        _openssl(root, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                 name + ".pem", "-days", "2", "-subj", "/CN=" + cn,
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    leaf = ("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "authorityKeyIdentifier=keyid,issuer\nsubjectKeyIdentifier=hash\n")
    for name, cn, ext in (("server", "127.0.0.1", "extendedKeyUsage=serverAuth\n"
                           "subjectAltName=IP:127.0.0.1,DNS:localhost\n"),
                          ("client", "nsqd-test-client", "extendedKeyUsage=clientAuth\n")):
        with open(os.path.join(root, name + ".ext"), "w") as f:
            f.write(leaf + ext)
        _openssl(root, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out", name + ".csr",
                 "-subj", "/CN=" + cn)
        _openssl(root, "x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext")
    return Certs(root)


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificates")
    return make_certs(str(tmp_path_factory.mktemp("certs")))


def tls_options(certs, **kwargs):
    kwargs.setdefault("https_address", "127.0.0.1:0")
    return dict(tls_cert=certs.server_cert, tls_key=certs.server_key, **kwargs)


def identify(conn, **fields):
    """IDENTIFY with feature_negotiation; returns the JSON answer."""
    fields.setdefault("feature_negotiation", True)
    conn.cmd(b"IDENTIFY", json.dumps(fields).encode())
    frame_type, data = conn.read_frame()
    assert frame_type == protocol_v2.FRAME_TYPE_RESPONSE, data
    return json.loads(data)


def start_tls(conn, context):
    """The client side of the upgrade: handshake on the raw socket; then reads and writes go through TLS."""
    assert conn.buf == b""
    conn.sock = context.wrap_socket(conn.sock, server_hostname="127.0.0.1")
    return conn


class CompressedConn:
    """A Conn whose bytes go through deflate or snappy (over TLS if the Conn has it)."""

    def __init__(self, conn, kind, level=6):
        self.conn = conn
        self.kind = kind
        if kind == "deflate":
            self._c = zlib.compressobj(level, zlib.DEFLATED, -15)
            self._d = zlib.decompressobj(-15)
            self.compress = lambda data: self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)
            self.decompress = self._d.decompress
        else:
            enc, dec = FrameEncoder(), FrameDecoder()
            self.compress = enc.encode
            self.decompress = dec.decode
        self.raw = conn.buf  # everything received, compressed (for byte checks)
        self.buf = bytes(conn.buf and self.decompress(conn.buf))
        conn.buf = b""

    def send(self, data):
        self.conn.sock.sendall(self.compress(data))

    def cmd(self, line, body=None):
        data = line + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.send(data)

    def _fill(self):
        chunk = self.conn.sock.recv(65536)
        if not chunk:
            raise EOFError("connection closed")
        self.raw += chunk
        self.buf += self.decompress(chunk)

    def read_frame(self, skip_heartbeats=True):
        while True:
            while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack(">i", self.buf[:4])[0]:
                self._fill()
            size = struct.unpack(">i", self.buf[:4])[0]
            raw, self.buf = self.buf[: 4 + size], self.buf[4 + size :]
            ft, data = protocol_v2.decode_frame(raw)
            if skip_heartbeats and ft == 0 and data == b"_heartbeat_":
                continue
            return ft, data

    def read_until_closed(self):
        """Frames until the server closes; a bounded wait (the socket's timeout)."""
        frames = []
        try:
            while True:
                frames.append(self.read_frame())
        except (EOFError, ConnectionError):
            return frames


def connect(nsqd, timeout=10.0):
    return Conn(nsqd.tcp_address, timeout=timeout)
