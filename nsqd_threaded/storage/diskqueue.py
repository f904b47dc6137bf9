"""The file backend: go-diskqueue v1.1.0's on-disk format, synchronously.

A data directory moves between Go nsqd and this broker in both directions:
file names, the record format and the metadata file are byte-identical to
go-diskqueue's (see ``shared/spec/diskqueue.md``)::

    <data>/<name>.diskqueue.meta.dat        "%d\\n%d,%d\\n%d,%d\\n"  depth, read file,pos, write file,pos
    <data>/<name>.diskqueue.000042.dat      records: int32 BE length N + N payload bytes
    <data>/<name>.diskqueue.000042.dat.bad  a data file set aside after a read error

Go runs an I/O goroutine per queue; here every method (except durable
mode's ``wait_synced``) is called with the owning topic's or channel's lock
held, which serializes them just as well, so the queue has neither a thread
nor a lock of its own.  The owner's periodic loop calls
:meth:`DiskQueue.maybe_sync` for the --sync-timeout flush.

Differences from go-diskqueue, all invisible in the files it reads:

* No read-ahead record: :meth:`get` parses records straight out of a large
  buffered read, and a batch :meth:`put` goes out in one ``write()`` per file.
* A put is all-or-nothing: on a write error nothing of the batch is counted
  (Go writes record by record and keeps the ones before the failure).
* The upstream spurious ``.bad`` bug (go-diskqueue#42) is fixed: a clean EOF
  at a record boundary of a complete file is an ordinary roll, and a reader
  that has caught up when the writer rolls moves on (deleting the file) at
  once, so the metadata never points at the end of a complete file.
* Crash recovery also counts the records found past the metadata's write
  position (Go leaves depth too low), follows a chain of such files, and
  also applies when the metadata file is missing (Go would overwrite).
* Deferred messages keep their due time across the disk (and a restart)
  through a sidecar file, ``<name>.diskqueue.deferred.dat``, which Go nsqd
  never opens: Go delivers such messages immediately (as it does for every
  message read back from disk), and the entries it has consumed are pruned
  when this broker opens the queue again.  See :class:`DiskQueue` and
  ``diskqueue_deferred``.
* Durable mode (``--durable``) is the subclass
  :class:`~nsqd_threaded.storage.durable.DurableDiskQueue`: records stay on
  disk until acknowledged and publishes can wait for a shared fsync.  It
  overrides the hooks of the section "hooks" below; this class knows nothing
  of it.
"""

import os
import time

from .backend import Backend, BackendError
from .deferred import SIDECAR_COMPACT_MIN, DeferredSidecar
from .files import replace_atomically, strerror
from .meta_file import format_meta
from . import records
from .queue_files import DiskQueueFiles
from .records import RECORD_LENGTH, read_records
from ..wire.message import RECORD_HEADER, RECORD_HEADER_SIZE, Message


class _NullLogger:
    def debug(self, fmt, *args):
        pass

    info = warn = error = debug


if hasattr(os, "pread"):

    def _pread(fd, size, offset):
        return os.pread(fd, size, offset)

else:  # pragma: no cover - Windows

    def _pread(fd, size, offset):
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, size)


