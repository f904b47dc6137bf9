"""In-flight and deferred indexes: messages by ID and by deadline.

Go nsqd keeps a map plus a hand-written heap for each.  Here one class serves
both, a dict for O(1) lookup by ID and a ``sortedcontainers.SortedList`` of
``(deadline_ns, id)`` for "everything due by now" and O(log n) removal.
The deadline lives in ``Message.expiry_ns`` (expiry when in flight, due time
when deferred; a message is never both in one channel).

Not thread-safe: the owning Channel's lock guards every call.
"""

from sortedcontainers import SortedList


class TimedIndex:
    __slots__ = ("_by_id", "_by_deadline")

    def __init__(self):
        self._by_id = {}
        self._by_deadline = SortedList()

    def __len__(self):
        return len(self._by_id)

    def __contains__(self, msg_id):
        return msg_id in self._by_id

    def get(self, msg_id):
        return self._by_id.get(msg_id)

    def add(self, msg, deadline_ns):
        """Index ``msg`` due at ``deadline_ns``; False if its ID is already here."""
        if msg.id in self._by_id:
            return False
        msg.expiry_ns = deadline_ns
        self._by_id[msg.id] = msg
        self._by_deadline.add((deadline_ns, msg.id))
        return True

    def add_many(self, msgs, deadline_ns):
        """Index a batch due at one deadline (a delivery batch); returns those added.

        One ``SortedList.update`` instead of an insertion per message.
        """
        by_id = self._by_id
        added = []
        keys = []
        for msg in msgs:
            if msg.id in by_id:
                continue  # nsqd silently keeps the first of a duplicate ID
            msg.expiry_ns = deadline_ns
            by_id[msg.id] = msg
            added.append(msg)
            keys.append((deadline_ns, msg.id))
        self._by_deadline.update(keys)
        return added

    def remove(self, msg_id):
        """Remove and return the message with this ID, or None."""
        msg = self._by_id.pop(msg_id, None)
        if msg is not None:
            self._by_deadline.remove((msg.expiry_ns, msg_id))
        return msg

    def reschedule(self, msg, deadline_ns):
        self._by_deadline.remove((msg.expiry_ns, msg.id))
        msg.expiry_ns = deadline_ns
        self._by_deadline.add((deadline_ns, msg.id))

    def pop_due(self, now_ns):
        """Remove and return every message whose deadline is <= now_ns, earliest first."""
        due = self._by_deadline
        if not due or due[0][0] > now_ns:
            return []
        cut = due.bisect_right((now_ns, b"\xff" * 17))
        out = [self._by_id.pop(msg_id) for _, msg_id in due.islice(0, cut)]
        del due[:cut]
        return out

    def drain(self):
        """Remove and return everything (shutdown flush, channel empty)."""
        out = list(self._by_id.values())
        self._by_id.clear()
        self._by_deadline.clear()
        return out

    def values(self):
        return list(self._by_id.values())
