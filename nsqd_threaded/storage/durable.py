"""Durable mode of the file diskqueue (``--durable``, beyond go-diskqueue).

The promise: a publish is acknowledged only once its record is fsynced, and a
record stays recoverable until its message is FINed, so a crash at any
instant loses nothing acknowledged (messages in flight at the crash are
delivered again: duplicates, never loss), and a record acknowledged before the
crash is not delivered again.  :class:`DurableDiskQueue`, a
:class:`~nsqd_threaded.storage.diskqueue.DiskQueue` that overrides its hooks, is
made of these pieces, each in a module of its own where it is a class:

* **Unacked records** (:class:`~.unacked.Unacked`, ``unacked.py``): every record :meth:`get` hands out
  is remembered (message ID, file, start, end) until :meth:`ack`.  The
  *committed read position* is the start of the oldest record not yet acked
  (or the read position when there is none); the metadata file stores it as
  the read position, with depth = unread + unacked records, so reopening the
  queue reads every unacked record again.  Go nsqd reading such a metadata
  file simply sees those records as unread.  Data files are deleted (or set
  aside as ``.bad`` after a read error) only once the committed position has
  passed them, and only after the metadata saying so is on disk.

* **Group commit** (:class:`~.group_sync.GroupSync`, ``group_sync.py``):
  :meth:`sync_point` (owner's lock held, right after ``put``) returns a
  token; :meth:`wait_synced` (owner's lock *not* held) returns once
  everything up to the token is fsynced.  One waiter at a time fsyncs -- a
  ``dup()`` of the write fd, outside any lock -- everything written so far;
  the others sleep, and it wakes those it covered and one of the rest to
  lead the next commit.  A write-file roll fsyncs the finished file, which
  covers every token in it.  Directory entries of new data files and of the metadata file are
  fsynced too.  An fsync failure is sticky: every later wait for a token not
  synced before it raises BackendError (the kernel may have dropped the
  pages, so nothing written since can be trusted until a restart).

* **Done log** (:class:`~.unacked.DoneLog`, ``unacked.py``): an acknowledgement the committed position
  cannot pass yet (an older record is still in flight) would be lost at a
  crash; its entry is appended to ``<name>.diskqueue.done.dat`` and the
  reader skips the record after a restart.  Attempts: a delivered or requeued message's
  attempts are written into its record's header in place
  (:meth:`DurableDiskQueue.keep_attempts`).

* **Metadata with the commits that need it**: a sync point in a write file
  the metadata file does not hold yet (a roll since, or no metadata file)
  also takes a snapshot of the metadata (:meth:`DurableDiskQueue.sync_point`,
  :meth:`~.group_sync.GroupSync.wrote`), and the group commit's leader writes it (in
  place, without an fsync) after its fsync and before it releases the
  waiters.  The topic's acknowledgement of a fanned-out batch
  (``ack(..., persist=True)``) writes it too.  So Go nsqd, which reads
  nothing of a queue whose metadata file is missing, and past a stale write
  position reads the metadata's write file to its end but writes over any
  later one, finds everything acknowledged after a SIGKILL of this broker; a
  fresh queue writes its metadata when it opens for the same reason.  Within
  one write file a commit writes nothing more: the metadata's write position
  may be stale, which both readers handle.  A FIN moves the committed read
  position in memory (the done log keeps it); it reaches the file with the
  next sync or persisted acknowledgement.

* **Startup**: data files past the metadata's write position (the metadata
  was lost or is older than them, e.g. a crash right after ``empty()``) are
  adopted rather than later overwritten, and a read position on a file that
  is gone moves to the next existing file.

Locking: everything here runs with the owner's (topic's or channel's) lock
held, which serializes it with the rest of DiskQueue -- except
:meth:`wait_synced`, which must be called *without* it.  What waiters share
with the owner lives in :class:`~.group_sync.GroupSync` and is guarded by its own lock
(``GroupSync._lock``): the written and synced positions, the owner's write
fd and its file number, the leader flag, the sticky error, the closed flag
and ``fsync_count``.  That lock is never held across an fsync; the owner
takes it only briefly, in GroupSync's owner-side methods, always while
holding its own lock (a waiter holding it never takes the owner's).
``GroupSync.meta_lock`` serializes the writes of the metadata file (the
owner's and the leaders'); it is taken before ``_lock`` when both are, and a
leader holds neither the owner's lock nor ``_lock`` while holding it.
:class:`Unacked` and the other durable state have no lock: the owner's
lock covers them.
"""

