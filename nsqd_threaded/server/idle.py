"""IdleWatcher: one thread watches idle connections, so that thousands never wake at once.

A connection thread blocked in ``recv`` wakes as soon as its socket is
readable.  When thousands of clients disconnect together, thousands of
threads then want the GIL at once, and every thread waiting for the GIL wakes
each switch interval (5 ms) to ask for it: the broker spends its time in
those wake-ups and stalls for seconds (/ping included), worse than linearly
in the number of threads.

So a connection idle for :data:`IDLE_AFTER` seconds parks: it registers its
socket with this watcher's epoll and sleeps on a lock of its own (a thread
waiting on a lock sleeps in the kernel until released).  The watcher thread
releases parked threads as their sockets become readable, but never more
than ``max_running`` at a time: a released thread holds a permit until its
next ``recv`` has returned.  The threads chosen while every permit is out
wait in the watcher's queue; the watcher goes on polling meanwhile (a permit
returned wakes it), so the hang-ups that arrive later are not held up behind
the releases.  A busy connection never idles that long and pays
nothing; an idle one pays two epoll calls and one hand-off per wake-up.

A parked thread may leave a ``hangup`` callable with its socket.  When the
peer has closed (``EPOLLRDHUP``/``EPOLLHUP``) and no byte is left unread,
the watcher calls it itself, for every such socket of a wake-up, before it
releases any thread: the connection leaves its channel at once, while its
thread waits its turn for a permit.  After a mass disconnect the broker's
state (``/stats``) is then current within one pass of this thread instead of
after thousands of thread wake-ups; the threads still do their teardown
(which finds the client gone) a permit's worth at a time.  A socket with
unread bytes is left to its thread: a FIN sent just before the close must be
processed first.

Linux only (epoll); elsewhere :func:`new_idle_watcher` returns None and
connection threads simply block in ``recv``.
"""

import array
import collections
import os
import select
import threading
import time

try:
    import fcntl
    import termios
except ImportError:  # no POSIX ioctl: no epoll either, so no watcher (see new_idle_watcher)
    fcntl = termios = None

from ..internal.process import malloc_trim, widen_futex_hash

IDLE_AFTER = 0.5  # seconds without a byte before a connection thread parks
REPARK_AFTER = 2.0  # seconds parked after which a wake-up's next recv parks at once when nothing is there
MAX_RUNNING = 32  # released parked threads that may be running at once
MAX_TEARDOWNS = 4  # released threads whose peer hung up (their client already gone) tearing down at once
PERMIT_WAIT = 1.0  # seconds the watcher waits for a permit before releasing a thread without one
TRIM_AFTER_CLOSED = 256  # connections closed since the last trim that make one worth it
TRIM_QUIET = 1.0  # seconds without a close before the watcher trims
MIN_EVENTS = 64  # the smallest batch asked of epoll
if hasattr(select, "epoll"):
    # PyPy 3.9's select module lacks EPOLLRDHUP; its epoll passes the bits on, so Linux's value serves.
    _EPOLLRDHUP = getattr(select, "EPOLLRDHUP", 0x2000)
    WATCHED = select.EPOLLIN | _EPOLLRDHUP | select.EPOLLONESHOT  # what a parked socket waits for
    HANGUP = _EPOLLRDHUP | select.EPOLLHUP  # the peer closed (or reset) the connection

# IdleWatcher.park results
TIMED_OUT = 0
WOKEN = 1
WOKEN_UNCOUNTED = 2


