"""Reading a diskqueue data file's records on a descriptor of one's own (a peek: nothing is taken).

:class:`~nsqd_threaded.storage.diskqueue.DiskQueue` reads its records through
its own reader (one descriptor, one buffer, the read position it persists);
:func:`read_records` reads them again without touching any of that, for
``DiskQueue.peek``.
"""

import os
import struct

from ..wire.message import RECORD_HEADER, Message

RECORD_LENGTH = struct.Struct(">i")  # a record's length prefix
# Bytes read at a time (more if one record is bigger): by the queue's reader, its recovery
# scan and a peek alike (read as ``records.READ_CHUNK``, so that a test can make it small).
READ_CHUNK = 256 * 1024


def read_records(path, pos, end, min_size, max_size, count=None):
    """``(pos, Message)`` of the records of ``path`` from ``pos`` up to ``end`` (None: the
    file's size), at most ``count`` (None: all).

    Stops at a length outside ``[min_size, max_size]`` or a record running past
    ``end`` (what the queue's reader would call a read error); a file that does
    not open yields nothing.  Raises OSError when a read fails.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if end is None:
            end = os.fstat(fd).st_size
        buf, base = b"", pos
        while pos < end and (count is None or count > 0):
            p = pos - base
            need = 4 if len(buf) - p < 4 else 4 + RECORD_LENGTH.unpack_from(buf, p)[0]
            if len(buf) - p < need:
                buf, base, p = os.pread(fd, min(max(READ_CHUNK, need), end - pos), pos), pos, 0
                if len(buf) < 4:
                    return
            size = RECORD_LENGTH.unpack_from(buf, p)[0]
            if size < min_size or size > max_size or pos + 4 + size > end or p + 4 + size > len(buf):
                return
            timestamp, attempts, msg_id = RECORD_HEADER.unpack_from(buf, p + 4)
            yield pos, Message(msg_id, bytes(buf[p + 4 + RECORD_HEADER.size : p + 4 + size]), timestamp, attempts)
            pos += 4 + size
            if count is not None:
                count -= 1
    finally:
        os.close(fd)
