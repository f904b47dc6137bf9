"""In-flight and deferred indexes: messages by ID and by deadline.

Go nsqd keeps a map plus a hand-written heap for each.  Here one class serves
both: a dict for O(1) lookup by ID, and a ``sortedcontainers.SortedList`` of
deadline entries with lazy deletion.  The deadline lives in ``Message.expiry_ns`` (expiry when in flight,
due time when deferred; a message is never both in one channel).

Why lazy deletion: nearly every in-flight message leaves by FIN long before
its deadline, so removal must be cheap.  A removal only drops the dict entry
(O(1)); its entry stays until it comes due in :meth:`pop_due` and is seen to
be stale (the ID is gone, or its message's deadline has changed), or until the
entries reference too many stale messages and are compacted: the stale entries
dropped, or all rebuilt from the dict, whichever costs less (amortized O(1) per
removal).  A delivery batch shares one deadline, so it
takes one entry, not one per message.

Why two sequences of entries: deadlines are nearly always added in order (a
channel's consumers mostly share one message timeout, and time moves forward),
so an entry not earlier than the last one is appended to a deque (``_tail``, in
order by construction: a C-level append); only one that is earlier (a shorter
timeout, a TOUCH's or REQ's deadline behind it) goes to the ``SortedList``.
Both are read in deadline order, merged.

Not thread-safe: the owning Channel's lock guards every call.
"""

import heapq
import itertools
from collections import deque
from itertools import repeat

from sortedcontainers import SortedList


