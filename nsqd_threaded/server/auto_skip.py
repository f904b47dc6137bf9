"""``--time-skipping=auto`` (not in Go nsqd): the broker skips its own clock while nothing happens.

A test suite in any language, or a threaded client, gets what a loop of ours gives a pynsq or asyncio
application (docs/testing.md): when no connection has moved for ``--time-skipping-grace`` and the
broker's next deadline (an in-flight timeout, a REQ or DPUB coming due) is ahead, the clock jumps to
it, as ``POST /debug/time/skip`` would.  A client of this package given ``clock=`` the broker holds
its reconnect and backoff deadlines on that clock (``Clock.hold_deadline``): they count among the
broker's deadlines, so the clock jumps to them too.

"Moved" is judged from outside the message path, which pays nothing for it: a connection sent or
received data within the grace (the kernel's ``TCP_INFO``), has bytes the broker has not read yet
(``FIONREAD``), a channel owes a subscribed consumer a delivery, or the broker's figures changed since
the last look (what /stats counts per topic, channel
and client: messages put, FINed, REQueued, timed out, each client's RDY and in-flight count, the
clients connected).  A figure moves with every command a client sends, and every publish; so the
clock never jumps while a client talks to the broker, only once everything has been quiet for the
grace.  The grace is the rule for what the broker cannot see: a consumer busy with a message it has
not answered yet holds no byte in flight; give a larger grace when handlers take longer.
"""

import fcntl
import os
import select
import socket
import struct
import termios
import threading
import time

from ..broker import stats

# /stats fields that change with time rather than with what clients do
_TIMELY = frozenset(("e2e_processing_latency", "start_time", "connect_ts"))


_TCP_INFO_SIZE = 104  # through tcpi_total_retrans: every Linux kernel fills at least this much
_LAST_DATA = struct.Struct("=II")  # tcpi_last_data_sent, then (after last_ack_sent) tcpi_last_data_recv


def _quiet_ms(sock):
    """Milliseconds since ``sock`` last sent or received data (TCP_INFO); None when it cannot tell
    (a unix socket, another platform)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except (OSError, AttributeError, ValueError):
        return None
    if len(info) < 56:
        return None
    sent, = struct.unpack_from("=I", info, 44)
    received, = struct.unpack_from("=I", info, 52)
    return min(sent, received)


def _unread(sock):
    """Bytes received on ``sock`` that the broker has not read yet (0 when it cannot tell)."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0


_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)


def _any_readable(socks):
    """Whether one of ``socks`` has something the broker has not read: bytes, or an end (a closed
    connection has no bytes for ``FIONREAD`` to count, yet its poller has the close to handle)."""
    if not socks:
        return False
    poll = select.poll()
    for sock in socks:
        try:
            poll.register(sock, _READABLE)
        except (OSError, ValueError):
            continue  # (closed meanwhile: its poller has dropped it)
    return bool(poll.poll(0))


def listen_backlog(sock):
    """Connections waiting in ``sock``'s accept queue (a listening TCP socket's TCP_INFO); 0 if unknown."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except (OSError, AttributeError, ValueError):
        return 0
    return struct.unpack_from("=I", info, 24)[0] if len(info) >= 28 else 0  # tcpi_unacked: the backlog


def runnable(task_dir, native_ids=None):
    """True while a thread of the process whose ``/proc/.../task`` directory is ``task_dir`` is running
    or waiting for a CPU (state R): work under way that no socket shows yet, such as a command read
    and not yet handled on a loaded machine.  ``native_ids``: only those threads (None: every one)."""
    try:
        ids = native_ids if native_ids is not None else [int(t) for t in os.listdir(task_dir)]
    except OSError:
        return False  # (no /proc: this look is left out)
    for tid in ids:
        try:
            with open("%s/%d/stat" % (task_dir, tid), "rb") as f:
                stat = f.read()
        except OSError:
            continue  # (ended meanwhile)
        end = stat.rfind(b")")  # the state follows the command name, which may hold anything
        if stat[end + 2:end + 3] == b"R":
            return True
    return False


def daemon_threads_runnable(prefixes):
    """:func:`runnable` over this process's threads whose names start with one of ``prefixes`` (a
    daemon's own: ``nsqd-``, ``nsqlookupd-``), the calling thread left out."""
    me = threading.current_thread()
    ids = [t.native_id for t in threading.enumerate()
           if t is not me and t.name.startswith(prefixes) and getattr(t, "native_id", None)]
    return runnable("/proc/self/task", ids)


