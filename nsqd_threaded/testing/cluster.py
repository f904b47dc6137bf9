"""Cluster: one lookupd and n brokers registered with it, for a test."""

import time

from .broker import Broker
from .lookupd import Lookupd
from .process import BrokerProcess
from .served import LOCALHOST

__all__ = ["Cluster"]


class Cluster:
    """One :class:`Lookupd` and ``n`` brokers registered with it, for a test.

    ``Cluster(n=3, *flags, processes=False, lookupd=None, tmp_dir=None, log_stream=None,
    start_timeout=10.0, **options)``: ``flags`` and ``options`` go to every broker (as for
    :class:`Broker`), which also gets ``--lookupd-tcp-address`` and the broadcast address
    ``127.0.0.1``; ``processes=True`` makes them :class:`BrokerProcess` (to ``kill()``);
    ``lookupd`` is a dict of :class:`Lookupd` keyword arguments.  :meth:`start` returns
    once the lookupd lists every broker in ``/nodes``; :meth:`stop` stops the brokers,
    then the lookupd.
    """

    def __init__(self, n=3, *flags, processes=False, lookupd=None, tmp_dir=None, log_stream=None,
                 start_timeout=10.0, **options):
        if n < 1:
            raise ValueError("a cluster needs at least one broker")
        self.n = n
        self.processes = processes
        self.start_timeout = start_timeout
        self.lookupd = Lookupd(log_stream=log_stream, **(lookupd or {}))
        self.brokers = []
        # What each broker is made with; start() adds the lookupd's address (known once it listens).
        self._broker_flags = flags
        self._broker_options = dict(options, tmp_dir=tmp_dir, log_stream=log_stream)

    def start(self):
        self.lookupd.start()
        try:
            options = dict(self._broker_options)
            options.setdefault("nsqlookupd_tcp_addresses", [self.lookupd.tcp_addr])
            options.setdefault("broadcast_address", LOCALHOST)
            kind = BrokerProcess if self.processes else Broker
            for _ in range(self.n):
                broker = kind(*self._broker_flags, **options)
                self.brokers.append(broker)
                broker.start()
            self.wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_registered(self, brokers=None, timeout=None):
        """Wait until the lookupd's ``/nodes`` lists ``brokers`` (default: every running one)."""
        brokers = [b for b in self.brokers if b.running] if brokers is None else brokers
        wanted = {b.tcp_addr for b in brokers}
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while not wanted <= set(self.lookupd.nodes()):
            if time.monotonic() > deadline:
                raise RuntimeError("brokers %s not registered with the lookupd within the timeout (it lists %s)"
                                   % (sorted(wanted), self.lookupd.nodes()))
            time.sleep(0.005)  # polling with a deadline: nothing to wait on across processes

    def advance(self, seconds=None):
        """Move every member's clock (the lookupd's and each running broker's) forward by
        ``seconds``; None: by the seconds to the earliest deadline of any member (0.0, and
        nothing moves, when none has one): a broker's timeouts and due times, the lookupd's
        tombstones (not its producers' inactivity: the brokers ping it).  Returns once each member's :meth:`Broker.advance`
        did and the lookupd lists every running broker again (a broker pings its lookupds after a
        skip, as it would have in the skipped time); returns the seconds skipped."""
        members = [self.lookupd] + [b for b in self.brokers if b.running]
        if seconds is None:
            seconds = self.next_deadline_in()
            if seconds is None:
                return 0.0
        for member in members:  # the lookupd first: each broker then pings it (see NSQD's advance)
            member.advance(seconds)
        self.wait_registered()  # the lookupd lists the brokers again (their pings after the skip)
        return seconds

    @property
    def clock(self):
        """The lookupd's clock, which every member follows when the cluster's time moves (:meth:`advance`)."""
        return self.lookupd.clock

    def next_deadline_in(self):
        """Seconds to the earliest deadline of any member (as :meth:`advance` with no argument skips);
        None when none has one."""
        dues = [self.lookupd.next_deadline_in(tombstones_only=True)]
        dues += [b.next_deadline_in() for b in self.brokers if b.running]
        pending = [s for s in dues if s is not None]
        return min(pending) if pending else None

    def stop(self):
        errors = []
        for broker in reversed(self.brokers):
            try:
                broker.stop()
            except Exception as e:  # stop the others anyway
                errors.append(e)
        self.lookupd.stop()
        if errors:
            raise errors[0]

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def __getitem__(self, i):
        return self.brokers[i]

    def __iter__(self):
        return iter(self.brokers)

    def __len__(self):
        return len(self.brokers)

    def __repr__(self):
        return "<Cluster lookupd=%s brokers=%s>" % (self.lookupd.http_addr, [b.tcp_addr for b in self.brokers])

    @property
    def tcp_addrs(self):
        """Every broker's ``"host:port"`` (TCP), as a Producer or pynsq's nsqd_tcp_addresses take them."""
        return [b.tcp_addr for b in self.brokers]

    @property
    def lookupd_http_addrs(self):
        """``["host:port"]`` of the lookupd's HTTP API, as a Consumer or pynsq's lookupd_http_addresses take it."""
        return [self.lookupd.http_addr]
