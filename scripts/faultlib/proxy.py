"""The userspace TCP fault proxy (``faults.py _proxy``) and its toxics.

This kernel class has no ``sch_netem``, so delay, jitter, loss, bandwidth, stalls and resets are
made in a proxy that takes a broker's advertised address (the broker then listens on 127.0.0.1)."""

import random
import signal
import socket
import struct
import threading
import time

from .clients import _stop_event
from .history import History


def client_proxy(args):
    """A TCP fault proxy: ``--listen`` to ``--target``, with toxics in the spirit of toxiproxy's.

    * latency: each chunk in each direction is held ``--delay-ms`` +- ``--jitter-ms`` (order kept),
      and with probability ``--loss`` a further ``--rto-ms`` (what a lost segment costs TCP: it is
      sent again after a retransmission timeout). A byte stream cannot lose bytes without breaking
      the protocol, so loss is modelled by its effect on a TCP flow; with netem, real loss is better.
    * bandwidth: ``--bandwidth-kbps`` (KiB/s, each direction of each connection): writes are paced.
    * stall: SIGUSR2 stops forwarding in both directions (connections stay open, bytes are read and
      held; new connections are accepted and held too); the next SIGUSR2 lets everything flow again.
    * reset: SIGUSR1 resets every proxied connection, both sides (SO_LINGER 0, then close: an RST
      to the client and to the broker), as a middlebox dropping its state does.

    With ``--history``, each accepted connection, stall, flow and reset is written there."""
    host, port = args.listen.rsplit(":", 1)
    thost, tport = args.target.rsplit(":", 1)
    stop = _stop_event()
    history = History(args.history) if args.history else None
    flowing = threading.Event()  # cleared while stalled
    flowing.set()
    toggles = []  # SIGUSR1/SIGUSR2 seen by the handler, acted on by the accept loop
    signal.signal(signal.SIGUSR1, lambda *_: toggles.append("reset"))
    signal.signal(signal.SIGUSR2, lambda *_: toggles.append("stall"))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(512)
    listener.settimeout(0.1)
    rng = random.Random(args.seed)
    rng_lock = threading.Lock()  # guards rng (one per proxy, used by every pump)
    conns_lock = threading.Lock()  # guards conns
    conns = []  # [client, upstream] of each live proxied connection
    rate = args.bandwidth_kbps * 1024.0 if args.bandwidth_kbps else None

    def record(ev, **fields):
        if history is not None:
            history.write(ev, **fields)

    def hold():
        with rng_lock:
            delay = args.delay_ms + rng.uniform(-args.jitter_ms, args.jitter_ms)
            if rng.random() < args.loss:
                delay += args.rto_ms
        return max(0.0, delay) / 1000.0

    def pump(src, dst, pair):
        # Reader: stamp each chunk with its release time; the writer releases in order.
        chunks = []
        cond = threading.Condition()  # guards chunks

        def writer():
            free_at = time.monotonic()  # the bandwidth limit: when the next byte may go
            while True:
                with cond:
                    while not chunks:
                        cond.wait()
                    at, data = chunks.pop(0)
                wait = at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if data is None:
                    break
                while not flowing.is_set() and not stop.is_set():
                    flowing.wait(0.5)  # stalled: hold the bytes, keep the connection
                try:
                    if rate is None:
                        dst.sendall(data)
                    else:
                        for i in range(0, len(data), 4096):
                            piece = data[i : i + 4096]
                            wait = free_at - time.monotonic()
                            if wait > 0:
                                time.sleep(wait)
                            dst.sendall(piece)
                            free_at = max(free_at, time.monotonic()) + len(piece) / rate
                except OSError:
                    break
            if not pair.get("reset"):
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        w = threading.Thread(target=writer, name="proxy-writer", daemon=True)
        w.start()
        last = 0.0
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if pair.get("reset"):
                data = b""
            last = max(last, time.monotonic() + hold())
            with cond:
                chunks.append((last, data or None))
                cond.notify()
            if not data:
                break
        w.join()

    def reset_all():
        with conns_lock:
            live = list(conns)
            conns.clear()
        for pair in live:
            pair["reset"] = True
            for sock in pair["socks"]:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.shutdown(socket.SHUT_RD)  # wakes its reader; the close below sends the RST
                except OSError:
                    pass
        for pair in live:
            for sock in pair["socks"]:
                sock.close()
        record("reset", conns=len(live))

    def serve(client, upstream):
        pair = {"socks": (client, upstream)}
        with conns_lock:
            conns.append(pair)
        threads = [threading.Thread(target=pump, args=(a, b, pair), name="proxy-pump", daemon=True)
                   for a, b in ((client, upstream), (upstream, client))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with conns_lock:
            if pair in conns:
                conns.remove(pair)
        for sock in pair["socks"]:
            sock.close()

    while not stop.is_set():
        while toggles:
            what = toggles.pop(0)
            if what == "reset":
                reset_all()
            elif flowing.is_set():
                flowing.clear()
                record("stall")
            else:
                flowing.set()
                record("flow")
        try:
            client, peer = listener.accept()
        except (socket.timeout, BlockingIOError):
            # (PyPy 3.9: a signal during a timed accept raises EAGAIN, not a timeout)
            continue
        try:
            upstream = socket.create_connection((thost, int(tport)), timeout=2.0)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        client.settimeout(None)
        record("accept", peer="%s:%d" % peer[:2])
        threading.Thread(target=serve, args=(client, upstream), name="proxy-conn", daemon=True).start()
    listener.close()
    if history is not None:
        history.close()