def listeners_busy(listeners, grace):
    """True while a connection waits in a listener's accept queue, or one open on it (handled yet or
    not) moved a byte within ``grace`` seconds (TCP_INFO) or has bytes not read yet."""
    grace_ms = grace * 1000
    for listener in listeners:
        if listen_backlog(listener.socket):
            return True
        for sock in listener.open_connections():
            quiet = _quiet_ms(sock)
            if (quiet is not None and quiet < grace_ms) or _unread(sock):
                return True
    return False


def connections_busy(nsqd, grace):
    """True while the broker is at work without time passing: its listeners are busy
    (:func:`listeners_busy`), a topic has messages its pump will copy to channels, or a channel owes
    a consumer a delivery."""
    if listeners_busy(nsqd.listeners(), grace) or daemon_threads_runnable(("nsqd-",)):
        return True
    poller = nsqd.net_poller()
    if poller is not None and poller.busy():
        return True
    topics = nsqd.topics()
    return any(t.owes_fan_out() for t in topics) or any(c.owes_delivery() for t in topics for c in t.channels())


def settled(nsqd, asker=None):
    """The precise look, where the broker can vouch for it: True when no command, delivery or timer
    is under way and no message is with a client (none in flight: no consumer's handler can be at
    work on one), so nothing can happen here until time passes or a client sends something; False
    when something is under way; None when it cannot tell without waiting a grace (a message in
    flight: its handler may be waiting on something real; a thread per connection: a thread that
    read a command shows nothing while it waits for the interpreter lock; lookupd peers).

    Why each look is enough with the poller (see :meth:`NetPoller.settled`): a command's bytes (or
    a connection's end) are readable until a poller reads them, and it reads them while ``serving``; what a
    command sets off is a worker's task, a topic's fan-out or a channel's delivery, each visible here
    until done; an HTTP request holds its connection open while it is handled.  ``asker``: the peer
    address of the HTTP connection asking (``GET /debug/time``), left out of that look."""
    poller = nsqd.net_poller()
    if poller is None or nsqd.options.nsqlookupd_tcp_addresses:
        return None
    tcp = nsqd.tcp_listener()
    for listener in nsqd.listeners():
        if listener.accepting or listen_backlog(listener.socket):
            return False
        connections = listener.open_connections()
        if listener is not tcp:
            for sock in connections:  # an HTTP request being handled (or a keep-alive connection)
                try:
                    if asker is None or sock.getpeername() != asker:
                        return False
                except OSError:
                    return False
            continue
        if _any_readable(connections):
            return False
    if not poller.settled():
        return False
    due = nsqd.next_deadline_in()
    if due is not None and due <= 0:  # due and not yet taken by the queue scanner
        return False
    in_flight = False
    for topic in nsqd.topics():
        if topic.owes_fan_out():
            return False
        for channel in topic.channels():
            if channel.owes_delivery():
                return False
            in_flight = in_flight or channel.in_flight_count() > 0
    return None if in_flight else True  # (a handler may be at work on something real: the grace decides)


def broker_figures(nsqd):
    """What /stats counts of the broker now, less what changes by itself: equal twice, nothing moved."""
    return len(nsqd.clients()), _figures(stats.collect(nsqd, include_mem=False))


def _figures(doc):
    """``doc`` (a /stats document) without the fields that change by themselves, as a comparable value."""
    if isinstance(doc, dict):
        return tuple((k, _figures(v)) for k, v in doc.items() if k not in _TIMELY)
    if isinstance(doc, list):
        return tuple(_figures(v) for v in doc)
    return doc


class AutoSkipper:
    """The thread ``nsqd-time-auto-skip`` of one broker: started by :meth:`start`, ended and joined by
    :meth:`stop` (its owner, the NSQD).  ``_stop`` is the only state shared with other threads."""

    def __init__(self, nsqd, grace):
        self.nsqd = nsqd
        self.grace = grace
        self.skips = 0  # jumps made (read by tests)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nsqd-time-auto-skip", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    def _look(self):
        """What the broker is doing now: None when busy, else its figures."""
        if connections_busy(self.nsqd, self.grace):
            return None
        return broker_figures(self.nsqd)

    def _run(self):
        last = None
        quiet_since = time.monotonic()  # real time: the grace is how long the connections were quiet
        while not self._stop.wait(self.grace / 4):
            seen = self._look()
            now = time.monotonic()
            if seen is None or seen != last:
                last, quiet_since = seen, now
                continue
            if now - quiet_since < self.grace:
                continue
            due = self.nsqd.next_deadline_in()
            if due is None or due <= 0:
                continue  # nothing pending, or due already: the queue scanner has it
            self.nsqd.advance(due)
            self.skips += 1
            last, quiet_since = None, time.monotonic()
