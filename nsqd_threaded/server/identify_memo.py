"""IdentifyMemo: IDENTIFY bodies a broker has decoded and negotiated, by their bytes.

A program's consumers identify alike: go-nsq and pynsq send the same
client_id, hostname, user agent and settings on every connection they open,
so a broker with thousands of a program's consumers would decode one JSON
body thousands of times, negotiate the same settings and, for clients that
ask for feature negotiation, encode the same answer.  The memo keeps what
one body gave: Go's decode of it (:func:`~nsqd_threaded.wire.protocol_v2.decode_identify`),
the settings negotiated against the broker's options, which do not change
while it runs (:func:`~nsqd_threaded.wire.protocol_v2.negotiate_identify`), and the
feature-negotiation answer when it upgrades nothing.

Only a body that was accepted whole is kept: one that fails to decode, or
asks for settings out of bounds, is decoded and refused again each time, with
the same error as before.  What the memo returns is shared between clients
and must not be changed.
"""

import threading

MEMO_ENTRIES = 64  # distinct bodies kept (the oldest goes first)
MEMO_BODY = 1024  # the longest body kept, in bytes


class IdentifyMemo:
    """One broker's memo (:attr:`NSQD.identify_memo <nsqd_threaded.server.nsqd.NSQD.identify_memo>`).

    :meth:`get` takes no lock: a dict lookup is atomic, and an entry, once in,
    is never changed but for its answer, which is set whole.  ``_lock``
    serializes :meth:`add`, which evicts the oldest entry at :data:`MEMO_ENTRIES`.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = {}  # body -> MemoEntry

    def get(self, body):
        """The entry for ``body`` (bytes), or None."""
        return self._entries.get(body)

    def add(self, body, fields, settings):
        """Keep what ``body`` gave (once accepted: see the module's docstring); returns its entry."""
        entry = MemoEntry(fields, settings)
        if len(body) > MEMO_BODY:
            return entry
        with self._lock:
            entries = self._entries
            if body not in entries:
                if len(entries) >= MEMO_ENTRIES:
                    del entries[next(iter(entries))]
                entries[body] = entry
        return entry

    def __len__(self):
        return len(self._entries)


class MemoEntry:
    """What one IDENTIFY body gave: ``fields`` (decoded), ``settings`` (negotiated) and ``answer``,
    the feature-negotiation response frame when nothing was upgraded (None until one was made)."""

    __slots__ = ("fields", "settings", "answer")

    def __init__(self, fields, settings):
        self.fields = fields
        self.settings = settings
        self.answer = None
