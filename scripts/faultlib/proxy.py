"""The fault proxy mode (``faults.py _proxy``): the package's ``nsqd_threaded.testing.FaultProxy`` run
in a host, driven by signals.

This kernel class has no ``sch_netem``, so delay, jitter, loss, bandwidth, stalls and resets are
made in a proxy that takes a broker's advertised address (the broker then listens on 127.0.0.1)."""

import signal
import sys

from .clients import _stop_event
from .history import History
from .topology import REPO


def client_proxy(args):
    """A TCP fault proxy: ``--listen`` to ``--target``, with the toxics of :class:`FaultProxy`.

    * latency: each chunk in each direction is held ``--delay-ms`` +- ``--jitter-ms`` (order kept),
      and with probability ``--loss`` a further ``--rto-ms`` (what a lost segment costs TCP).
    * bandwidth: ``--bandwidth-kbps`` (KiB/s, each direction of each connection): writes are paced.
    * stall: SIGUSR2 stops forwarding in both directions (connections stay open, bytes are read and
      held; new connections are accepted and held too); the next SIGUSR2 lets everything flow again.
    * reset: SIGUSR1 resets every proxied connection, both sides (an RST to the client and to the
      broker), as a middlebox dropping its state does; new connections are still accepted.

    With ``--history``, each accepted connection, stall, flow and reset is written there.  Once it
    listens, the proxy prints ``listening HOST:PORT`` on stdout, so ``--listen 127.0.0.1:0`` takes
    an ephemeral port and the caller reads which."""
    sys.path.insert(0, REPO)
    from nsqd_threaded.testing.faults import FaultProxy

    stop = _stop_event()
    history = History(args.history) if args.history else None
    toggles = []  # SIGUSR1/SIGUSR2 seen by the handler, acted on by the main loop
    signal.signal(signal.SIGUSR1, lambda *_: toggles.append("reset"))
    signal.signal(signal.SIGUSR2, lambda *_: toggles.append("stall"))

    def record(ev, **fields):
        if history is not None and ev in ("accept", "stall", "flow", "reset"):
            history.write(ev, **fields)

    proxy = FaultProxy(args.target, listen=args.listen, delay=args.delay_ms / 1000.0,
                       jitter=args.jitter_ms / 1000.0, loss=args.loss, rto=args.rto_ms / 1000.0,
                       bandwidth=args.bandwidth_kbps * 1024.0 or None, seed=args.seed, on_event=record)
    stalled = False
    with proxy:
        print("listening %s:%d" % proxy.address, flush=True)
        while not stop.is_set():
            while toggles:
                if toggles.pop(0) == "reset":
                    proxy.reset()
                elif stalled:
                    proxy.flow()
                    stalled = False
                else:
                    proxy.stall()
                    stalled = True
            stop.wait(0.1)
    if history is not None:
        history.close()
