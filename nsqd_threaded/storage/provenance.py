"""A dead-letter topic's provenance file: where each of its dead letters came from (not in Go nsqd).

One file per dead-letter topic, ``<topic>.dead-letters.jsonl`` in the data
directory, beside (never inside) the topic's disk queue: the messages keep
their bodies and their records exactly as Go writes them, and Go nsqd, which
opens only nsqd.dat and the ``*.diskqueue.*`` files its metadata names,
never reads it.  Each line is one compact JSON object::

    {"id": "<the dead letter's ID>", "crc": <CRC-32 of its body>, "dead_letter": {...}, "boot": "...", "at": [0, 1024]}

An entry is appended with the topic's lock held, right before the dead letter
is written to the topic (before a consumer can have it), and before the
message leaves its source channel (see docs/storage.md for the crash rule).
Under ``--durable`` it has ``"at": [file num, pos]``, where the topic's disk
queue writes the dead letter: after a crash, the record there with the dead
letter's ID proves it was written (or a deleted file, consumed), and its
absence that it was not (a kill between the line and the record, a power
loss, an fsync that failed); the move is repeated only then.  ``boot``
(``--durable`` only) is the running kernel's boot ID (:func:`current_boot`):
for a line without ``at`` (a compaction keeps lines of held messages without
it), the same boot ID proves its dead letter was written, because the kernel
keeps what a killed process wrote.  A reader trusts an entry only for a message with that ID *and*
a body with that CRC-32; an ID is never made twice by a broker (its GUIDs
grow with its clock), so a line a crash left behind, for a message that was
never stored, never attaches to another one.  A line a crash tore (the
last, without its newline) is skipped, and the next append starts a new line.
"""

import json
import os
import zlib

from .files import fsync_dir, remove_quietly, replace_atomically, write_all

FILE_SUFFIX = ".dead-letters.jsonl"


def file_path(data_path, topic_name):
    """The provenance file of ``topic_name``: the topic's name, then :data:`FILE_SUFFIX`."""
    return os.path.join(data_path, topic_name + FILE_SUFFIX)


def body_crc(body):
    """The CRC-32 an entry keeps of its message's body."""
    return zlib.crc32(body)


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def current_boot(path=BOOT_ID_PATH):
    """The running kernel's boot ID (Linux; changes at every boot), or None where there is none."""
    try:
        with open(path, "rb") as f:
            return f.read().strip().decode("ascii", "replace") or None
    except OSError:
        return None


def encode_entries(entries, boot=None, positions=None):
    """``[(id text, crc, dead_letter dict)]`` as the lines appended for them (``boot``: the boot ID
    they are written in, kept in each line; ``positions``: where the topic's disk queue writes each
    dead letter, ``[(file num, pos)]``, kept as ``"at"``)."""
    extra = {} if boot is None else {"boot": boot}
    lines = []
    for i, (msg_id, crc, doc) in enumerate(entries):
        line = dict({"id": msg_id, "crc": crc, "dead_letter": doc}, **extra)
        if positions is not None:
            line["at"] = list(positions[i])
        lines.append(json.dumps(line, separators=(",", ":")).encode() + b"\n")
    return b"".join(lines)


def read_entries(path, boot=None):
    """``({id text: (crc, dead_letter dict)}, ends_with_newline, moved)`` of a provenance file ({},
    True and {} when there is none): ``moved``, ``{id text: position or None}`` of the lines that
    tell whether their dead letter was written: those with a position (``"at"``, any boot: the
    record there tells), and those without one written in boot ``boot`` (none if None); a line that
    is not a whole entry (torn by a crash) is skipped."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}, True, {}
    entries = {}
    moved = {}
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            doc = json.loads(line)
            msg_id, crc, dead_letter = doc["id"], doc["crc"], doc["dead_letter"]
        except (ValueError, TypeError, KeyError):
            continue
        if isinstance(msg_id, str) and isinstance(crc, int) and isinstance(dead_letter, dict):
            entries[msg_id] = (crc, dead_letter)
            at = doc.get("at")
            if (isinstance(at, list) and len(at) == 2 and all(isinstance(n, int) and n >= 0 for n in at)):
                moved[msg_id] = (at[0], at[1])
            elif boot is not None and doc.get("boot") == boot:
                moved[msg_id] = None
    return entries, not data or data.endswith(b"\n"), moved


def append_entries(path, data, start_line=False, sync=False):
    """Append encoded entries (``start_line``: after a torn line, on a line of their own); ``sync``: fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        write_all(fd, (b"\n" + data) if start_line else data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def replace_entries(path, data):
    """Make ``data`` (encoded entries) the whole file, atomically: written to a temp file beside it,
    fsynced, renamed over it, the directory fsynced; nothing kept (empty ``data``): the file is
    removed.  A crash at any instant leaves the old file or the new one, never a part of either
    (a temp file a crash left, ``<file>.<n>.tmp``, is never read)."""
    if data:
        replace_atomically(path, data, sync_dir=True)
    else:
        try:
            os.remove(path)
        except FileNotFoundError:
            return
        fsync_dir(os.path.dirname(path))


def sync_file(path):
    """fsync the file (appended to without ``sync``); OSError if it fails."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def delete_file(path):
    remove_quietly(path)
