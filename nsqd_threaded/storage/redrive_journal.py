"""A channel's redrive journal (``--durable``; not in Go nsqd): the redrive a kill may cut short.

``POST /channel/redrive`` takes messages out of a channel (a dead-letter topic's, usually), publishes
each as a new message to its destination topic, and then lets it leave the channel (its done-log
entry).  A kill between the destination's write and the channel's done-log entries would leave the
message in both, to be delivered twice.  So under ``--durable``, right before the destination's
records are written (that topic's lock held), one line per message is appended to
``<topic>:<channel>.redrive.jsonl`` in the data directory, beside (never inside) the channel's disk
queue; Go nsqd, which opens only nsqd.dat and the ``*.diskqueue.*`` files, never reads it::

    {"id": "<its ID in the channel>", "from": [0, 512], "to": "<the destination topic>", "new": "<its ID there>", "at": [0, 1024]}

``from`` is where the message's record is in the channel's disk queue (null when it cannot be
told), ``at`` where the destination's disk queue writes the new record.  The file is removed when the
redrive ends (the done-log entries written before: the kernel keeps what a killed process wrote, in
order).  A restarted broker that finds it reads it before any delivery: a message whose new record
is at its position in the destination (``DurableDiskQueue.holds_record``) and whose own record the
channel will still hand out (``DurableDiskQueue.holds_undone``) was moved, and the channel lets it
go the next time it takes it, unread; the others were never written there (they stay, as any other
message), or had left the channel before the kill.  A line a kill tore (the last, without its newline) is skipped.
"""

import json
import os

from .files import remove_quietly, write_all

FILE_SUFFIX = ".redrive.jsonl"


def file_path(data_path, queue_name):
    """The journal of the channel whose disk queue is ``queue_name`` (``topic:channel``)."""
    return os.path.join(data_path, queue_name + FILE_SUFFIX)


def encode_lines(ids, sources, topic_name, new_ids, positions):
    """The lines of messages ``ids`` (bytes; their records at ``sources``, each a position or None)
    published to ``topic_name`` as ``new_ids`` at ``positions``."""
    return b"".join(
        json.dumps({"id": msg_id.decode("ascii", "replace"), "from": None if source is None else list(source),
                    "to": topic_name, "new": new_id.decode("ascii", "replace"), "at": list(at)},
                   separators=(",", ":")).encode() + b"\n"
        for msg_id, source, new_id, at in zip(ids, sources, new_ids, positions))


def append(path, data):
    """Append encoded lines (on a line of their own: a torn line before them stays apart)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        write_all(fd, b"\n" + data)
    finally:
        os.close(fd)


def read(path):
    """The whole lines of the journal, ``(id, from, to, new, at)`` each (``[]`` when there is none);
    OSError if unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n")[:-1]:  # (the part after the last newline is a torn line, or nothing)
        if not line:
            continue
        try:
            doc = json.loads(line)
            source = doc["from"]
            out.append((doc["id"].encode("ascii"), None if source is None else tuple(source), doc["to"],
                        doc["new"].encode("ascii"), tuple(doc["at"])))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeError):
            continue  # (not a line this broker wrote whole)
    return out


def remove(path):
    remove_quietly(path)
