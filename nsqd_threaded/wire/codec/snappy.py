"""Snappy for the TCP protocol: the raw block format and the framing format.

nsqd's IDENTIFY ``snappy: true`` switches both directions of a connection to
the snappy *framing* format: a stream identifier chunk, then chunks of at
most 64 KiB of uncompressed data, each compressed (type 0x00) or stored
(0x01, when compression saves less than 12.5%), each with the masked
CRC-32C of its uncompressed bytes.

The pure-Python codec (``block``, ``crc32c``) needs nothing outside the
standard library and is always importable here as ``py_compress``,
``py_decompress``, ``PyFrameEncoder`` and ``PyFrameDecoder``.  When the
optional extra ``snappy`` (cramjam, Rust) is installed, the public names use
it instead; ``BACKEND`` says which ("python" or "cramjam").  The environment
variable ``NSQD_SNAPPY_BACKEND`` (``python``, ``cramjam`` or ``auto``) read at
import overrides the choice.  Both produce and
accept the same formats, so they interoperate on one stream.

Decoders raise ``SnappyError`` on corrupt input; after that the decoder's
state is undefined (the connection is to be closed).
"""

import os

from .block import SnappyError, FRAGMENT, compress as py_compress, decompress as py_decompress
from .block import MAX_EXPANSION, decoded_length
from .crc32c import crc32c as py_crc32c, masked

__all__ = [
    "BACKEND", "SnappyError", "compress", "decompress", "crc32c",
    "FrameEncoder", "FrameDecoder", "PyFrameEncoder", "PyFrameDecoder",
    "STREAM_IDENTIFIER", "MAX_CHUNK",
]

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
CHUNK_COMPRESSED = 0x00
CHUNK_UNCOMPRESSED = 0x01
CHUNK_PADDING = 0xFE
CHUNK_STREAM_IDENTIFIER = 0xFF
MAX_UNCOMPRESSED = FRAGMENT  # uncompressed bytes per chunk
# The largest body of a data chunk: checksum + the worst-case block of 64 KiB
# (the reference's bound 32 + n + n/6).
MAX_CHUNK = 4 + 32 + MAX_UNCOMPRESSED + MAX_UNCOMPRESSED // 6
_SMALL = 15  # a block this short is one literal: it never saves 12.5%


def _header(kind, size):
    return bytes((kind, size & 0xFF, (size >> 8) & 0xFF, size >> 16))


class PyFrameEncoder:
    """Encodes a stream into snappy frames, one ``encode`` call per flush."""

    def __init__(self):
        self._started = False  # the stream identifier has been written

    def encode(self, data):
        """Frames for ``data``; the stream identifier precedes the first ones."""
        if type(data) is not bytes:
            data = bytes(data)
        n = len(data)
        if not n:
            return b""
        parts = []
        if not self._started:
            parts.append(STREAM_IDENTIFIER)
            self._started = True
        for start in range(0, n, MAX_UNCOMPRESSED):
            chunk = data[start:start + MAX_UNCOMPRESSED] if n > MAX_UNCOMPRESSED else data
            size = len(chunk)
            crc = masked(py_crc32c(chunk)).to_bytes(4, "little")
            if size >= _SMALL:
                block = py_compress(chunk)
                if len(block) < size - size // 8:
                    parts += (_header(CHUNK_COMPRESSED, 4 + len(block)), crc, block)
                    continue
            parts += (_header(CHUNK_UNCOMPRESSED, 4 + size), crc, chunk)
        return b"".join(parts)


