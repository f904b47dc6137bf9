"""What durable mode remembers of the records it has handed out (see :mod:`.durable`).

:class:`Unacked`: every record ``get()`` handed out, until its message is
acknowledged; the oldest one not acknowledged is the committed read position.
:class:`DoneLog`: the acknowledgements the committed position cannot pass yet
(an older record is still in flight), kept in ``<name>.diskqueue.done.dat`` so
that a restart skips those records rather than deliver them again.

No locks: the owning queue's lock (its topic's or channel's) covers every call.
"""

import collections
import os
import struct

from .files import replace_atomically, write_all


class _Rec:
    __slots__ = ("msg_id", "file_num", "start", "end", "done")

    def __init__(self, msg_id, file_num, start, end):
        self.msg_id = msg_id
        self.file_num = file_num
        self.start = start
        self.end = end
        self.done = False


class Unacked:
    """Records handed out by ``get()`` and not yet acknowledged, oldest first.

    Acked records after the oldest unacked one stay in the log (they are read
    again after a crash) until everything before them is acked too.
    """

    __slots__ = ("_log", "_by_id")

    def __init__(self):
        self._log = collections.deque()
        self._by_id = {}  # msg id -> _Rec, or a deque of _Rec (oldest first) for a duplicated ID

    def __len__(self):
        return len(self._log)

    def add(self, msg_id, file_num, start, end):
        rec = _Rec(msg_id, file_num, start, end)
        self._log.append(rec)
        prev = self._by_id.get(msg_id)
        if prev is None:
            self._by_id[msg_id] = rec
        elif type(prev) is _Rec:
            self._by_id[msg_id] = collections.deque((prev, rec))
        else:
            prev.append(rec)

    def ack(self, msg_id):
        """Mark the oldest unacked record of ``msg_id`` done and return it; None if there is none."""
        entry = self._by_id.get(msg_id)
        if entry is None:
            return None
        if type(entry) is _Rec:
            del self._by_id[msg_id]
        else:
            rec = entry.popleft()
            if not entry:
                del self._by_id[msg_id]
            entry = rec
        entry.done = True
        return entry

    def done_records(self):
        """The done records still in the log (behind an unacked one), oldest first."""
        return [rec for rec in self._log if rec.done]

    def find(self, msg_id):
        """The oldest record of ``msg_id`` not yet acknowledged (None: none)."""
        entry = self._by_id.get(msg_id)
        if entry is None or type(entry) is _Rec:
            return entry
        return entry[0]

    def advance(self):
        """Drop the leading done records; returns how many."""
        log = self._log
        n = 0
        while log and log[0].done:
            log.popleft()
            n += 1
        return n

    def head(self):
        return self._log[0] if self._log else None

    def last_file(self):
        return self._log[-1].file_num if self._log else None

    def clear(self):
        self._log.clear()
        self._by_id.clear()


_DONE_ENTRY = struct.Struct(">QQ16s")  # a done log entry: file num, record start, message ID


class DoneLog:
    """The records acknowledged (FINed, moved to a dead-letter topic, dropped) while the committed read
    position had not passed them yet, in ``<name>.diskqueue.done.dat`` (Go nsqd never opens it): after a
    crash the reader skips them instead of delivering them again.

    The ack appends their entries (one ``write()``, no fsync: a SIGKILL keeps them, a power loss may
    not, and then they are delivered again).  Whenever a sync persists the metadata the file is
    rewritten with only the entries the committed position has not passed.  ``replay``: the entries
    loaded at startup that the reader has not reached yet.  No lock: the owner's lock covers it.
    """

    def __init__(self, path, name, log):
        self.path = path
        self.name = name
        self.log = log
        self.replay = {}  # (file num, start) -> message ID: done before the crash, not read yet
        self._fd = None  # append fd
        self._entries = 0  # entries the file holds (0: no file)

    def load(self, start, end):
        """Startup: keep the entries of records from position ``start`` up to ``end``."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to read %s - %s", self.name, self.path, e)
            return
        size = _DONE_ENTRY.size
        for offset in range(0, len(data) - size + 1, size):
            num, pos, msg_id = _DONE_ENTRY.unpack_from(data, offset)
            if start <= (num, pos) < end:
                self.replay[(num, pos)] = msg_id
        self._entries = max(1, len(data) // size)

    def append(self, recs):
        pack = _DONE_ENTRY.pack
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            write_all(self._fd, b"".join([pack(r.file_num, r.start, r.msg_id) for r in recs]))
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to write %s - %s", self.name, self.path, e)
            return
        self._entries += len(recs)

    def rewrite(self, recs):
        """Keep only ``recs``' entries and the replay's (the metadata now passes every other one)."""
        if not self._entries:
            return
        pack = _DONE_ENTRY.pack
        entries = [pack(r.file_num, r.start, r.msg_id) for r in recs]
        entries.extend(pack(num, pos, msg_id) for (num, pos), msg_id in self.replay.items())
        self.close()
        try:
            if entries:
                replace_atomically(self.path, b"".join(entries), fsync=False)
            else:
                os.remove(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to rewrite %s - %s", self.name, self.path, e)
            return
        self._entries = len(entries)

    def drop(self):
        """empty(): every entry goes."""
        self.close()
        self.replay.clear()
        self._entries = 0
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to remove %s - %s", self.name, self.path, e)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
