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
next ``recv`` has returned.  A busy connection never idles that long and pays
nothing; an idle one pays two epoll calls and one hand-off per wake-up.

Linux only (epoll); elsewhere :func:`new_idle_watcher` returns None and
connection threads simply block in ``recv``.
"""

import os
import select
import threading

IDLE_AFTER = 0.5  # seconds without a byte before a connection thread parks
MAX_RUNNING = 4  # released parked threads that may be running at once
PERMIT_WAIT = 1.0  # seconds the watcher waits for a permit before releasing a thread without one

# IdleWatcher.park results
TIMED_OUT = 0
WOKEN = 1
WOKEN_UNCOUNTED = 2


class IdleWatcher:
    """Parks idle connection threads; owned by an NSQD (:meth:`start` / :meth:`stop`).

    ``_lock`` guards ``_parked`` (fd -> [the parked thread's lock, permit
    granted]) and ``_stopping``.  ``_permits`` bounds the released threads still running
    up to their next ``recv``.
    """

    def __init__(self, max_running=MAX_RUNNING):
        self._epoll = select.epoll()
        self._lock = threading.Lock()  # guards _parked and _stopping
        self._parked = {}
        self._stopping = False
        self._permits = threading.Semaphore(max_running)  # released threads not yet past their recv
        self._wake_r, self._wake_w = os.pipe()
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._run, name="nsqd-idle-watch", daemon=True)
        self._thread.start()

    def stop(self):
        """Stop and join the watcher; call once no connection thread can park any more."""
        with self._lock:
            self._stopping = True
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def park(self, fd, timeout):
        """Sleep until ``fd`` is readable or ``timeout`` seconds pass (None: no limit).

        Returns TIMED_OUT, WOKEN (the caller holds a permit: it must call
        :meth:`resumed` once its ``recv`` has returned or failed) or
        WOKEN_UNCOUNTED (no permit to return).
        """
        entry = [threading.Lock(), False]  # the thread's gate, and whether a permit came with its release
        gate = entry[0]
        gate.acquire()
        with self._lock:
            if self._stopping:
                return TIMED_OUT
            self._parked[fd] = entry
        try:
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLONESHOT)
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
            except OSError:
                pass
        if not woken:
            return TIMED_OUT
        return WOKEN if entry[1] else WOKEN_UNCOUNTED

    def resumed(self):
        """A thread released with a permit has its recv done: the permit goes back."""
        self._permits.release()

    def _run(self):
        wake_r = self._wake_r
        while True:
            try:
                events = self._epoll.poll()
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == wake_r:
                    with self._lock:
                        if self._stopping:
                            return
                    continue
                with self._lock:
                    entry = self._parked.pop(fd, None)
                if entry is None:
                    continue  # its thread timed out and left
                # Waiting for a permit is bounded: should the permits ever be
                # held up, threads are released uncounted rather than not at all.
                entry[1] = self._permits.acquire(timeout=PERMIT_WAIT)
                entry[0].release()


def new_idle_watcher():
    """An IdleWatcher where epoll exists, else None."""
    return IdleWatcher() if hasattr(select, "epoll") else None
