"""DiskQueueFiles: the files under a disk queue, apart from its records' flow.

What :class:`~nsqd_threaded.storage.diskqueue.DiskQueue` does to its files
rather than to its messages: reading the metadata file back, recovering a
write file that grew past the metadata after a crash, opening, rolling and
closing the write file, the read file's life (opened, consumed, deleted), and
what a read error does (the file set aside as ``.bad``, the queue skipping to
the next file).  A mixin: it holds no state of its own and runs, as every
DiskQueue method does, under the owning topic's or channel's lock.
"""

import os

from . import records
from .backend import BackendError
from .files import remove_quietly, strerror, write_all
from .meta_file import parse_meta
from .records import RECORD_LENGTH



class DiskQueueFiles:
    """The file-handling half of :class:`~nsqd_threaded.storage.diskqueue.DiskQueue` (see the module's docstring)."""

    def _retrieve_meta_data(self):
        try:
            with open(self.meta_file_name, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to retrieveMetaData - %s", self.name, e)
            return
        fields, err = parse_meta(data)
        names = ("_depth", "read_file_num", "read_pos", "write_file_num", "write_pos")
        for attr, value in zip(names[1:], fields[1:]):
            setattr(self, attr, value)
        if err is None:
            self._depth = fields[0]  # as Go: depth only when the whole file parsed
        else:
            self.log.error("DISKQUEUE(%s) failed to retrieveMetaData - %s", self.name, err)

    def _recover_write_file(self):
        """The write file is larger than the metadata says (crash before the last sync).

        As Go: new writes go to the next file and the reader consumes the
        stale one up to its real size.  Beyond Go: the records found past
        writePos are added to depth, a chain of such files is followed, and
        this also runs when the metadata file was missing.
        """
        while True:
            path = self.file_name(self.write_file_num)
            try:
                size = os.stat(path).st_size
            except OSError:
                return
            if size <= self.write_pos:
                return
            self.log.warn(
                "DISKQUEUE(%s) %s metadata writePos %d < file size of %d, skipping to new file",
                self.name,
                path,
                self.write_pos,
                size,
            )
            self._depth += self._count_records(path, self.write_pos, size)
            self.write_file_num += 1
            self.write_pos = 0
            self._need_sync = True

    def _count_records(self, path, pos, size):
        count = 0
        try:
            with open(path, "rb") as f:
                f.seek(pos)
                buf = b""
                p = 0
                while pos < size:
                    if len(buf) - p < 4:
                        buf = buf[p:] + f.read(records.READ_CHUNK)
                        p = 0
                        if len(buf) < 4:
                            break
                    n = RECORD_LENGTH.unpack_from(buf, p)[0]
                    if n < self.min_msg_size or n > self.max_msg_size or pos + 4 + n > size:
                        break
                    p += 4 + n
                    pos += 4 + n
                    count += 1
                    if p > len(buf):
                        f.seek(pos)
                        buf, p = b"", 0
        except OSError as e:
            self.log.error("DISKQUEUE(%s) failed to scan %s - %s", self.name, path, e)
        return count

    # -- write side ---------------------------------------------------------

    def _open_write_file(self, file_num, pos):
        fd = os.open(self.file_name(file_num), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size > pos:
                # Only the leftovers of a failed write can lie past writePos.
                try:
                    os.ftruncate(fd, pos)
                except OSError:
                    pass
            os.lseek(fd, pos, os.SEEK_SET)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _write_segments(self, start_file, start_pos, segments):
        created = []
        wrote_start = False
        num = segments[0][0]
        op = "open"
        try:
            for num, pos, parts in segments:  # (a path is built only for an error)
                if num != start_file and self._must_roll():
                    op = "sync"
                    self._roll_write_file(num)
                if self._wfd is None:
                    op = "open"
                    self._wfd = self._open_write_file(num, pos)
                    if num != start_file:
                        created.append(num)
                    self._write_file_opened(self._wfd, num)
                op = "write"
                if num == start_file:
                    wrote_start = True
                write_all(self._wfd, b"".join(parts))
        except OSError as e:
            path = self.file_name(num - 1 if op == "sync" else num)
            # Nothing of the batch counts: drop what reached the files.
            self._close_write_file()
            if wrote_start:
                try:
                    os.truncate(self.file_name(start_file), start_pos)
                except OSError:
                    pass
            for num in created:
                remove_quietly(self.file_name(num))
            self._write_failed((start_file, start_pos))
            raise BackendError("%s %s: %s" % (op, path, strerror(e)))

    def _roll_write_file(self, new_num):
        """The writer moves on to file ``new_num``: fsync the finished file (failure logged)."""
        self._fsync_logged()
        self._close_write_file()

    def _fsync_logged(self):
        if self._wfd is not None:
            try:
                os.fsync(self._wfd)
            except OSError as e:
                self.log.error("DISKQUEUE(%s) failed to sync - %s", self.name, e)

    def _close_write_file(self):
        if self._wfd is not None:
            try:
                os.close(self._wfd)
            except OSError:
                pass
            self._wfd = None

    # -- read side ------------------------------------------------------------

    def _open_read_file(self):
        """Open the read file; on failure handle it as a read error and return False."""
        path = self.file_name(self.read_file_num)
        try:
            self._rfd = os.open(path, os.O_RDONLY)
        except OSError as e:
            self._handle_read_error("open %s: %s" % (path, strerror(e)))
            return False
        self._rsize = None
        self._rbuf, self._rbuf_start = b"", self.read_pos
        return True

    def _read_file_size(self):
        if self._rsize is None:
            try:
                self._rsize = os.fstat(self._rfd).st_size
            except OSError:
                self._rsize = self.max_bytes_per_file
        return self._rsize

    def _close_read_file(self):
        if self._rfd is not None:
            try:
                os.close(self._rfd)
            except OSError:
                pass
            self._rfd = None
        self._rsize = None
        self._rbuf = b""

    def _finish_read_file(self):
        """The read file is fully consumed: delete it and move to the next one."""
        self._close_read_file()
        num = self.read_file_num
        self._read_file_consumed(num)
        self._complete_sizes.pop(num, None)
        self.read_file_num = num + 1
        self.read_pos = 0
        self._need_sync = True
        self._sidecar.prune(self._first_live_file())  # deferred entries of the files left

    def _handle_read_error(self, err):
        num = self.read_file_num
        bad = self.file_name(num)
        self.log.error("DISKQUEUE(%s) reading at %d of %s - %s", self.name, self.read_pos, bad, err)
        self._close_read_file()
        if num == self.write_file_num:
            # The current write file cannot be read: skip it for writes too.
            self._close_write_file()
            self.write_file_num += 1
            self.write_pos = 0
        bad_rename = bad + ".bad"
        self.log.warn("DISKQUEUE(%s) jump to next file and saving bad file as %s", self.name, bad_rename)
        self._set_aside_bad_file(num)
        self._complete_sizes.pop(num, None)
        self.read_file_num = num + 1
        self.read_pos = 0
        self._need_sync = True
        self._sidecar.prune(self._first_live_file())
        self._check_tail_corruption()

    def _check_tail_corruption(self):
        rf, rp, wf, wp = self.read_file_num, self.read_pos, self.write_file_num, self.write_pos
        if rf < wf or (rf == wf and rp < wp):
            return
        if self._depth != 0:
            if self._depth < 0:
                self.log.error(
                    "DISKQUEUE(%s) negative depth at tail (%d), metadata corruption, resetting 0...",
                    self.name,
                    self._depth,
                )
            else:
                self.log.error(
                    "DISKQUEUE(%s) positive depth at tail (%d), data loss, resetting 0...", self.name, self._depth
                )
            self._depth = 0
            self._need_sync = True
        if rf != wf or rp != wp:
            if rf > wf:
                self.log.error(
                    "DISKQUEUE(%s) readFileNum > writeFileNum (%d > %d), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                    self.name,
                    rf,
                    wf,
                )
            if rp > wp:
                self.log.error(
                    "DISKQUEUE(%s) readPos > writePos (%d > %d), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                    self.name,
                    rp,
                    wp,
                )
            self._skip_to_next_rw_file()
            self._need_sync = True

    def _skip_to_next_rw_file(self, emptying=False):
        self._close_read_file()
        self._close_write_file()
        first = self._first_file_to_remove(emptying)
        for num in range(first, self.write_file_num + 1):
            path = self.file_name(num)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                self.log.error("DISKQUEUE(%s) failed to remove data file - %s", self.name, e)
        self._complete_sizes.clear()
        self.write_file_num += 1
        self.write_pos = 0
        self.read_file_num = self.write_file_num
        self.read_pos = 0
        self._depth = 0
        if self._sidecar.in_use():
            self._sidecar.drop()
