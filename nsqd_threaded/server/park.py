"""ConnectionPark: idle HTTP keep-alive connections held without a thread.

Linux only (epoll); elsewhere :func:`new_connection_park` returns None and
each kept-alive connection keeps its thread.
"""

import heapq
import os
import select
import threading
import time


class ConnectionPark:
    """Idle connections held without a thread: one thread watches their sockets.

    An HTTP keep-alive connection between requests needs no thread: its
    connection thread hands the socket here (:meth:`park`) and ends.  When the
    socket becomes readable (a new request, or the client closing) this
    watcher calls ``resume(sock, address)``, which gives it a thread again;
    when it stays quiet for its ``timeout`` the watcher calls
    ``expire(sock, address)``, which closes it.  Both callbacks run on the
    watcher thread and must not block.

    ``_lock`` guards ``_parked`` (fd -> (sock, address, deadline)), the heap
    of deadlines ``_deadlines`` (stale entries are skipped), ``_stopping`` and
    ``_thread`` (the watcher thread, started by the first :meth:`park`).
    Linux only (epoll): see :func:`new_connection_park`.
    """

    def __init__(self, resume, expire, name):
        self._resume = resume
        self._expire = expire
        self._epoll = select.epoll()
        self._lock = threading.Lock()  # guards _parked, _deadlines, _stopping and _thread
        self._parked = {}
        self._deadlines = []
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._name = name
        self._thread = None  # started by the first park(): with nothing parked it has nothing to do

    def park(self, sock, address, timeout):
        """Hold ``sock`` until readable or ``timeout`` seconds pass; False when stopping (keep it)."""
        fd = sock.fileno()
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._stopping:
                return False
            first = not self._deadlines or deadline < self._deadlines[0][0]
            self._parked[fd] = (sock, address, deadline)
            heapq.heappush(self._deadlines, (deadline, fd))
            if self._thread is None:
                # Started (under _lock, which its first step takes) here rather than with the
                # server: a broker that stops before any connection goes idle never pays for it.
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        try:
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLONESHOT)  # EOF is readable too
        except (OSError, ValueError):  # (ValueError: stop() closed the epoll meanwhile)
            with self._lock:
                self._parked.pop(fd, None)
            return False
        if first:
            os.write(self._wake_w, b"d")  # the watcher's sleep must end sooner
        return True

    def __len__(self):
        with self._lock:
            return len(self._parked)

    def stop(self):
        """Stop and join the watcher; returns the ``(sock, address)`` still parked, for the caller to close."""
        with self._lock:
            self._stopping = True
        os.write(self._wake_w, b"x")
        if self._thread is not None:  # (no park() can start it now: _stopping is set)
            self._thread.join()
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        with self._lock:
            left = [(sock, address) for sock, address, _ in self._parked.values()]
            self._parked.clear()
        return left

    def _take(self, fd):
        with self._lock:
            entry = self._parked.pop(fd, None)
        if entry is not None:
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass
        return entry

    def _run(self):
        wake_r = self._wake_r
        while True:
            with self._lock:
                if self._stopping:
                    return
                timeout = self._deadlines[0][0] - time.monotonic() if self._deadlines else -1
            try:
                events = self._epoll.poll(max(0.0, timeout) if timeout != -1 else -1)
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == wake_r:
                    os.read(wake_r, 64)
                    continue
                entry = self._take(fd)
                if entry is not None:
                    self._resume(entry[0], entry[1])
            now = time.monotonic()
            expired = []
            with self._lock:
                heap = self._deadlines
                while heap and heap[0][0] <= now:
                    deadline, fd = heapq.heappop(heap)
                    entry = self._parked.get(fd)
                    if entry is not None and entry[2] == deadline:
                        expired.append(fd)
            for fd in expired:
                entry = self._take(fd)
                if entry is not None:
                    self._expire(entry[0], entry[1])


def new_connection_park(resume, expire, name):
    """A ConnectionPark where epoll exists, else None (connections then keep their threads)."""
    if not hasattr(select, "epoll"):
        return None
    return ConnectionPark(resume, expire, name)