class DiskQueue(DiskQueueFiles, Backend):
    """A go-diskqueue compatible queue of messages in ``data_path``.

    ``min_msg_size``/``max_msg_size`` bound the record payload (the message
    header, :data:`RECORD_HEADER_SIZE` bytes, + body), as nsqd passes them: the
    header's size and --max-msg-size + that.
    ``sync_timeout`` is in seconds.  ``clock`` reads the owner's time in Unix ns
    (a broker's :class:`~nsqd_threaded.internal.clock.Clock`, which a test may skip).

    Deferred messages: :meth:`put` stores a message whose ``deferred_ns`` is
    > 0 as due at ``clock() + deferred_ns`` (Unix ns, so it survives a
    restart), recorded in the sidecar file by record position and message ID
    (:class:`~nsqd_threaded.storage.deferred.DeferredSidecar`);
    :meth:`get` hands it back with ``deferred_ns`` set to the delay remaining
    then (0 if already due).  Every other message comes back with
    ``deferred_ns == 0``.  So an owner must keep ``deferred_ns`` at 0 for a
    message whose delay has been served, and set it to the remaining delay
    when it flushes its deferred index.

    A record :meth:`get` hands out is consumed: its file is deleted once read
    to the end.  (The durable subclass keeps it until acknowledged.)
    """

    #: fsync the directory when the metadata is renamed (durable: the rename must survive power loss).
    _sync_meta_dir = False

    def __init__(
        self,
        name,
        data_path,
        max_bytes_per_file,
        min_msg_size=RECORD_HEADER_SIZE,
        max_msg_size=1048576 + RECORD_HEADER_SIZE,
        sync_every=2500,
        sync_timeout=2.0,
        logger=None,
        clock=time.time_ns,
        fresh=False,
    ):
        """``fresh``: the caller knows that no file of this queue exists (see
        ``BrokerCore._queue_may_have_files``): none is looked for."""
        self.name = name
        self._now_ns = clock  # the owner's clock (Unix ns): deferred records' due times
        self.data_path = data_path
        self._meta_file_name = None
        self._file_prefix = os.path.join(data_path, "%s.diskqueue." % name)  # file_name() is on the hot path
        self.max_bytes_per_file = max_bytes_per_file
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size
        self.sync_every = sync_every
        self.sync_timeout = sync_timeout
        self.log = logger if logger is not None else _NullLogger()

        self._depth = 0
        self.read_file_num = 0
        self.read_pos = 0
        self.write_file_num = 0
        self.write_pos = 0

        self._count = 0  # writes + taken reads since the last sync
        self._need_sync = False
        self._last_sync = time.monotonic()
        self._exiting = False

        self._wfd = None  # write fd, positioned at write_pos
        self._rfd = None  # read fd of read_file_num
        self._rsize = None  # fstat size of the read file (complete files without a known size)
        self._rbuf = b""  # bytes of the read file starting at offset _rbuf_start
        self._rbuf_start = 0
        self._complete_sizes = {}  # file num -> size at the roll (files rolled by this process)

        # Deferred due times; SIDECAR_COMPACT_MIN is looked up here, when the queue opens.
        self._sidecar = DeferredSidecar(self.deferred_file_name, name, self.log, SIDECAR_COMPACT_MIN,
                                        clock)

        self._fresh = fresh
        if not fresh:
            self._retrieve_meta_data()
            self._recover_write_file()
        self._recovered()
        if not fresh:
            self._sidecar.load((self.read_file_num, self.read_pos), (self.write_file_num, self.write_pos))

    def __repr__(self):
        return "DiskQueue(%r)" % self.name

    # -- names ---------------------------------------------------------------

    def file_name(self, file_num):
        return "%s%06d.dat" % (self._file_prefix, file_num)

    @property
    def meta_file_name(self):
        path = self._meta_file_name
        if path is None:  # (made once: a durable queue writes it with every group commit)
            path = self._meta_file_name = os.path.join(self.data_path, "%s.diskqueue.meta.dat" % self.name)
        return path

    @property
    def deferred_file_name(self):
        return os.path.join(self.data_path, "%s.diskqueue.deferred.dat" % self.name)

    # -- Backend interface ----------------------------------------------------

    def depth(self):
        """Records written and not yet taken.

        Like Go's, the stored depth is eventually consistent (wrong after a
        .bad file or stale metadata until the reader reaches the tail); it is
        reported as at least 1 while unread data exists so an owner that asks
        ``depth()`` before ``get()`` never stalls on such a queue.
        """
        d = self._depth
        if d > 0 or self._exiting:
            return d
        if self.read_file_num < self.write_file_num or self.read_pos < self.write_pos:
            return 1
        return d

    def positions_of(self, records):
        """Where :meth:`put` would write these records (bytes) now: ``[(file num, pos)]`` of each
        record's start (its length field), rolling to a new file as put does.  Call under the owner's
        lock, right before the put."""
        max_bytes = self.max_bytes_per_file
        fnum, pos = self.write_file_num, self.write_pos
        out = []
        for record in records:
            n = len(record)
            if pos > 0 and pos + 4 + n > max_bytes:
                fnum += 1
                pos = 0
            out.append((fnum, pos))
            pos += 4 + n
        return out

    def put(self, msgs):
        if self._exiting:
            raise BackendError("exiting")
        if not msgs:
            return
        pack = RECORD_LENGTH.pack
        lo, hi, max_bytes = self.min_msg_size, self.max_msg_size, self.max_bytes_per_file
        start_file, start_pos = self.write_file_num, self.write_pos
        fnum, pos = start_file, start_pos
        segments = []  # [file num, start pos, parts]
        parts = []
        seg_start = pos
        deferred = None
        for msg in msgs:
            # A record (bytes) is written as it is: it is already the payload.
            record = type(msg) is bytes
            payload = msg if record else msg.encode()
            n = len(payload)
            if n < lo or n > hi:
                raise BackendError("invalid message write size (%d) minMsgSize=%d maxMsgSize=%d" % (n, lo, hi))
            if pos > 0 and pos + 4 + n > max_bytes:
                if parts:
                    segments.append((fnum, seg_start, parts))
                    parts = []
                fnum += 1
                pos = seg_start = 0
            if not record and msg.deferred_ns > 0:
                if deferred is None:
                    deferred = []
                deferred.append((fnum, pos, msg))
            parts.append(pack(n))
            parts.append(payload)
            pos += 4 + n
        segments.append((fnum, seg_start, parts))

        self._write_segments(start_file, start_pos, segments)

        # Committed: every file before the last one is complete.
        rolled = fnum != start_file
        if rolled:
            for num, seg_pos, seg_parts in segments[:-1]:
                self._complete_sizes[num] = seg_pos + sum(len(p) for p in seg_parts)
            if start_file not in self._complete_sizes:  # rolled before writing anything to it
                self._complete_sizes[start_file] = start_pos
        self.write_file_num = fnum
        self.write_pos = pos
        self._depth += len(msgs)
        self._count += len(msgs)
        if deferred:
            self._sidecar.add(deferred)
        if rolled:
            # A reader that had consumed everything of the old write file
            # moves on now (go-diskqueue#42 would later call that EOF corrupt).
            if self.read_file_num == start_file and self.read_pos >= self._complete_sizes[start_file]:
                self._finish_read_file()
            self._need_sync = True
        self._wrote((fnum, pos), rolled)
        if self._need_sync or self._count >= self.sync_every:
            self._sync_logged()

    def get(self, n, records=False):
        """Take up to ``n`` records, oldest first, as Messages.

        ``records``: a message with no delay still to wait is returned as its
        record (bytes), one slice of the read buffer instead of a Message (see
        :mod:`nsqd_threaded.wire.message`); a backend that remembers what it
        hands out (durable) returns Messages regardless.

        Each pass of the loop reads one buffer's worth: where the read file
        may be read to (:meth:`_read_limit`: rolls and read errors), the
        records in the buffer (:meth:`_slice_records`, then
        :meth:`_parse_records`), then the next buffer (:meth:`_refill`).
        """
        out = []
        if self._exiting or n <= 0:
            return out
        if self._handed_out is None and self._replayed_done is None and not self._sidecar.entries:
            if self._get_buffered(n, records, out) == n:
                return out
        took = 0  # records consumed (handed out or skipped), not yet counted
        records = records and self._handed_out is None
        while len(out) < n:
            limit = self._read_limit()
            if limit is None:
                break
            buf = self._rbuf
            base = self._rbuf_start
            p = self.read_pos - base
            if p < 0 or p > len(buf):
                buf, base, p = b"", self.read_pos, 0
            if records and not self._sidecar.entries:
                p, got = self._slice_records(buf, p, n - len(out), out)
                took += got
            p, got, need, error = self._parse_records(buf, base, p, n, out, records)
            took += got
            self.read_pos = base + p
            if error is None and len(out) < n:
                buf, base, error = self._refill(buf, base, limit, need)
            elif p >= len(buf):
                buf, base = b"", self.read_pos
            self._rbuf, self._rbuf_start = buf, base
            if error is not None:
                self._count_taken(took)  # (before the error handling looks at the depth)
                took = 0
                self._handle_read_error(error)
                continue
            if self.read_file_num < self.write_file_num and self.read_pos == limit:
                self._finish_read_file()
        self._count_taken(took)
        self._check_tail_corruption()
        self._after_get()
        if self._need_sync or (took and self._count >= self.sync_every):
            self._sync_logged()
        return out

    def _get_buffered(self, n, records, out):
        """get()'s common case, alone: the next records are whole in the read buffer, none of
        them deferred, and nothing hooked (not durable, no replay).  Appends up to ``n`` to
        ``out`` and answers how many; 0 (nothing consumed) sends get() the general way.

        (A consumer at RDY 1 takes one message per FIN: this is its cost per message.)
        """
        rf = self.read_file_num
        read_pos = self.read_pos
        if rf == self.write_file_num:
            limit = self.write_pos
        else:
            limit = self._complete_sizes.get(rf)
            if limit is None or self._rfd is None:
                return 0
        buf = self._rbuf
        p = read_pos - self._rbuf_start
        if p < 0:
            return 0
        avail = min(len(buf), limit - self._rbuf_start)
        lo = max(self.min_msg_size, RECORD_HEADER_SIZE)
        hi = self.max_msg_size
        unpack_len = RECORD_LENGTH.unpack_from
        unpack_header = RECORD_HEADER.unpack_from
        got = 0
        while got < n and p + 4 <= avail:
            size = unpack_len(buf, p)[0]
            end = p + 4 + size
            if size < lo or size > hi or end > avail:
                break  # (a bad record, or one not yet read: the general way reports or reads it)
            if records:
                out.append(buf[p + 4 : end])
            else:
                ts, attempts, msg_id = unpack_header(buf, p + 4)
                out.append(Message(msg_id, buf[p + 4 + RECORD_HEADER_SIZE : end], ts, attempts))
            p = end
            got += 1
        if not got:
            return 0
        self.read_pos = read_pos = self._rbuf_start + p
        self._count_taken(got)
        if read_pos == limit:
            if rf < self.write_file_num:
                self._finish_read_file()
            else:
                self._check_tail_corruption()
        if self._need_sync or self._count >= self.sync_every:
            self._sync_logged()
        return got

    def _read_limit(self):
        """The position the read file may be read up to; None when nothing is left to read.

        Rolls on the way: a complete file read to its end is finished (a
        clean EOF at a record boundary is a roll, not corruption), and a
        reader past a file's end, or a file that does not open, is a read
        error (the file is set aside and the next one read).
        """
        while True:
            rf, wf = self.read_file_num, self.write_file_num
            if rf == wf:
                limit = self.write_pos
                if self.read_pos >= limit:
                    return None  # caught up
            elif rf < wf:
                if self._rfd is None and not self._open_read_file():
                    continue
                limit = self._complete_sizes.get(rf)
                if limit is None:
                    limit = self._read_file_size()
                if self.read_pos == limit:
                    self._finish_read_file()
                    continue
                if self.read_pos > limit:
                    self._handle_read_error("EOF")
                    continue
            else:
                return None  # read file past the write file: the tail check skips ahead
            if self._rfd is None and not self._open_read_file():
                continue
            return limit

    def _slice_records(self, buf, p, wanted, out):
        """The fast scan, for records without a deferral: each one slice of ``buf`` from ``p``.

        Appends up to ``wanted`` records to ``out``; returns ``(p, count)``.
        Anything else (the end of the buffer, a bad or short record) stops it,
        and :meth:`_parse_records` takes that record.
        """
        unpack_len = RECORD_LENGTH.unpack_from
        append = out.append
        floor = max(self.min_msg_size, RECORD_HEADER_SIZE)
        hi = self.max_msg_size
        avail = len(buf)
        got = 0
        while got < wanted and p + 4 <= avail:
            size = unpack_len(buf, p)[0]
            end = p + 4 + size
            if size < floor or size > hi or end > avail:
                break
            append(buf[p + 4 : end])
            p = end
            got += 1
        return p, got

    def _parse_records(self, buf, base, p, n, out, records):
        """The general parse of ``buf`` (read file offset ``base``) from ``p``, until ``out`` holds ``n``.

        A record is handed out as bytes (``records``, and no deferral) or as
        a Message (its remaining delay from the sidecar); one too short for
        the message header is skipped (logged).  Returns ``(p, count, need,
        error)``: the records consumed, the bytes the next record needs when
        the buffer ran out, and the read error (a bad length) that stopped it.
        """
        rf = self.read_file_num
        dmap = self._sidecar.entries
        dtake = self._deferred_entry_lookup(dmap)
        handed_out = self._handed_out  # None, or called with each record handed out
        done = self._replayed_done  # None, or True for a record to skip (see the hook)
        unpack_header = RECORD_HEADER.unpack_from
        lo, hi = self.min_msg_size, self.max_msg_size
        avail = len(buf)
        took = 0
        need = 4
        now = None
        while len(out) < n:
            if p + 4 > avail:
                need = 4
                break
            size = RECORD_LENGTH.unpack_from(buf, p)[0]
            if size < lo or size > hi:
                return p, took, need, "invalid message read size (%d)" % size
            end = p + 4 + size
            if end > avail:
                need = 4 + size
                break
            if size >= RECORD_HEADER_SIZE and records and (not dmap or (rf, base + p) not in dmap):
                out.append(buf[p + 4 : end])
            elif size >= RECORD_HEADER_SIZE:
                ts, attempts, msg_id = unpack_header(buf, p + 4)
                if done is not None and done(msg_id, rf, base + p, base + end):
                    took += 1
                    p = end
                    continue
                msg = Message(msg_id, buf[p + 4 + RECORD_HEADER_SIZE : end], ts, attempts)
                if dmap:
                    entry = dtake((rf, base + p), None)
                    if entry is not None and entry[0] == msg_id:
                        if now is None:
                            now = self._now_ns()
                        if entry[1] > now:
                            msg.deferred_ns = entry[1] - now
                out.append(msg)
                if handed_out is not None:
                    handed_out(msg_id, rf, base + p, base + end)
            else:
                self.log.error(
                    "DISKQUEUE(%s) skipping undecodable record (%d bytes) at %d of %s",
                    self.name,
                    size,
                    base + p,
                    self.file_name(rf),
                )
            took += 1
            p = end
        return p, took, need, None

    def _refill(self, buf, base, limit, need):
        """The next buffer, read from ``read_pos`` (at least ``need`` bytes, at most up to ``limit``).

        Returns ``(buf, base, error)``: the old buffer kept on an error (a
        record running past the end of the file, a short or failed read).
        """
        want = min(max(records.READ_CHUNK, need), limit - self.read_pos)
        if want <= 0:
            return b"", self.read_pos, None
        if want < need:
            return buf, base, "unexpected EOF"  # the record runs past the end of the file
        try:
            data = _pread(self._rfd, want, self.read_pos)
        except OSError as e:
            return buf, base, strerror(e)
        if len(data) < need:
            return buf, base, "EOF" if not data else "unexpected EOF"
        return data, self.read_pos, None

    def peek(self, n=None):
        """Backend.peek: the records from the read position on, read from the files with
        a descriptor of its own (the reader's position, buffer and descriptor are left
        alone).  A record whose sidecar entry is still due later is deferred.

        Stops at the first record it cannot parse (:meth:`get` would set that file
        aside).  Called with the owner's lock held, so no file goes away meanwhile.
        """
        queued, deferred = [], []
        if self._exiting:
            return queued, deferred
        dmap = self._sidecar.entries
        now = time.time_ns()
        start = (self.read_file_num, self.read_pos)
        seen = set()
        for num in range(self.read_file_num, self.write_file_num + 1):
            if n is not None and len(queued) >= n:
                break
            pos = self.read_pos if num == self.read_file_num else 0
            end = self.write_pos if num == self.write_file_num else self._complete_sizes.get(num)
            for pos, msg in self._stored_records(num, pos, end):
                if self._done_before_crash(num, pos, msg.id):
                    continue  # (get() skips it)
                entry = dmap.get((num, pos))
                if entry is not None and entry[0] == msg.id and entry[1] > now:
                    deferred.append((msg, entry[1]))
                    seen.add((num, pos))
                elif n is None or len(queued) < n:
                    queued.append(msg)
                else:
                    break
        for (num, pos), (msg_id, due) in sorted(dmap.items()):
            if (num, pos) >= start and due > now and (num, pos) not in seen:
                for _, msg in self._stored_records(num, pos, None, 1):
                    if msg.id == msg_id:
                        deferred.append((msg, due))
        return queued, deferred

    def stored_ids(self):
        """The message IDs of the records from the read position on, in the order :meth:`get` hands
        them out (file order), read with a descriptor of their own (owner's lock held)."""
        for num in range(self.read_file_num, self.write_file_num + 1):
            pos = self.read_pos if num == self.read_file_num else 0
            end = self.write_pos if num == self.write_file_num else self._complete_sizes.get(num)
            for start, msg in self._stored_records(num, pos, end):
                if not self._done_before_crash(num, start, msg.id):  # (get() skips it)
                    yield msg.id

    def last_record_id(self):
        """The message ID of the last record written, read or not (None: no data file holds one:
        nothing written, or the file that held it was consumed and removed).  Owner's lock held."""
        for num in (self.write_file_num, self.write_file_num - 1):
            end = self.write_pos if num == self.write_file_num else self._complete_sizes.get(num)
            if num < 0 or end == 0 or not os.path.exists(self.file_name(num)):
                continue
            last = None
            for _, msg in self._stored_records(num, 0, end):
                last = msg.id
            if last is not None:
                return last
        return None

    def _stored_records(self, num, pos, end, count=None):
        """peek's reading of file ``num`` (:func:`~.records.read_records`); a failure is logged."""
        try:
            yield from read_records(self.file_name(num), pos, end, max(self.min_msg_size, RECORD_HEADER_SIZE),
                                    self.max_msg_size, count)
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to read %s for a peek - %s", self.name, self.file_name(num), e)

    def _count_taken(self, took):
        """``took`` records left the queue: out of the depth, into the operations to sync."""
        self._depth -= took
        self._count += took

    def empty(self):
        if self._exiting:
            raise BackendError("exiting")
        self.log.info("DISKQUEUE(%s): emptying", self.name)
        self._skip_to_next_rw_file(emptying=True)
        self._emptied()
        try:
            os.remove(self.meta_file_name)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to remove metadata file - %s", self.name, e)
        self._sidecar.drop()
        self._count = 0
        self._need_sync = False

    def close(self):
        """Close the files, then sync: fsync the write file and persist the metadata."""
        if self._exiting:
            return
        self.log.info("DISKQUEUE(%s): closing", self.name)
        self._exiting = True
        self._close_read_file()
        self._sync_before_close()
        self._close_write_file()
        self._sidecar.compact()
        self._sidecar.close(sync=True)
        try:
            self._persist_meta_data()
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to sync - %s", self.name, e)
        self._count = 0
        self._need_sync = False

    def delete(self):
        """Close the files without syncing and without deleting anything (call empty() first)."""
        if self._exiting:
            return
        self.log.info("DISKQUEUE(%s): deleting", self.name)
        self._exiting = True
        self._close_read_file()
        self._close_write_file()
        self._sidecar.close(sync=False)
        self._deleted()

    # -- sync policy ----------------------------------------------------------

    def sync(self):
        """fsync the write file and persist the metadata; False (logged) on failure."""
        return self._sync_logged()

    def maybe_sync(self, now=None):
        """The --sync-timeout flush: sync if anything changed and ``sync_timeout``
        (seconds of ``time.monotonic()``) has passed since the last sync.
        For the owner's periodic loop; returns True if it synced."""
        if self._exiting or (self._count == 0 and not self._need_sync):
            return False
        if now is None:
            now = time.monotonic()
        if now - self._last_sync < self.sync_timeout:
            return False
        self._sync_logged()
        return True

    sync_if_idle_due = maybe_sync

    def describe(self):
        """Backend.describe: where the reader and the writer are, and what is not fsynced yet."""
        return {
            "kind": type(self).__name__,
            "name": self.name,
            "depth": self._depth,
            "read_file_num": self.read_file_num,
            "read_pos": self.read_pos,
            "write_file_num": self.write_file_num,
            "write_pos": self.write_pos,
            "ops_since_sync": self._count,  # writes and taken reads since the last fsync
            "need_sync": self._need_sync,
            "max_bytes_per_file": self.max_bytes_per_file,
        }

    def needs_sync(self):
        """True while writes or reads since the last sync await the periodic flush."""
        return not self._exiting and (self._count > 0 or self._need_sync)

    def _sync_logged(self):
        ok = True
        try:
            self._sync()
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to sync - %s", self.name, e)
            ok = False
        self._count = 0
        self._last_sync = time.monotonic()
        return ok

    def _sync(self):
        if self._exiting:
            return
        if self._wfd is not None:
            try:
                os.fsync(self._wfd)
            except OSError as e:
                self._fsync_failed("fsync %s: %s" % (self.file_name(self.write_file_num), strerror(e)))
                self._close_write_file()
                raise
            self._synced((self.write_file_num, self.write_pos))
        self._sidecar.sync()
        self._persist_meta_data()
        self._need_sync = False

    def _persist_meta_data(self):
        replace_atomically(
            self.meta_file_name,
            format_meta(*self._meta_fields()),
            sync_dir=self._sync_meta_dir,
            ignore_fsync_error=True,  # as go-diskqueue
        )

    def _meta_fields(self):
        """What the metadata file records: depth, read file, read pos, write file, write pos."""
        return self._depth, self.read_file_num, self.read_pos, self.write_file_num, self.write_pos

    # -- hooks (no-ops here; overridden by the durable subclass) -------------------

    def _recovered(self):
        """The metadata is read and the write file recovered; the sidecar loads next."""

    def _wrote(self, position, rolled):
        """A put committed everything up to ``position``; ``rolled``: it started a new file."""

    def _deferred_entry_lookup(self, entries):
        """How get() looks up a record's deferred entry: here it is consumed with the record."""
        return entries.pop

    #: Called by get() as ``(msg id, file num, start, end)`` for each record handed out, or None.
    _handed_out = None

    #: Called by get() as ``(msg id, file num, start, end)`` for each record before it is handed out, or
    #: None: True skips the record (taken, not handed out: durable mode's records done before a crash).
    _replayed_done = None

    def _done_before_crash(self, file_num, start, msg_id):
        """Is the record at ``start`` of file ``file_num`` one that get() will skip (see ``_replayed_done``)?"""
        return False

    def _after_get(self):
        """A get() finished (positions moved)."""

    def _emptied(self):
        """empty() removed every file."""

    def _sync_before_close(self):
        """close(): make the write file durable before it is closed (failure logged)."""
        self._fsync_logged()

    def _deleted(self):
        """delete() closed the files."""

    def _fsync_failed(self, text):
        """An fsync of the write file failed (raised after this)."""

    def _synced(self, position):
        """Everything up to ``position`` is fsynced."""

    def _must_roll(self):
        """A put moves on to a new file: must the finished one go through _roll_write_file?"""
        return self._wfd is not None

    def _write_file_opened(self, fd, file_num):
        """A write file was opened (or created)."""

    def _write_failed(self, position):
        """A failed put truncated the stream back to ``position``."""

    def _read_file_consumed(self, num):
        """The reader left file ``num`` at its end: delete it."""
        path = self.file_name(num)
        try:
            os.remove(path)
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to Remove(%s) - %s", self.name, path, e)

    def _set_aside_bad_file(self, num):
        """File ``num`` could not be read: rename it to ``.bad``."""
        bad = self.file_name(num)
        try:
            os.rename(bad, bad + ".bad")
        except OSError:
            self.log.error(
                "DISKQUEUE(%s) failed to rename bad diskqueue file %s to %s", self.name, bad, bad + ".bad"
            )

    def _first_live_file(self):
        """Data files below this one are gone (or going): their deferred entries are dropped."""
        return self.read_file_num

    def _first_file_to_remove(self, emptying):
        """First data file a reset to a new file (or ``emptying``) deletes."""
        return self.read_file_num

    # -- startup ------------------------------------------------------------
