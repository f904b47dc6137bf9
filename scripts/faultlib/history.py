"""The histories: JSON-lines files of events that the clients write and the checker reads."""

import json
import threading
import time


def now():
    return time.time()


# -- histories -------------------------------------------------------------------


class History:
    """A JSON-lines file of events, each stamped with the wall clock (every host shares it).

    ``_lock`` guards the file: client threads write events concurrently."""

    def __init__(self, path):
        self._lock = threading.Lock()
        self._file = open(path, "a", buffering=1)

    def write(self, ev, **fields):
        fields["ev"] = ev
        fields.setdefault("t", now())
        line = json.dumps(fields, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self):
        with self._lock:
            self._file.close()


def read_history(path):
    """The events of a history file (a torn last line, from a killed writer, is skipped)."""
    events = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return events