class IdleWatcher:
    """Parks idle connection threads; owned by an NSQD (:meth:`start` / :meth:`stop`).

    ``_lock`` guards ``_parked`` (fd -> [the parked thread's lock, permit
    granted, its hangup callable or None, its thread's ident]), ``_stopping``,
    ``_closed``, ``_started``, ``_thread`` (the watcher thread, started with
    its first work), the ``running`` counts of ``_live`` and ``_teardowns``
    (:class:`_Permits`), ``_tearing_down`` (idents of the threads holding a
    teardown permit) and ``_permit_wanted`` (the watcher waits for a permit:
    the next one returned must wake it).  The permits' queues are the watcher
    thread's own.

    Two kinds of permit: a thread whose peer hung up (its hangup already took
    the client out of its channel) only has its teardown left, which can
    wait; those go :data:`MAX_TEARDOWNS` at a time, so that a mass
    disconnect's thousands of teardowns leave the GIL to the live clients and
    requests (``/stats``, the connections that were not parked) rather than
    contend for it 32 at a time.

    The watcher also gives memory back after a mass disconnect: once
    :data:`TRIM_AFTER_CLOSED` connections have closed and then
    :data:`TRIM_QUIET` seconds pass without a close, it calls glibc's
    ``malloc_trim(0)``.  The connection threads allocated their buffers in
    glibc's per-thread arenas, and free memory in the middle of an arena's
    heap goes back to the kernel only when a trim walks it (the figures are in
    docs/performance.md).  The trim runs on this thread, without the GIL
    (ctypes releases it), once the disconnects are over.
    """

    def __init__(self, max_running=MAX_RUNNING, trim=None, trim_after_closed=TRIM_AFTER_CLOSED, trim_quiet=TRIM_QUIET,
                 max_teardowns=MAX_TEARDOWNS, hangup_lock=None):
        """``trim``: called with 0 to give memory back (default: glibc's ``malloc_trim``, if any).

        ``hangup_lock``: held while the hangups of one wake-up run, taken once
        for all of them (the daemon's teardown lock, which each hangup would
        otherwise take for itself, and wait for whenever a connection thread
        tearing down holds it: a mass close's thousands of hangups then cost
        thousands of waits and GIL hand-offs)."""
        self._hangup_lock = hangup_lock
        self._epoll = select.epoll()
        self._lock = threading.Lock()  # guards _parked, _stopping, _closed, _started and _thread
        self._parked = {}
        self._stopping = False
        self._closed = 0  # connections closed since the last trim
        self._last_closed = 0.0  # time.monotonic() of the last close
        self._trim = trim if trim is not None else malloc_trim()
        self._trim_after_closed = trim_after_closed
        self._trim_quiet = trim_quiet
        self._live = _Permits(max_running)
        self._teardowns = _Permits(max_teardowns)
        self._tearing_down = set()
        self._permit_wanted = False
        self._wake_r, self._wake_w = os.pipe()
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._started = False  # start() was called: the thread may run once it has work
        self._thread = None

    def start(self):
        """Let the watcher run.  Its thread starts with its first work (a parked connection, a
        trim due), so a broker stopped before any connection went idle never pays for it."""
        with self._lock:
            self._started = True
            if self._parked or self._closed >= self._trim_after_closed:
                self._start_thread_locked()

    def _start_thread_locked(self):
        if self._thread is None and self._started and not self._stopping:
            # (under _lock, which the thread's loop takes: it waits for this caller to release it)
            self._thread = threading.Thread(target=self._run, name="nsqd-idle-watch", daemon=True)
            self._thread.start()

    def stop(self):
        """Stop and join the watcher; call once no connection thread can park any more."""
        with self._lock:
            self._stopping = True
            thread, self._thread = self._thread, None  # (none starts once _stopping is set)
        os.write(self._wake_w, b"x")
        if thread is not None:
            thread.join()
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def park(self, fd, timeout, hangup=None):
        """Sleep until ``fd`` is readable or ``timeout`` seconds pass (None: no limit).

        Returns TIMED_OUT, WOKEN (the caller holds a permit: it must call
        :meth:`resumed` once its ``recv`` has returned or failed) or
        WOKEN_UNCOUNTED (no permit to return).

        ``hangup``: called on the watcher thread, before this thread is
        released, when the peer has closed and nothing is left to read on
        ``fd`` (the caller's recv will see the end).  It must be quick, must
        not raise, and must tolerate the caller's own teardown running after it.
        """
        # the gate, whether a permit came with its release, hangup, the thread (see resumed)
        entry = [threading.Lock(), False, hangup, threading.get_ident()]
        gate = entry[0]
        gate.acquire()
        with self._lock:
            if self._stopping:
                return TIMED_OUT
            self._parked[fd] = entry
            self._start_thread_locked()
        try:
            self._epoll.register(fd, WATCHED)
            registered = True
        except OSError:  # closed under us: let recv report it
            registered = False
        woken = registered and gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
        if not woken:
            with self._lock:
                chosen = self._parked.pop(fd, None) is None
            if chosen:  # the watcher chose us meanwhile: wait for its release
                gate.acquire()
                woken = True
            elif not registered:
                return WOKEN_UNCOUNTED
        if registered:
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):  # (ValueError: stop() closed the epoll after releasing us)
                pass
        if not woken:
            return TIMED_OUT
        return WOKEN if entry[1] else WOKEN_UNCOUNTED

    def resumed(self):
        """A thread released with a permit has its recv done (or, when the
        connection ended, its teardown): the permit goes back (the thread's own call)."""
        ident = threading.get_ident()
        with self._lock:
            if ident in self._tearing_down:
                self._tearing_down.discard(ident)
                self._teardowns.running -= 1
            else:
                self._live.running -= 1
            wake, self._permit_wanted = self._permit_wanted, False
        if wake:
            os.write(self._wake_w, b"p")

    def connection_closed(self):
        """A connection has been torn down (its thread is about to end): counts towards a trim."""
        with self._lock:
            self._closed += 1
            self._last_closed = time.monotonic()
            if self._closed == self._trim_after_closed and self._trim is not None and not self._stopping:
                self._start_thread_locked()
                os.write(self._wake_w, b"t")  # the watcher may be asleep without a timeout

    def _run(self):
        wake_r = self._wake_r
        trim = self._trim
        while True:
            timeout = -1
            if trim is not None:
                with self._lock:
                    if self._closed >= self._trim_after_closed:
                        # Time since the last close, not since the last event:
                        # the connections left keep waking this thread.
                        timeout = self._last_closed + self._trim_quiet - time.monotonic()
                        if timeout <= 0:
                            self._closed = 0
                if timeout != -1 and timeout <= 0:
                    trim(0)  # the disconnects are over: give freed memory back
                    continue
            for permits in (self._live, self._teardowns):
                if permits.queued:
                    due = max(0.0, permits.stalled_since + PERMIT_WAIT - time.monotonic())
                    timeout = due if timeout == -1 else min(timeout, due)
            try:
                # Room for every parked socket: a mass disconnect's hang-ups are all
                # handled in this one pass, before any permit wait (len() is a hint).
                events = self._epoll.poll(timeout, max(MIN_EVENTS, len(self._parked) + 1))
            except InterruptedError:
                continue
            stopping = False
            hangups = []
            for fd, mask in events:
                if fd == wake_r:
                    os.read(wake_r, 64)
                    with self._lock:
                        stopping = self._stopping
                    continue
                with self._lock:
                    entry = self._parked.pop(fd, None)
                if entry is None:
                    continue  # its thread timed out and left
                # Chosen: its thread waits on its gate, so fd stays open until released.
                permits = self._live
                if entry[2] is not None and mask & HANGUP and not _unread(fd):
                    hangups.append(entry[2])  # (called below, before any release)
                    permits = self._teardowns
                if not permits.queued:
                    permits.stalled_since = time.monotonic()
                permits.queued.append(entry)
            if hangups:
                self._run_hangups(hangups)
            self._release_queued(stopping)
            if stopping:
                return

    def _run_hangups(self, hangups):
        """Call the hangups of one wake-up, under ``hangup_lock`` if there is one."""
        lock = self._hangup_lock
        if lock is None:
            for hangup in hangups:
                hangup()
            return
        with lock:
            for hangup in hangups:
                hangup()

    def _release_queued(self, stopping):
        """Release the queued threads there are permits for (all of them, uncounted, when
        stopping: a chosen thread waits for its release).

        Should the permits ever be held up, the head of the queue waits at most
        PERMIT_WAIT, then is released uncounted rather than not at all (one
        such release per PERMIT_WAIT: never the whole queue at once)."""
        released = []
        with self._lock:
            for permits in (self._live, self._teardowns):
                queued = permits.queued
                while queued:
                    if stopping:
                        counted = False
                    elif permits.running < permits.limit:
                        counted = True
                        permits.running += 1
                    elif time.monotonic() - permits.stalled_since >= PERMIT_WAIT:
                        counted = False
                    else:
                        break
                    entry = queued.popleft()
                    entry[1] = counted
                    if counted and permits is self._teardowns:
                        self._tearing_down.add(entry[3])
                    released.append(entry)
                    permits.stalled_since = time.monotonic()  # (the next head's wait begins)
            self._permit_wanted = bool(self._live.queued or self._teardowns.queued)
        for entry in released:
            entry[0].release()


class _Permits:
    """One kind of permit: how many released threads hold one (``running``, guarded by the
    IdleWatcher's ``_lock``) out of ``limit``, and the chosen threads waiting for one
    (``queued``) since ``stalled_since`` (the watcher thread's own)."""

    __slots__ = ("limit", "running", "queued", "stalled_since")

    def __init__(self, limit):
        self.limit = limit
        self.running = 0
        self.queued = collections.deque()
        self.stalled_since = 0.0


def _unread(fd):
    """Bytes received on socket ``fd`` and not yet read (FIONREAD); 1 if it cannot tell."""
    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
    except OSError:
        return 1
    return count[0]


def new_idle_watcher(hangup_lock=None):
    """An IdleWatcher where epoll exists, else None (and a futex hash wide enough for many threads).

    Widening the futex hash is process-wide, yet the daemon does it rather
    than the command (see :mod:`nsqd_threaded.internal.process`): a program
    embedding a broker holds its connection threads as well.
    """
    if not hasattr(select, "epoll"):
        return None
    widen_futex_hash()
    return IdleWatcher(hangup_lock=hangup_lock)