import errno
import os
import re
import struct

from .diskqueue import DiskQueue
from .files import close_quietly, fsync_dir, replace_atomically
from .group_sync import GroupSync
from .records import RECORD_LENGTH
from .unacked import DoneLog, Unacked


_ATTEMPTS = struct.Struct(">H")  # a record header's attempts field
_ATTEMPTS_OFFSET = RECORD_LENGTH.size + 8  # from a record's start: its length, the timestamp
_ID_OFFSET = _ATTEMPTS_OFFSET + _ATTEMPTS.size  # then the attempts, then the 16-byte ID


class DurableDiskQueue(DiskQueue):
    """DiskQueue in durable mode (see the module docstring); same arguments."""

    acks_deliveries = True
    _sync_meta_dir = True

    def __init__(self, *args, **kwargs):
        self._unacked = Unacked()
        self._handed_out = self._unacked.add
        self._bad_files = set()  # read errors: renamed to .bad once committed past
        self._dir_synced_num = None  # write file whose directory entry was fsynced
        self._gsync = None  # GroupSync, once the positions are known (_recovered)
        # (file num, fd) a data file opened for writing attempts into its headers (keep_attempts):
        # deliveries come from one file at a time, so one is kept open.  Under the owner's lock.
        self._attempts_file = None
        # [fd, length] of the metadata file kept open for the commits' in-place writes; guarded by
        # GroupSync's meta_lock (see _replace_meta_file)
        self._meta_file = None
        super().__init__(*args, **kwargs)

    def memory_capacity(self, mem_queue_size):
        """Every new message is written here first: the owner keeps none in memory."""
        return 0

    # -- API ------------------------------------------------------------------------

    @property
    def fsync_count(self):
        """fsyncs issued by :meth:`wait_synced` callers (one per group commit)."""
        return self._gsync.fsync_count()

    def describe(self):
        """DiskQueue.describe, and the group commits: how many fsyncs the waiters shared."""
        doc = super().describe()
        doc["unacked"] = len(self._unacked)
        doc["group_commits"] = self.fsync_count
        return doc

    def sync_point(self):
        """A token for everything written so far (call with the owner's lock held); the metadata as
        of now goes to the file with the commit that covers the token."""
        position = (self.write_file_num, self.write_pos)
        self._gsync.wrote(position, self._meta_fields)
        return position

    def wait_synced(self, token):
        """Return once everything up to ``token`` is fsynced; call WITHOUT the owner's lock.

        Raises BackendError on an fsync failure (this one or an earlier one)
        and ``exiting`` if the queue was closed by delete() (or a failing
        close()) before the data was synced; after a successful close() it
        returns.  Tokens of data emptied away return at once.
        """
        if token is not None:
            self._gsync.wait(token)

    def ack(self, msg_ids, persist=False):
        """Mark records handed out by get() as done (the oldest one for a repeated ID).

        Moves the committed read position over the leading done records and
        deletes the data files it has passed.  Unknown IDs are ignored.
        ``persist``: if the committed position moved, write the metadata now
        (without an fsync; the topic's pump, once per batch its channels hold).
        Returns the number of records marked done.
        """
        if self._exiting:
            return 0
        unacked = self._unacked
        done = []
        for msg_id in msg_ids:
            rec = unacked.ack(msg_id)
            if rec is not None:
                done.append(rec)
        n = len(done)
        if n:
            moved = unacked.advance()
            head = unacked.head()
            if not persist or (head is not None and any((r.file_num, r.start) > (head.file_num, head.start)
                                                        for r in done)):
                self._done.append(done)  # (persist: the metadata written below passes them, unless one is behind the head)
            if moved:
                self._count += moved
                self._advance_commit()
                if self._count >= self.sync_every:
                    self._sync_logged()
                elif persist:
                    try:
                        self._gsync.write_meta(self._meta_fields(), False)
                    except OSError as e:
                        self.log.error("DISKQUEUE(%s) failed to write metadata - %s", self.name, e)
        return n

    def keep_attempts(self, msgs, due_ns=None):
        """Write these handed-out messages' attempts into their records' headers, in place: a crash
        gives them back with them (a REQ, a timeout).  It is the header's own attempts field, which
        Go nsqd reads too.  Written, not fsynced (a later fsync of the file takes it along): a
        SIGKILL keeps it, a power loss may not.  A failure is logged (the attempts are then lost at
        a crash, nothing else).  ``due_ns`` (a REQ with a delay): a line in the deferred sidecar
        for each record, as a DPUB's, so a crash defers it until then rather than giving it at once."""
        writes = {}  # file num -> [(offset, attempts)]
        deferrals = []
        for msg in msgs:
            rec = self._unacked.find(msg.id)
            if rec is None:
                continue
            if msg.attempts:  # (0: as the record was written)
                writes.setdefault(rec.file_num, []).append((rec.start + _ATTEMPTS_OFFSET, msg.attempts))
            if due_ns is not None:
                deferrals.append((rec.file_num, rec.start, msg.id, due_ns))
        if deferrals:
            self._sidecar.add_due(deferrals)
        for num, offsets in writes.items():
            try:
                fd = self._attempts_fd(num)
                for offset, attempts in offsets:
                    os.pwrite(fd, _ATTEMPTS.pack(attempts), offset)
            except OSError as e:
                self._close_attempts_file()
                self.log.error("DISKQUEUE(%s) failed to keep attempts in %s - %s", self.name, self.file_name(num), e)

    def _attempts_fd(self, num):
        """The descriptor of data file ``num`` opened for writing (kept until another file's turn).
        A file deleted meanwhile was committed past: a write to it is harmless and is not read."""
        kept = self._attempts_file
        if kept is not None:
            if kept[0] == num:
                return kept[1]
            self._close_attempts_file()
        fd = os.open(self.file_name(num), os.O_WRONLY)
        self._attempts_file = (num, fd)
        return fd

    def _close_attempts_file(self):
        kept, self._attempts_file = self._attempts_file, None
        if kept is not None:
            close_quietly(kept[1])

    def holds_record(self, file_num, pos, msg_id):
        """Whether the record with ID ``msg_id`` (16 bytes) was written at ``(file_num, pos)`` (a
        position :meth:`positions_of` gave before its put) and is still stored or was consumed: its
        file is gone and older than the write file (deleted only once read and acknowledged), or the
        record there has that ID.  False when it was never written (a kill before the put; a write a
        crash tore, which the restart cut off and may have written over)."""
        found = self._id_at(file_num, pos)
        if found is None:
            return file_num < self.write_file_num
        return found == bytes(msg_id)

    def _id_at(self, file_num, pos):
        """The ID of the record at ``(file_num, pos)``: None when the file is gone, b"" when no whole
        record header is there."""
        try:
            fd = os.open(self.file_name(file_num), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            header = os.pread(fd, _ID_OFFSET + 16, pos)
        finally:
            os.close(fd)
        return header[_ID_OFFSET:] if len(header) == _ID_OFFSET + 16 else b""

    def position_of(self, msg_id):
        rec = self._unacked.find(msg_id)
        return None if rec is None else (rec.file_num, rec.start)

    def holds_undone(self, file_num, pos, msg_id):
        if (file_num, pos) < self.committed_position() or self._done.replay.get((file_num, pos)) == bytes(msg_id):
            return False  # (passed by the committed read position, or done before the crash)
        return self._id_at(file_num, pos) == bytes(msg_id)

    @property
    def unacked_count(self):
        return len(self._unacked)

    def committed_position(self):
        """``(file num, pos)`` where reading resumes after a reopen."""
        head = self._unacked.head()
        if head is None:
            return self.read_file_num, self.read_pos
        return head.file_num, head.start

    # -- DiskQueue hooks ----------------------------------------------------------

    def _recovered(self):
        if not self._fresh:
            self._adopt_unknown_files()
        self._commit_file = self.read_file_num  # files below it are deleted
        self._done = DoneLog(os.path.join(self.data_path, "%s.diskqueue.done.dat" % self.name), self.name, self.log)
        if not self._fresh:
            self._done.load((self.read_file_num, self.read_pos), (self.write_file_num, self.write_pos))
            if self._done.replay:
                self._replayed_done = self._skip_done
        self._gsync = GroupSync(self.file_name, (self.write_file_num, self.write_pos), self._replace_meta_file)
        if self._fresh or not os.path.exists(self.meta_file_name):
            # Go nsqd reads nothing of a queue without a metadata file, even data files found
            # after a kill: there is one from the start.
            try:
                self._gsync.write_meta(self._meta_fields(), False)
            except OSError as e:
                self.log.error("DISKQUEUE(%s) failed to write metadata - %s", self.name, e)

    def _replace_meta_file(self, data, fsync):
        """GroupSync's metadata writer (its ``meta_lock`` held).  ``fsync`` (a sync): temp file, fsync,
        rename, as go-diskqueue.  Otherwise (a commit's) in place: one ``pwrite`` at 0 into the file
        kept open for it, and a truncate only when the text got shorter, where a rename over the file
        costs as much as an fsync (ext4 flushes a file renamed over another) and an open, a truncate
        and a close per commit cost some 60 µs.  A kill cannot tear a ``pwrite``; one between it and
        the truncate leaves bytes after the last line, which go-diskqueue's ``Fscanf`` and
        :func:`~.meta_file.parse_meta` ignore.  A missing file is created by a rename, never half
        written; a rename closes the kept file (it would write to the replaced one)."""
        path = self.meta_file_name
        if not fsync:
            kept = self._meta_file
            if kept is None:
                try:
                    fd = os.open(path, os.O_WRONLY)
                except FileNotFoundError:
                    fd = None
                else:
                    kept = self._meta_file = [fd, os.fstat(fd).st_size]
            if kept is not None:
                try:
                    if os.pwrite(kept[0], data, 0) != len(data):
                        raise OSError(errno.EIO, "short write")
                    if len(data) < kept[1]:  # (only when it shrinks: a truncate costs a journal entry)
                        os.ftruncate(kept[0], len(data))
                    kept[1] = len(data)
                except OSError:
                    self._close_meta_file_locked()
                    raise
                return
        self._close_meta_file_locked()  # (the rename replaces the file: the kept one would be the old)
        replace_atomically(path, data, sync_dir=fsync and self._sync_meta_dir, ignore_fsync_error=True, fsync=fsync)

    def _close_meta_file_locked(self):
        """Close the metadata file kept open for the commits' writes (GroupSync's ``meta_lock`` held)."""
        kept, self._meta_file = self._meta_file, None
        if kept is not None:
            close_quietly(kept[0])

    def _close_meta_file(self):
        """:meth:`_close_meta_file_locked`, taking the lock (the file is about to go, or the queue to close)."""
        if self._gsync is None:
            return
        with self._gsync.meta_lock:
            self._close_meta_file_locked()

    def _persist_meta_data(self):
        self._gsync.write_meta(self._meta_fields(), True)
        self._done.rewrite(self._unacked.done_records())

    def empty(self):
        self._close_attempts_file()
        self._close_meta_file()
        if not self._exiting:
            self._gsync.forget_meta()
            self._done.drop()
            self._replayed_done = None
        super().empty()

    def close(self):
        self._close_attempts_file()
        super().close()
        self._close_meta_file()
        self._done.close()

    def _skip_done(self, msg_id, file_num, start, end):
        """get()'s hook after a restart: a record done before the crash is skipped (and stays in the
        log as done until the committed position passes it)."""
        replay = self._done.replay
        if replay.get((file_num, start)) != msg_id:
            return False
        del replay[(file_num, start)]
        if not replay:
            self._replayed_done = None
        self._unacked.add(msg_id, file_num, start, end)
        self._unacked.ack(msg_id)
        return True

    def _done_before_crash(self, file_num, start, msg_id):
        replay = self._done.replay
        return bool(replay) and replay.get((file_num, start)) == msg_id

    def _meta_fields(self):
        rf, rp = self.committed_position()
        return self._depth + len(self._unacked), rf, rp, self.write_file_num, self.write_pos

    def _wrote(self, position, rolled):
        self._gsync.wrote(position)
        if rolled:
            self._advance_commit()

    def _deferred_entry_lookup(self, entries):
        return entries.get  # kept until the committed position leaves the file

    def _after_get(self):
        self._unacked.advance()  # (records done before a crash, skipped at the head: passed at once)
        self._advance_commit()

    def _emptied(self):
        self._commit_file = self.read_file_num
        self._gsync.reset((self.write_file_num, self.write_pos))

    def _sync_before_close(self):
        self._gsync.close(self, flush=True)  # fsyncs what waiters may wait for (failure logged)

    def _deleted(self):
        self._close_attempts_file()
        self._gsync.close(self, flush=False)
        self._close_meta_file()
        self._done.close()

    def _fsync_failed(self, text):
        self._gsync.failed(text)

    def _synced(self, position):
        self._gsync.mark_synced(position)

    def _must_roll(self):
        return True  # even with the write file closed: unsynced writes are fsynced by name

    def _roll_write_file(self, new_num):
        self._gsync.roll(self._wfd, new_num)  # a failed fsync fails the put
        self._close_write_file()

    def _write_file_opened(self, fd, file_num):
        """Make the new file's directory entry durable, let waiters use the fd."""
        if self._dir_synced_num != file_num:
            fsync_dir(self.data_path)
            self._dir_synced_num = file_num
        self._gsync.attach(fd, file_num)

    def _close_write_file(self):
        if self._wfd is not None:
            self._gsync.detach()
        super()._close_write_file()

    def _write_failed(self, position):
        self._gsync.rollback(position)

    def _read_file_consumed(self, num):
        pass  # deleted once the committed position passes it

    def _set_aside_bad_file(self, num):
        self._bad_files.add(num)  # renamed once the committed position passes it

    def _first_live_file(self):
        return self._commit_file

    def _first_file_to_remove(self, emptying):
        if emptying:
            first = min(self.read_file_num, self._commit_file)
            self._unacked.clear()
            self._bad_files.clear()
            return first
        if self._unacked.last_file() == self.read_file_num:
            return self.read_file_num + 1  # it still holds unacked records
        return self.read_file_num

    # -- committed position ---------------------------------------------------------

    def _advance_commit(self):
        """Delete (or set aside as .bad) the data files the committed position has passed."""
        new = self.committed_position()[0]
        old = self._commit_file
        if new <= old:
            return
        self._sync_logged()  # the metadata moves past these files before they go
        for num in range(old, new):
            path = self.file_name(num)
            try:
                if num in self._bad_files:
                    self._bad_files.discard(num)
                    os.rename(path, path + ".bad")
                else:
                    os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                self.log.error("DISKQUEUE(%s) failed to remove/rename %s - %s", self.name, path, e)
        self._commit_file = new
        self._sidecar.prune(new)  # deferred due times of the files passed

    def _adopt_unknown_files(self):
        """Startup: never lose (or later overwrite) data files the metadata does not know."""
        pattern = re.compile(re.escape(self.name) + r"\.diskqueue\.([0-9]{6,})\.dat\Z")
        try:
            names = os.listdir(self.data_path or ".")
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to list %s - %s", self.name, self.data_path, e)
            return
        nums = sorted(int(m.group(1)) for m in map(pattern.match, names) if m)
        for num in nums:
            if num >= self.read_file_num:
                break
            # Consumed and acknowledged: left by a crash between the metadata update and the deletion.
            self.log.info("DISKQUEUE(%s) removing consumed data file %s", self.name, self.file_name(num))
            try:
                os.remove(self.file_name(num))
            except OSError as e:
                self.log.error("DISKQUEUE(%s) failed to Remove(%s) - %s", self.name, self.file_name(num), e)
        later = [n for n in nums if n > self.write_file_num]
        if later:
            self.log.warn(
                "DISKQUEUE(%s) data files %d..%d past the metadata's write file %d, adopting them",
                self.name,
                later[0],
                later[-1],
                self.write_file_num,
            )
            for num in later:
                path = self.file_name(num)
                try:
                    size = os.stat(path).st_size
                except OSError:
                    continue
                self._depth += self._count_records(path, 0, size)
            self.write_file_num = later[-1] + 1
            self.write_pos = 0
            self._need_sync = True
        if self.read_file_num < self.write_file_num and self.read_file_num not in nums:
            nxt = [n for n in nums if self.read_file_num < n < self.write_file_num]
            self.read_file_num = nxt[0] if nxt else self.write_file_num
            self.read_pos = 0
            self._need_sync = True
