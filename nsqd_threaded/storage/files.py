"""Small file-system helpers shared by the disk queue and nsqd.dat (no state)."""

import errno
import os
import random


def write_all(fd, data):
    """os.write until every byte is written (a short write is retried, 0 is an error)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]


def strerror(e):
    """OSError text as Go prints it: ``file too large``, ``no space left on device``."""
    text = e.strerror or str(e)
    return text[:1].lower() + text[1:]


def close_quietly(fd):
    """Close a descriptor kept open (its last write, if any, was reported); None: nothing to close."""
    if fd is None:
        return
    try:
        os.close(fd)
    except OSError:
        pass


def remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def fsync_dir(path):
    """fsync a directory, so the names created/renamed in it survive power loss."""
    fd = os.open(path or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path):
    """``<path>.<random non-negative int>.tmp``, the temp-file name Go nsqd uses."""
    return "%s.%d.tmp" % (path, random.getrandbits(63))


def replace_atomically(path, data, sync_dir=False, ignore_fsync_error=False, fsync=True):
    """Write ``data`` to a temp file (mode 0600), fsync it, rename it over ``path``.

    ``ignore_fsync_error`` mirrors go-diskqueue's meta file (an fsync error is
    ignored); ``sync_dir`` also fsyncs the directory so the rename survives
    power loss.  ``fsync=False``: no fsync at all (the new content survives
    a killed process, not necessarily a power loss).
    """
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, data)
        try:
            if fsync:
                os.fsync(fd)
        except OSError:
            if not ignore_fsync_error:
                raise
        os.close(fd)
        fd = None
        os.replace(tmp, path)
    except OSError:
        if fd is not None:
            os.close(fd)
        remove_quietly(tmp)
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(path))