class PyFrameDecoder:
    """Decodes a snappy frame stream fed in arbitrary pieces.

    Incomplete chunks are buffered until the rest arrives; skippable chunks
    are dropped as they stream by, never buffered.  ``max_chunk`` bounds a
    data chunk's body (a larger one is corrupt, not waited for).
    """

    def __init__(self, max_chunk=MAX_CHUNK):
        self.max_chunk = max_chunk
        self._buf = bytearray()  # the unconsumed tail of the stream
        self._skip = 0  # bytes of a skippable chunk yet to drop
        self._started = False  # the stream identifier has been read

    def decode(self, data):
        """All the uncompressed bytes that ``data`` completes."""
        if self._skip:
            drop = min(self._skip, len(data))
            self._skip -= drop
            data = memoryview(data)[drop:]
        buf = self._buf
        buf += data
        n = len(buf)
        out = []
        pos = run = 0  # buf[run:pos] are complete data chunks not yet decoded
        while n - pos >= 4:
            kind = buf[pos]
            size = buf[pos + 1] | (buf[pos + 2] << 8) | (buf[pos + 3] << 16)
            if kind <= CHUNK_UNCOMPRESSED:
                if not self._started:
                    raise SnappyError("snappy: data before the stream identifier")
                if size < 4 or size > self.max_chunk or (
                        kind == CHUNK_UNCOMPRESSED and size > 4 + MAX_UNCOMPRESSED):
                    raise SnappyError("snappy: bad chunk length %d" % size)
                if pos + 4 + size > n:
                    break
                pos += 4 + size
                continue
            if kind == CHUNK_STREAM_IDENTIFIER:
                if size != 6:
                    raise SnappyError("snappy: bad stream identifier")
                if pos + 10 > n:
                    break
                if buf[pos:pos + 10] != STREAM_IDENTIFIER:
                    raise SnappyError("snappy: bad stream identifier")
                self._started = True
            elif kind < 0x80:
                raise SnappyError("snappy: reserved unskippable chunk type 0x%02x" % kind)
            elif not self._started:
                raise SnappyError("snappy: chunk before the stream identifier")
            if run < pos:
                out.append(self._data_chunks(buf, run, pos))
            end = pos + 4 + size
            if end > n:  # a skippable chunk's tail is still to come
                self._skip = end - n
                end = n
            pos = run = end
        if run < pos:
            out.append(self._data_chunks(buf, run, pos))
        del buf[:pos]
        return out[0] if len(out) == 1 else b"".join(out)

    def _data_chunks(self, buf, start, end):
        """The uncompressed bytes of the complete data chunks in buf[start:end]."""
        out = []
        pos = start
        while pos < end:
            size = buf[pos + 1] | (buf[pos + 2] << 8) | (buf[pos + 3] << 16)
            expected = int.from_bytes(buf[pos + 4:pos + 8], "little")
            body = bytes(buf[pos + 8:pos + 4 + size])
            if buf[pos] == CHUNK_COMPRESSED:
                if decoded_length(body)[0] > MAX_UNCOMPRESSED:
                    raise SnappyError("snappy: chunk longer than 64 KiB")
                body = py_decompress(body)
            if masked(py_crc32c(body)) != expected:
                raise SnappyError("snappy: checksum mismatch")
            out.append(body)
            pos += 4 + size
        return out[0] if len(out) == 1 else b"".join(out)


BACKEND_VARIABLE = "NSQD_SNAPPY_BACKEND"


def _cramjam():
    """cramjam, or None: the environment's ``NSQD_SNAPPY_BACKEND`` forces a choice.

    ``python`` forces the pure-Python codec (to benchmark it, or to rule the
    extension out), ``cramjam`` requires the extension (ImportError without
    it), unset, empty or ``auto`` takes cramjam when it is installed.
    """
    choice = os.environ.get(BACKEND_VARIABLE, "").strip().lower() or "auto"
    if choice not in ("auto", "python", "cramjam"):
        raise ValueError("%s=%r: expected python, cramjam or auto" % (BACKEND_VARIABLE, choice))
    if choice == "python":
        return None
    try:
        import cramjam
    except ImportError:
        if choice == "cramjam":
            raise
        return None
    return cramjam


_cj = _cramjam()

if _cj is None:
    BACKEND = "python"
    compress = py_compress
    decompress = py_decompress
    crc32c = py_crc32c
    FrameEncoder = PyFrameEncoder
    FrameDecoder = PyFrameDecoder
else:
    BACKEND = "cramjam"
    crc32c = py_crc32c
    _cj_snappy = _cj.snappy
    _CjError = _cj.DecompressionError

    def compress(data):
        """Compress ``data`` (bytes-like) into one raw snappy block."""
        return bytes(_cj_snappy.compress_raw(data))

    def decompress(data):
        """Uncompress one raw snappy block."""
        length = decoded_length(data)[0]
        if length > MAX_EXPANSION * len(data):
            raise SnappyError("snappy: length %d impossible for %d bytes" % (length, len(data)))
        try:
            return bytes(_cj_snappy.decompress_raw(data))
        except _CjError as exc:
            raise SnappyError("snappy: %s" % exc) from None

    class FrameEncoder(PyFrameEncoder):
        """Rust's frame encoder (same 64 KiB chunks and 12.5% rule), one call per flush."""

        def encode(self, data):
            if not len(data):
                return b""
            framed = _cj_snappy.compress(data)
            if self._started:
                return bytes(memoryview(framed)[len(STREAM_IDENTIFIER):])
            self._started = True
            return bytes(framed)

    class FrameDecoder(PyFrameDecoder):
        """Chunk boundaries found here; checksums and blocks done by Rust, one call per run."""

        def _data_chunks(self, buf, start, end):
            try:
                return bytes(_cj_snappy.decompress(STREAM_IDENTIFIER + buf[start:end]))
            except _CjError as exc:
                raise SnappyError("snappy: %s" % exc) from None
