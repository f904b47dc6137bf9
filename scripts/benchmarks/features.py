"""Consume throughput with snappy, deflate and TLS, each as a ratio to the plain run.

One broker (``python -m nsqd_threaded``, TLS configured with certificates
made here by the openssl command) serves every run.  Each round preloads a
fresh topic with ``--messages`` bodies of ``--size`` bytes, then one consumer
process (IDENTIFY with the feature, SUB, RDY 2500, FIN every message, FINs
batched per recv) drains it; the time from RDY to the last message gives
msg/s.  ``--snappy-backend python`` makes the broker use its pure-Python
snappy codec even when cramjam is installed (``--client-snappy-backend`` does
the same for the consumer).  Modes are alternated within each round, so that a noisy machine
weighs on all of them alike; the medians over ``--rounds`` are compared.

    scripts/bench features --rounds 5 --messages 50000 --size 200
"""

import argparse
import json
import multiprocessing
import os
import re
import shutil
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib

from . import ROOT as REPO

MODES = ("plain", "snappy", "deflate", "tls", "tls+snappy")


def make_certs(root):
    def run(*args):
        subprocess.run(("openssl",) + args, cwd=root, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=bench-ca")
    with open(os.path.join(root, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj",
        "/CN=127.0.0.1")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "server.pem", "-days", "1", "-extfile", "san.ext")
    return os.path.join(root, "ca.pem"), os.path.join(root, "server.pem"), os.path.join(root, "server.key")


def start_broker(data_path, cert, key, snappy_backend, python=None):
    env = dict(os.environ, NSQD_SNAPPY_BACKEND=snappy_backend)
    return subprocess.Popen(
        [python or sys.executable, "-m", "nsqd_threaded", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
         "--https-address=", "--data-path=" + data_path, "--tls-cert=" + cert, "--tls-key=" + key,
         "--mem-queue-size=10000000", "--log-level=warn"],
        cwd=REPO, stderr=subprocess.DEVNULL, env=env,
    )


def _listening_ports(pid, deadline):
    """The TCP ports ``pid`` listens on (Linux /proc), once there are two."""
    while time.monotonic() < deadline:
        inodes = set()
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                try:
                    target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                except OSError:
                    continue
                m = re.match(r"socket:\[(\d+)\]", target)
                if m:
                    inodes.add(m.group(1))
        except OSError:
            pass
        ports = []
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:
                    ports.append(int(parts[1].split(":")[1], 16))
        if len(ports) >= 2:
            return sorted(ports)
        time.sleep(0.05)
    raise RuntimeError("the broker did not start listening")


def _which_is_http(ports):
    for port in ports:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/ping" % port, timeout=2) as r:
                if r.read() == b"OK":
                    return port
        except Exception:  # the TCP port answers E_BAD_PROTOCOL
            continue
    raise RuntimeError("no HTTP port among %r" % ports)


def preload(http_port, topic, n, size):
    body = b"x" * (size // 2) + os.urandom(size - size // 2)  # half compressible
    batch = 1000
    for start in range(0, n, batch):
        count = min(batch, n - start)
        data = b"".join(struct.pack(">I", size) + body for _ in range(count))
        req = urllib.request.Request("http://127.0.0.1:%d/mpub?topic=%s&binary=true" % (http_port, topic),
                                     data=struct.pack(">I", count) + data)
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()


class _Stream:
    """The consumer's side of the negotiated layers (over an ssl socket for TLS)."""

    def __init__(self, sock):
        self.sock = sock
        self.compress = self.decompress = None

    def recv(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            return None  # EOF (b"" is a partial compressed chunk or TLS record)
        if self.decompress is not None:
            chunk = self.decompress(chunk)
        return chunk

    def send(self, data):
        if self.compress is not None:
            data = self.compress(data)
        self.sock.sendall(data)


def _read_frame(stream, buf):
    while True:
        if len(buf) >= 4:
            size = struct.unpack_from(">i", buf, 0)[0]
            if len(buf) >= 4 + size:
                data = bytes(buf[8 : 4 + size])
                del buf[: 4 + size]
                return data
        chunk = stream.recv()
        if chunk is None:
            raise EOFError
        buf += chunk


def consume(tcp_port, topic, n, mode, ca, result):
    from nsqd_threaded.wire.codec.snappy import FrameDecoder, FrameEncoder

    sock = socket.create_connection(("127.0.0.1", tcp_port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fields = {"feature_negotiation": True, "tls_v1": "tls" in mode, "snappy": "snappy" in mode,
              "deflate": mode == "deflate", "deflate_level": 1}
    body = json.dumps(fields).encode()
    sock.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    stream = _Stream(sock)
    buf = bytearray()
    _read_frame(stream, buf)  # the JSON answer, in the clear
    if "tls" in mode:
        context = ssl.create_default_context(cafile=ca)
        stream.sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
        assert _read_frame(stream, buf) == b"OK"
    if "snappy" in mode:
        enc, dec = FrameEncoder(), FrameDecoder()
        stream.compress, stream.decompress = enc.encode, dec.decode
    elif mode == "deflate":
        c, d = zlib.compressobj(1, zlib.DEFLATED, -15), zlib.decompressobj(-15)
        stream.compress = lambda data: c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
        stream.decompress = d.decompress
    if stream.compress is not None:
        rest = bytes(buf)  # what came with the previous answer is already compressed
        del buf[:]
        buf += stream.decompress(rest)
        assert _read_frame(stream, buf) == b"OK"
    stream.send(b"SUB %s c\n" % topic.encode())
    assert _read_frame(stream, buf) == b"OK"
    started = time.perf_counter()
    stream.send(b"RDY 2500\n")
    count = 0
    unpack = struct.unpack_from
    while count < n:
        chunk = stream.recv()
        if chunk is None:
            break
        buf += chunk
        pos = 0
        end_all = len(buf)
        fins = []
        while end_all - pos >= 8:
            size, ftype = unpack(">ii", buf, pos)
            end = pos + 4 + size
            if end > end_all:
                break
            if ftype == 2:
                fins.append(b"FIN " + bytes(buf[pos + 18 : pos + 34]) + b"\n")
            elif ftype == 0:
                fins.append(b"NOP\n")
            pos = end
        del buf[:pos]
        if fins:
            count += sum(1 for f in fins if f[:1] == b"F")
            stream.send(b"".join(fins))
    elapsed = time.perf_counter() - started
    sock.close()
    result.put(count / elapsed)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--snappy-backend", default="auto", choices=("auto", "python", "cramjam"),
                        help="the broker's snappy codec (NSQD_SNAPPY_BACKEND)")
    parser.add_argument("--client-snappy-backend", default="auto", choices=("auto", "python", "cramjam"),
                        help="the consumer's snappy codec")
    args = parser.parse_args()
    medians = run(args.rounds, args.messages, args.size, args.modes.split(","), args.snappy_backend,
                  args.client_snappy_backend, verbose=True)
    base = medians.get("plain")
    print("\nmode        median msg/s   ratio to plain   (%d rounds, %d x %d B)" % (
        args.rounds, args.messages, args.size))
    for mode, med in medians.items():
        print("%-10s %12.0f   %14s" % (mode, med, "%.2f" % (med / base) if base else "-"))


def run(rounds=3, messages=50000, size=200, modes=MODES, snappy_backend="auto", client_snappy_backend="auto",
        verbose=False, python=None):
    """Median consume rate (msg/s) per mode, the modes alternated within each round.

    ``python`` runs the broker (default: this interpreter); the consumers run under this one.
    """
    tmp = tempfile.mkdtemp(prefix="bench-features-")
    proc = None
    saved = os.environ.get("NSQD_SNAPPY_BACKEND")
    try:
        ca, cert, key = make_certs(tmp)
        data = os.path.join(tmp, "data")
        os.mkdir(data)
        proc = start_broker(data, cert, key, snappy_backend, python)
        os.environ["NSQD_SNAPPY_BACKEND"] = client_snappy_backend  # the consumers inherit it
        ports = _listening_ports(proc.pid, time.monotonic() + 20)
        http_port = _which_is_http(ports)
        tcp_port = [p for p in ports if p != http_port][0]
        rates = {m: [] for m in modes}
        for r in range(rounds):
            for mode in modes:
                topic = "bench_%s_%d" % (mode.replace("+", "_"), r)
                preload(http_port, topic, messages, size)
                result = multiprocessing.Queue()
                worker = multiprocessing.Process(target=consume,
                                                 args=(tcp_port, topic, messages, mode, ca, result))
                worker.start()
                rate = result.get(timeout=600)
                worker.join()
                rates[mode].append(rate)
                if verbose:
                    print("round %d %-10s %9.0f msg/s" % (r + 1, mode, rate), flush=True)
                req = urllib.request.Request("http://127.0.0.1:%d/topic/delete?topic=%s" % (http_port, topic),
                                             data=b"")
                urllib.request.urlopen(req, timeout=30).read()
        return {mode: statistics.median(rates[mode]) for mode in modes}
    finally:
        if saved is None:
            os.environ.pop("NSQD_SNAPPY_BACKEND", None)
        else:
            os.environ["NSQD_SNAPPY_BACKEND"] = saved
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    main()
