"""Group commit for durable mode (see :mod:`.durable`): one fsync shared by the publishers waiting.

The owner (a durable disk queue, under its topic's or channel's lock) says
what it has written (:meth:`GroupSync.wrote`); a publisher waits, without the
owner's lock, until a token of its write is fsynced (:meth:`GroupSync.wait`).
One waiter at a time leads: it fsyncs everything written so far, outside any
lock, writes the owner's metadata when the metadata file needs it, and wakes
the waiters its fsync covered and one of the rest to lead the next commit.
An fsync failure is sticky: every later wait for a token not synced before it
raises BackendError.
"""

import os
import threading

from .backend import BackendError
from .files import close_quietly, strerror
from .meta_file import format_meta


class GroupSync:
    """What is written and what is fsynced, shared with threads in ``wait()``.

    Positions are ``(file num, pos)`` tuples, which order like the stream
    (file numbers only grow).  ``synced``: every record ending at or before
    it is on disk.
    """

    def __init__(self, file_name, position, write_meta):
        """``write_meta(data, fsync)`` replaces the metadata file (raises OSError).  Metadata is handed
        in as the five fields of :func:`~.meta_file.format_meta`."""
        self._file_name = file_name
        self._write_meta = write_meta
        self.meta_lock = threading.Lock()  # serializes metadata file writes; guards _meta_written (and the owner's kept file)
        self._meta_written = 0  # the number of the snapshot the metadata file holds
        # Guards all the state below.  Waiters do not sleep on a Condition: each sleeps on a lock of its
        # own, listed with its token in _waiters, so that a commit wakes only the waiters it covered
        # (they return without taking this lock again) and one more to lead the next commit, not
        # every waiter to find out (see _wake_locked).
        self._lock = threading.Lock()
        self._waiters = []  # _Waiter entries, in the order they came
        self._meta = None  # the owner's metadata at its latest sync point: (number, fields)
        # The write file number the metadata file holds (None: not known, or no file).  A commit
        # writes the metadata only when the write file has changed since (see wrote()).
        self._meta_file_num = None
        self._meta_number = 0  # numbers the owner's snapshots (and direct writes) in the order taken
        self.written = position
        self.synced = position
        # The leaders' own descriptor of the owner's current write file (a dup, made as the owner
        # opens the file, so that an fsync outside the lock never finds its fd closed under it or
        # reused) and that file's number.  The one a leader is fsyncing is _leader_fd; if the owner
        # moves on meanwhile, that leader closes it (_leader_fd_retired).
        self._fd = None
        self._fd_num = None
        self._leader_fd = None
        self._leader_fd_retired = False
        self._syncing = False  # a waiter is fsyncing outside the lock
        self._error = None  # sticky fsync failure text
        self._error_floor = None  # synced at the time of the failure
        self._closed = False
        self._fsync_count = 0  # fsyncs issued by waiters (group commits): fsync_count()

    def fsync_count(self):
        """The fsyncs the waiters' leaders have issued so far (one per group commit)."""
        with self._lock:
            return self._fsync_count

    # -- owner side (owner's lock held) ------------------------------------------

    def attach(self, fd, file_num):
        """The owner writes to ``fd``, file ``file_num``, now."""
        try:
            own = os.dup(fd)
        except OSError:
            own = None  # (out of descriptors: a leader opens the file by name)
        with self._lock:
            retired = self._retire_fd_locked()
            self._fd, self._fd_num = own, file_num
        close_quietly(retired)

    def detach(self):
        """Before the owner closes its write fd."""
        with self._lock:
            retired = self._retire_fd_locked()
        close_quietly(retired)

    def _retire_fd_locked(self):
        """Forget the leaders' descriptor; returns it for the caller to close, or None (none, or a
        leader is fsyncing it and closes it when done)."""
        fd = self._fd
        self._fd = self._fd_num = None
        if fd is not None and fd == self._leader_fd:
            self._leader_fd_retired = True
            return None
        return fd

    def wrote(self, position, meta_fields=None):
        """Written up to ``position`` (file num, pos).  ``meta_fields``: the owner's ``_meta_fields``,
        called (under this lock) for a snapshot for the next leader to write, when the metadata file
        does not hold ``position``'s write file yet.

        Within one write file a commit need not write the metadata: a process reading the directory
        after a kill finds the records past a stale write position (go-diskqueue: a write file larger
        than the metadata says is read to its end, and writes go on in a new file).  Only a roll to a
        new file (go-diskqueue would write into it from 0) or a missing file needs the write."""
        with self._lock:
            if position > self.written:
                self.written = position
            if meta_fields is not None and self._meta_file_num != position[0]:
                self._meta_number += 1
                self._meta = (self._meta_number, meta_fields())

    def write_meta(self, fields, fsync):
        """The owner writes its metadata now (newer than any snapshot: a leader holding one skips it)."""
        with self._lock:
            self._meta_number += 1
            number = self._meta_number
            self._meta = None
        with self.meta_lock:
            self._write_fields(fields, fsync)
            self._meta_written = number

    def _write_fields(self, fields, fsync):
        """Write the metadata (``meta_lock`` held) and note its write file number."""
        try:
            self._write_meta(format_meta(*fields), fsync)
        except OSError:
            with self._lock:
                self._meta_file_num = None  # (the next commit writes it again)
            raise
        with self._lock:
            self._meta_file_num = fields[3]

    def forget_meta(self):
        """empty(): the metadata file is about to be removed; no snapshot taken before may recreate it."""
        with self._lock:
            self._meta_number += 1
            number = self._meta_number
            self._meta = None
        with self.meta_lock:
            self._meta_written = number
            with self._lock:
                self._meta_file_num = None

    def mark_synced(self, position):
        woken = ()
        with self._lock:
            if position > self.synced:
                self.synced = position
                woken = self._wake_locked()
        _wake(woken)

    def failed(self, text):
        with self._lock:
            if self._error is None:
                self._error = text
                self._error_floor = self.synced
            woken = self._wake_locked()
        _wake(woken)

    def rollback(self, position):
        """A failed put truncated the stream back to ``position``."""
        with self._lock:
            if self.synced > position:
                self.synced = position

    def reset(self, position):
        """empty(): everything before ``position`` is gone, so nothing to wait for."""
        with self._lock:
            self.written = max(self.written, position)
            self.synced = max(self.synced, position)
            woken = self._wake_locked()
        _wake(woken)

    def roll(self, fd, new_num):
        """The writer moves on to file ``new_num``: fsync the finished file.

        ``fd`` is the finished file's write fd, or None if it is not open
        (then the file holding unsynced writes, if any, is fsynced by name).
        Raises OSError (and the failure is sticky) if the fsync fails.
        """
        with self._lock:
            need = self.synced < self.written
            num = self.written[0] if fd is None else self._fd_num
        try:
            if fd is not None:
                os.fsync(fd)
            elif need and num < new_num:
                self._fsync_path(num)
        except OSError as e:
            self.failed("fsync %s: %s" % (self._file_name(num), strerror(e)))
            raise
        self.mark_synced((new_num, 0))

    def close(self, queue, flush):
        """close() (``flush``: fsync what is still unsynced first) or delete()."""
        if flush:
            try:
                self.wait(self.written)
            except BackendError as e:
                queue.log.error("DISKQUEUE(%s) failed to sync - %s", queue.name, e)
        with self._lock:
            self._closed = True
            retired = self._retire_fd_locked()
            woken = self._wake_locked()
        _wake(woken)
        close_quietly(retired)

    # -- waiters (any thread, owner's lock not held) --------------------------------

    def wait(self, token):
        lock = self._lock
        lock.acquire()
        try:
            while True:
                if self._error is not None and token > self._error_floor:
                    raise BackendError(self._error)
                if token <= self.synced:
                    return
                if not self._syncing:
                    if self._closed:
                        raise BackendError("exiting")
                    break
                waiter = _Waiter(token)
                self._waiters.append(waiter)
                lock.release()
                try:
                    waiter.sleep()  # until a commit covers the token, fails, or ends (_wake_locked)
                finally:
                    if waiter.covered:  # (the commit that woke it covered its token: nothing to look at)
                        lock = None
                    else:
                        lock = self._lock
                        lock.acquire()
                if lock is None:
                    return
            # Leader: fsync everything written so far, then write the metadata of the latest sync point.
            self._syncing = True
            target = self.written
            meta = self._meta
            fd = None
            if self._fd is not None and self._fd_num == target[0]:
                fd = self._leader_fd = self._fd  # (else: opened by name)
        finally:
            if lock is not None:
                lock.release()
        synced = False
        error = None
        sticky = False
        try:
            if fd is None:
                try:
                    fd = os.open(self._file_name(target[0]), os.O_RDONLY)
                except FileNotFoundError:
                    synced = True  # emptied, or consumed and acked: nothing left to sync
                except OSError as e:
                    error = "open %s: %s" % (self._file_name(target[0]), strerror(e))
            if fd is not None:
                try:
                    os.fsync(fd)
                    synced = True
                except OSError as e:
                    error = "fsync %s: %s" % (self._file_name(target[0]), strerror(e))
                    sticky = True
                finally:
                    self._done_with_fd(fd)
            if synced and meta is not None:
                self._leader_writes_meta(meta)
        finally:
            with self._lock:
                self._syncing = False
                if synced:
                    if fd is not None:
                        self._fsync_count += 1
                    if target > self.synced:
                        self.synced = target
                elif sticky and self._error is None:
                    self._error = error
                    self._error_floor = self.synced
                woken = self._wake_locked()
                late_error = synced and self._error is not None and token > self._error_floor
            _wake(woken)
            if late_error:
                # Another fsync of this data failed meanwhile; this one may only
                # have succeeded because that one consumed the error report.
                raise BackendError(self._error)
        if not synced:
            raise BackendError(error or "exiting")

    def _done_with_fd(self, fd):
        """The leader has fsynced ``fd``: close it if it opened it or the owner retired it meanwhile."""
        with self._lock:
            borrowed = fd == self._leader_fd
            if borrowed:
                self._leader_fd = None
                if self._leader_fd_retired:
                    self._leader_fd_retired = False
                    borrowed = False
        if not borrowed:
            os.close(fd)

    def _wake_locked(self):
        """Take off the list the waiters a change concerns, for :func:`_wake` once the lock is
        released (a waiter woken under it would only wait for it again): those whose tokens are
        synced now (marked covered: they return at once), after a sticky failure or the close all of
        them, and, when nobody is fsyncing, the first of the rest, to lead the next commit (it covers
        everything written, so the others need not look)."""
        waiters = self._waiters
        if not waiters:
            return ()
        if self._error is not None or self._closed:
            self._waiters = []
            return waiters
        synced = self.synced
        leading = self._syncing
        woken = []
        sleeping = []
        for waiter in waiters:
            if waiter.token <= synced:
                waiter.covered = True
                woken.append(waiter)
            elif not leading:
                woken.append(waiter)
                leading = True
            else:
                sleeping.append(waiter)
        self._waiters = sleeping
        return woken

    def _leader_writes_meta(self, meta):
        """After the leader's fsync, before it releases the waiters: the snapshot goes to the file
        unless something newer is there already or the queue has closed.  No fsync: the write is for
        a process that reads the directory after a kill (Go nsqd: see the module's docstring); a
        failure is left to the next sync, which writes the metadata again (and reports it)."""
        number, fields = meta
        with self.meta_lock:
            with self._lock:
                if self._closed or number <= self._meta_written:
                    return
            try:
                self._write_fields(fields, False)
            except OSError:
                return
            self._meta_written = number

    def _fsync_path(self, file_num):
        try:
            fd = os.open(self._file_name(file_num), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Waiter:
    """A thread in :meth:`GroupSync.wait`, asleep on a lock of its own until :func:`_wake`."""

    __slots__ = ("token", "covered", "_lock")

    def __init__(self, token):
        self.token = token
        self.covered = False  # set (under GroupSync's lock) by the waker: a commit covered the token
        self._lock = threading.Lock()
        self._lock.acquire()

    def sleep(self):
        self._lock.acquire()

    def wake(self):
        self._lock.release()


def _wake(waiters):
    for waiter in waiters:
        waiter.wake()