class TimedIndex:
    __slots__ = ("_by_id", "_entries", "_tail", "_referenced", "_seq")

    def __init__(self):
        self._by_id = {}
        # (deadline_ns, sequence, [msg, ...]): one entry per batch added together.  The
        # sequence is unique, so lists are never compared.  Entries added in deadline
        # order are appended to _tail; any other goes to _entries (see the module's docstring).
        self._entries = SortedList()
        self._tail = deque()
        self._referenced = 0  # messages referenced by the entries, stale ones included
        self._seq = itertools.count()

    def __len__(self):
        return len(self._by_id)

    def __contains__(self, msg_id):
        return msg_id in self._by_id

    def get(self, msg_id):
        return self._by_id.get(msg_id)

    def _push(self, deadline_ns, msgs):
        tail = self._tail
        if not tail or deadline_ns >= tail[-1][0]:
            tail.append((deadline_ns, next(self._seq), msgs))
        else:
            self._entries.add((deadline_ns, next(self._seq), msgs))
        self._referenced += len(msgs)
        if self._referenced > 2 * len(self._by_id) + 1024:
            self._compact()

    def _compact(self):
        """Drop the stale references, whichever way costs less: keep the entries that still
        hold a live message, or rebuild them from the live messages.

        Keeping costs a look at each entry, rebuilding a regrouping and a sort of the live
        messages, several times a look.  Thousands of consumers at RDY 1 make an entry of each
        delivery and finish them in about the order they came: nearly every entry is then one
        stale message, and a look at each is the cheaper (the rebuild of thousands in flight,
        every few thousand deliveries, was a sizeable part of each delivery's cost).  Entries
        still referencing too many (large batches partly finished) are rebuilt after all.
        """
        by_id = self._by_id
        if len(self._tail) + len(self._entries) > 4 * len(by_id):
            self._rebuild()
            return
        referenced = 0
        kept = []
        for entries in (self._entries, self._tail):
            live = []
            for entry in entries:
                deadline, _, msgs = entry
                for msg in msgs:
                    if msg.expiry_ns == deadline and by_id.get(msg.id) is msg:
                        live.append(entry)
                        referenced += len(msgs)
                        break
            kept.append(live)
        if referenced > 2 * len(by_id) + 512:
            self._rebuild()
            return
        self._entries = SortedList(kept[0])
        self._tail = deque(kept[1])
        self._referenced = referenced

    def _rebuild(self):
        """Drop the stale references: one entry per live deadline."""
        by_deadline = {}
        for msg in self._by_id.values():
            by_deadline.setdefault(msg.expiry_ns, []).append(msg)
        seq = self._seq
        self._entries = SortedList((deadline, next(seq), msgs) for deadline, msgs in by_deadline.items())
        self._tail.clear()
        self._referenced = len(self._by_id)

    def add(self, msg, deadline_ns):
        """Index ``msg`` due at ``deadline_ns``; False if its ID is already here."""
        if msg.id in self._by_id:
            return False
        msg.expiry_ns = deadline_ns
        self._by_id[msg.id] = msg
        self._push(deadline_ns, [msg])
        return True

    def add_many(self, msgs, deadline_ns):
        """Index a batch due at one deadline (a delivery batch); returns those added."""
        by_id = self._by_id
        added = []
        for msg in msgs:
            if msg.id in by_id:
                continue  # nsqd silently keeps the first of a duplicate ID
            msg.expiry_ns = deadline_ns
            by_id[msg.id] = msg
            added.append(msg)
        if added:  # (_push, inline: once per delivery)
            tail = self._tail
            if not tail or deadline_ns >= tail[-1][0]:
                tail.append((deadline_ns, next(self._seq), added))
            else:
                self._entries.add((deadline_ns, next(self._seq), added))
            self._referenced += len(added)
            if self._referenced > 2 * len(by_id) + 1024:
                self._compact()
        return added

    def remove(self, msg_id):
        """Remove and return the message with this ID, or None (its entry goes stale)."""
        return self._by_id.pop(msg_id, None)

    def pop_owned(self, msg_id, owner):
        """Remove and return the message with this ID if its ``client_id`` is ``owner``; None
        otherwise (another client's stays in place): :meth:`remove_owned` of one ID."""
        msg = self._by_id.pop(msg_id, None)
        if msg is not None and msg.client_id != owner:
            self._by_id[msg_id] = msg
            return None
        return msg

    def remove_owned(self, msg_ids, owner):
        """Remove the messages with these IDs whose ``client_id`` is ``owner`` (a run of FINs).

        Returns ``(removed, refused)``: the removed messages, and ``(id, message)`` for
        each other ID in order, the message being None when the ID is not here and
        another client's otherwise (left in place).
        """
        by_id = self._by_id
        # Nearly always every ID is here and the owner's (a consumer FINs what it was
        # sent): one C-level pass pops them all, and a loop checks what it got.
        removed = list(map(by_id.pop, msg_ids, repeat(None)))
        for msg in removed:
            if msg is None or msg.client_id != owner:
                break
        else:
            return removed, []
        # Otherwise put back what was popped and go ID by ID, as nsqd answers each FIN.
        for msg_id, msg in zip(msg_ids, removed):
            if msg is not None:
                by_id[msg_id] = msg
        get = by_id.get
        removed = []
        refused = []
        for msg_id in msg_ids:
            msg = get(msg_id)
            if msg is not None and msg.client_id == owner:
                del by_id[msg_id]
                removed.append(msg)
            else:
                refused.append((msg_id, msg))
        return removed, refused

    def reschedule(self, msg, deadline_ns):
        msg.expiry_ns = deadline_ns  # the old entry no longer matches: stale
        self._push(deadline_ns, [msg])

    def pop_due(self, now_ns):
        """Remove and return every message whose deadline is <= now_ns, earliest first
        (equal deadlines in ID order)."""
        due = []
        entries = self._entries
        if entries and entries[0][0] <= now_ns:
            cut = entries.bisect_left((now_ns + 1,))  # every entry due by now_ns comes before
            due.extend(entries.islice(0, cut))
            del entries[:cut]
        tail = self._tail
        while tail and tail[0][0] <= now_ns:
            due.append(tail.popleft())
        if not due:
            return []
        by_id = self._by_id
        out = []
        for deadline, _, msgs in due:
            self._referenced -= len(msgs)
            for msg in msgs:
                # Live only if this very message is still indexed at this deadline.
                if msg.expiry_ns == deadline and by_id.get(msg.id) is msg:
                    del by_id[msg.id]
                    out.append(msg)
        out.sort(key=_deadline_and_id)
        return out

    def drain(self):
        """Remove and return everything (shutdown flush, channel empty)."""
        out = list(self._by_id.values())
        self._by_id.clear()
        self._entries.clear()
        self._tail.clear()
        self._referenced = 0
        return out

    def values(self):
        return list(self._by_id.values())

    def earliest(self, n):
        """Up to ``n`` live messages in deadline order (equal deadlines in ID order), left indexed.

        Walks the entries from the earliest, skipping stale ones: O(n + stale entries passed).
        """
        by_id = self._by_id
        out = []
        for deadline, _, msgs in heapq.merge(self._entries, self._tail):
            live = [m for m in msgs if m.expiry_ns == deadline and by_id.get(m.id) is m]
            live.sort(key=_deadline_and_id)
            out.extend(live)
            if len(out) >= n:
                break
        return out[:n]


def _deadline_and_id(msg):
    return msg.expiry_ns, msg.id
