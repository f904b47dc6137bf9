"""The deferred-message sidecar of the file diskqueue (beyond go-diskqueue).

A go-diskqueue record has no room for a deferral, so
:class:`~nsqd_threaded.storage.diskqueue.DiskQueue` keeps the due times of its
deferred records next to the queue, in ``<name>.diskqueue.deferred.dat``,
one line per deferred record::

    <file num> <pos> <hex message id> <due unix ns>\\n

Positions are those of the record in the data files; the due time is
absolute (Unix ns) so it survives a restart.  The file's life:

* **Written**: a line is appended (one ``write()`` per batch) when
  ``put`` writes a deferred record.  A failed append is logged only: the
  message is stored, just its delay would not survive a restart.
* **Fsynced**: not on append, but with the data file, whenever the queue
  syncs (``--sync-every``, ``--sync-timeout``, a roll) and at ``close()``.
* **Pruned**: on open, lines outside [read position, write position) are
  ignored; when the reader (durable mode: the committed read position)
  leaves a data file, that file's entries are forgotten.  A line whose
  message ID differs from the record's is never applied.
* **Compacted**: when the stale lines outnumber ``max(live entries,
  SIDECAR_COMPACT_MIN)`` the file is rewritten from the live entries
  (temp file, fsync, rename).  It is removed when no entry is live, by
  ``empty()``, and when a corrupt queue is reset to a new file.

Go nsqd never reads (nor writes, nor deletes) this file: it delivers every
message it reads back from disk immediately, deferred or not.  The lines of
records it consumed meanwhile are pruned when this broker opens the queue
again; a record it wrote at a position a stale line names carries another
message ID, so the line is ignored.

Locking: :class:`DeferredSidecar` has no lock of its own; DiskQueue calls
it only with the owner's (topic's or channel's) lock held, which serializes
every call.
"""

import os
import time

from .files import remove_quietly, temp_name, write_all

SIDECAR_COMPACT_MIN = 1024  # stale sidecar lines tolerated before a rewrite


class DeferredSidecar:
    """Due times of a DiskQueue's deferred records, kept in the sidecar file ``path``.

    ``entries`` maps ``(file num, pos)`` to ``(msg id, due unix ns)``;
    DiskQueue's ``get`` looks records up in it directly (and, outside
    durable mode, pops them).  ``name`` and ``log`` are the queue's, for
    log lines.  ``compact_min``: see ``SIDECAR_COMPACT_MIN``.  ``clock``: the queue's
    owner's time in Unix ns (due times are written from it).
    """

    def __init__(self, path, name, log, compact_min=SIDECAR_COMPACT_MIN, clock=time.time_ns):
        self.path = path
        self._now_ns = clock  # the queue owner's clock (Unix ns)
        self.name = name
        self.log = log
        self.compact_min = compact_min
        self.entries = {}  # (file num, pos) -> (msg id, due unix ns); cleared in place, never replaced
        self._fd = None  # append fd
        self._lines = 0  # lines in the file

    def in_use(self):
        """True while entries are known or the file may hold lines."""
        return bool(self._lines or self.entries)

    def add(self, records):
        """Record ``(file num, pos, msg)`` of deferred records just written; appends their lines."""
        now = self._now_ns()
        self.add_due([(fnum, pos, msg.id, now + msg.deferred_ns) for fnum, pos, msg in records])

    def add_due(self, records):
        """Record ``(file num, pos, msg id, due unix ns)``: records written earlier or just now (a
        later line for the same record replaces an earlier one); appends their lines."""
        lines = []
        for fnum, pos, msg_id, due in records:
            self.entries[(fnum, pos)] = (msg_id, due)
            lines.append(b"%d %d %s %d\n" % (fnum, pos, msg_id.hex().encode(), due))
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            write_all(self._fd, b"".join(lines))
            self._lines += len(lines)
        except OSError as e:
            # The messages are stored; only their delay would not survive a restart.
            self.log.error("DISKQUEUE(%s) failed to write %s - %s", self.name, self.path, e)

    def load(self, lo, hi):
        """Open: read the file, keeping the entries with ``lo <= (file num, pos) < hi``."""
        path = self.path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to read %s - %s", self.name, path, e)
            return
        lines = data.split(b"\n")
        for line in lines:
            parts = line.split()
            if len(parts) != 4:
                continue
            try:
                key = (int(parts[0]), int(parts[1]))
                entry = (bytes.fromhex(parts[2].decode("ascii")), int(parts[3]))
            except ValueError:
                continue
            if lo <= key < hi:
                self.entries[key] = entry
        self._lines = sum(1 for line in lines if line)
        self.compact()

    def prune(self, first_file):
        """Forget the entries of files before ``first_file`` (files the reader has left)."""
        if not self.in_use():
            return
        stale = [key for key in self.entries if key[0] < first_file]
        for key in stale:
            del self.entries[key]
        self.compact()

    def compact(self):
        """Remove the file when no entry is live, rewrite it when mostly stale."""
        live = len(self.entries)
        if live == 0:
            if self._lines or self._fd is not None:
                self.drop()
            return
        if self._lines - live <= max(live, self.compact_min):
            return
        path = self.path
        tmp = temp_name(path)
        data = b"".join(
            b"%d %d %s %d\n" % (k[0], k[1], v[0].hex().encode(), v[1]) for k, v in sorted(self.entries.items())
        )
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            self.close(sync=False)
            os.replace(tmp, path)
            self._lines = live
        except OSError as e:
            remove_quietly(tmp)
            self.log.error("DISKQUEUE(%s) failed to rewrite %s - %s", self.name, path, e)

    def drop(self):
        """Forget every entry and remove the file."""
        self.entries.clear()
        self.close(sync=False)
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to remove %s - %s", self.name, self.path, e)
        self._lines = 0

    def sync(self):
        """fsync the appended lines (failure logged only)."""
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as e:
                self.log.error("DISKQUEUE(%s) failed to sync deferred file - %s", self.name, e)

    def close(self, sync):
        """Close the append fd (fsyncing it first if ``sync``, failure ignored)."""
        if self._fd is not None:
            if sync:
                try:
                    os.fsync(self._fd)
                except OSError:
                    pass
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
