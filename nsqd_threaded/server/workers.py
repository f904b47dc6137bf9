"""WorkerPool: the threads that run what a NetPoller must not wait on.

The poller thread never waits: a command that may (an auth server, a TLS
handshake, a durable publish), a connection whose body has not all arrived,
and every consumer's message pump are tasks for a worker (``nsqd-worker-N``).
A task runs the protocol's synchronous code as a connection's own thread
once did.  There are as many workers as there is work that waits: an idle
worker takes the next task, a task that finds none idle starts one (up to
:data:`POOL_SIZE`; past it, the poller adds one for a queue that stalls
:data:`STALL_AFTER`), and one idle for :data:`WORKER_LINGER` seconds ends
(:data:`MIN_WORKERS` always stay).
"""

import collections
import itertools
import threading
import time
import traceback

WORKER_LINGER = 5.0  # seconds an idle worker waits for a task before it ends (one always stays)
MIN_WORKERS = 1  # workers kept however idle: a task never waits for a thread to start
POOL_SIZE = 4  # workers started as tasks come; more only for a queue that stalls
STALL_AFTER = 0.01  # seconds the oldest queued task may wait before the poller adds a worker


class _Worker:
    """One worker thread's hand-off slot: the task given to it while idle, and the Event that signals it."""

    __slots__ = ("thread", "task", "given")

    def __init__(self):
        self.thread = None
        self.task = None
        self.given = threading.Event()  # signals: a task was handed to this idle worker (or stop)


class WorkerPool:
    """The workers of one :class:`~nsqd_threaded.server.netpoll.NetPoller`.

    ``_lock`` guards ``_tasks`` (queued while no worker is idle), ``_idle``
    (idle workers, the last to idle first), ``_workers``, ``_ended`` (workers
    that left, to join), ``_busy`` (workers not idle), ``queued_since`` and
    ``_stopping``.  Nothing else is taken under it (a worker's Event is set
    under it, which takes no lock of ours).

    ``on_queued`` is called, with no lock held, when a task waits in the
    queue with every worker busy and the pool full: the poller then watches
    how long it waits (:meth:`check_stall`).
    """

    def __init__(self, log, limits, on_queued):
        self._log = log
        self._limits = limits
        self._on_queued = on_queued
        self._lock = threading.Lock()
        self._tasks = collections.deque()
        self._idle = []
        self._workers = set()
        self._ended = []
        self._names = itertools.count(1)
        self._busy = 0
        self.queued_since = None  # when a task last queued with no worker idle (None: no queue)
        self._stopping = False

    def submit(self, task):
        """Run ``task`` on a worker: an idle one, else a new one while there are fewer than
        :data:`POOL_SIZE`, else the next to free up (the poller adds one if that takes longer
        than :data:`STALL_AFTER`: the busy ones may be waiting on slow clients)."""
        with self._lock:
            if self._idle:
                worker = self._idle.pop()
                worker.task = task
                self._busy += 1
                worker.given.set()
                return
            self._tasks.append(task)
            if len(self._workers) < POOL_SIZE:
                self._start_worker_locked()
                return
            if self.queued_since is not None:
                return
            self.queued_since = time.monotonic()
        self._on_queued()

    def busy(self):
        """True while a worker runs a task or one is queued."""
        with self._lock:
            return self._busy > 0 or bool(self._tasks)

    def running(self):
        """How many workers run a task now."""
        with self._lock:
            return self._busy

    def drop_queued_if_idle(self):
        """Stopping: forget the queued tasks if no worker runs (nothing would run them); how many run."""
        with self._lock:
            if not self._busy:
                self._tasks.clear()
            return self._busy

    def check_stall(self, now):
        """The poller: a task queued for longer than STALL_AFTER gets a worker of its own.  Seconds
        until the next look, or None while nothing is queued."""
        with self._lock:
            since = self.queued_since
            if since is None:
                return None
            if not self._tasks:
                self.queued_since = None
                return None
            if now - since < STALL_AFTER:
                return since + STALL_AFTER - now
            self.queued_since = now
            self._start_worker_locked()
            return STALL_AFTER

    def stop(self):
        """No more idling: the idle workers end now, the busy ones once the queue is empty."""
        with self._lock:
            self._stopping = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.given.set()

    def join(self):
        """After :meth:`stop` (and once nothing submits more): join every worker started."""
        with self._lock:
            workers = list(self._workers) + self._ended
        for worker in workers:
            worker.given.set()
            worker.thread.join()

    def _start_worker_locked(self):
        worker = _Worker()
        worker.thread = threading.Thread(target=self._work, args=(worker,),
                                         name="nsqd-worker-%d" % next(self._names), daemon=True)
        try:
            worker.thread.start()
        except RuntimeError as e:  # the host's task limit: the queued tasks wait for a busy worker
            if self._limits is not None:
                self._limits.hit("thread", "cannot start a worker thread - %s" % e,
                                 "raise the task limit (ulimit -u, systemd TasksMax, pids cgroup)")
            return
        self._workers.add(worker)
        self._busy += 1  # (it starts by looking at the queue)
        if self._ended:
            self._ended = [w for w in self._ended if w.thread.is_alive()]

    def _work(self, worker):
        """A worker thread: run the queued tasks, then wait idle for one handed to it."""
        task = None
        while True:
            if task is not None:
                try:
                    task()
                except Exception:  # noqa: BLE001 - logged; the worker goes on
                    self._log.error("nsqd worker: unhandled error\n%s", traceback.format_exc())
                task = None
            with self._lock:
                if self._tasks:
                    task = self._tasks.popleft()
                    continue
                self._busy -= 1
                if self._stopping:
                    return
                worker.given.clear()
                worker.task = None
                self._idle.append(worker)
            task = self._wait_for_task(worker)
            if task is None:
                return

    def _wait_for_task(self, worker):
        """Idle: the task handed to ``worker``, or None when it ends (stopping, or idle too long)."""
        while True:
            worker.given.wait(WORKER_LINGER)
            with self._lock:
                task, worker.task = worker.task, None
                if task is not None:  # (submit took it off _idle and counted it busy)
                    return task
                if self._stopping:  # (stop emptied _idle)
                    return None
                if len(self._workers) > MIN_WORKERS:
                    self._idle.remove(worker)
                    self._workers.discard(worker)
                    self._ended.append(worker)
                    return None
