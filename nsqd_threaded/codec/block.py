"""The raw snappy block format in pure Python.

A block is the uncompressed length as a varint, then elements: literals
(tag ``00``: up to 60 lengths inline, else 1-4 length bytes) and copies of
earlier output (tag ``01``: 11-bit offset, length 4-11; ``10``: 16-bit
offset, length 1-64; ``11``: 32-bit offset).

Decompression appends whole slices to one bytearray: a literal is one
memoryview slice, a copy is one slice of the output so far, and an
overlapping copy (offset < length, i.e. a repeated pattern) is the pattern
repeated with ``*``.  No per-byte Python loop.

Compression is the reference matcher: 64 KiB fragments, a table of the last
position of each 4-byte word, and the reference's skip heuristic (after 32
misses in a row, probe every 2nd byte, then every 3rd, ...) so incompressible
data is crossed quickly.  The table is keyed by the word itself (a dict), so
a hit is a real 4-byte match without re-comparing; a match is extended by
comparing slices of doubling length (memcmp in C), not byte by byte.
"""

import struct
import sys


class SnappyError(ValueError):
    """Corrupt snappy data (block or framing)."""


MAX_BLOCK = 0xFFFFFFFF  # the varint length's bound
FRAGMENT = 65536  # the reference compresses in fragments of this size
_INPUT_MARGIN = 15  # the reference stops matching this close to a fragment's end
_LITTLE = sys.byteorder == "little"


def _put_varint(out, n):
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def decoded_length(data):
    """(uncompressed length, header size) of a block."""
    result = 0
    shift = 0
    for i in range(5):
        if i >= len(data):
            raise SnappyError("snappy: truncated length")
        b = data[i]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result > MAX_BLOCK:
                raise SnappyError("snappy: length overflow")
            return result, i + 1
        shift += 7
    raise SnappyError("snappy: length overflow")


def decompress(data):
    """Uncompress one raw snappy block."""
    src = data if type(data) is bytes else bytes(data)
    length, pos = decoded_length(src)
    mv = memoryview(src)
    n = len(src)
    out = bytearray()
    olen = 0
    try:
        while pos < n:
            tag = src[pos]
            pos += 1
            kind = tag & 3
            if kind == 0:
                size = tag >> 2
                if size >= 60:
                    extra = size - 59
                    if pos + extra > n:
                        raise SnappyError("snappy: truncated literal length")
                    size = int.from_bytes(src[pos:pos + extra], "little")
                    pos += extra
                size += 1
                end = pos + size
                if end > n:
                    raise SnappyError("snappy: truncated literal")
                olen += size
                if olen > length:
                    raise SnappyError("snappy: output longer than its header says")
                out += mv[pos:end]
                pos = end
                continue
            if kind == 1:
                size = ((tag >> 2) & 7) + 4
                offset = ((tag & 0xE0) << 3) | src[pos]
                pos += 1
            elif kind == 2:
                size = (tag >> 2) + 1
                offset = src[pos] | (src[pos + 1] << 8)
                pos += 2
            else:
                size = (tag >> 2) + 1
                if pos + 4 > n:
                    raise SnappyError("snappy: truncated copy")
                offset = int.from_bytes(src[pos:pos + 4], "little")
                pos += 4
            if offset == 0 or offset > olen:
                raise SnappyError("snappy: copy offset out of range")
            if olen + size > length:
                raise SnappyError("snappy: output longer than its header says")
            start = olen - offset
            if size <= offset:
                out += out[start:start + size]
            else:
                pattern = out[start:]
                reps, rest = divmod(size, offset)
                out += pattern * reps + pattern[:rest]
            olen += size
    except IndexError:
        raise SnappyError("snappy: truncated copy") from None
    if olen != length:
        raise SnappyError("snappy: output shorter than its header says")
    return bytes(out)


def _emit_literal(out, src, start, end):
    size = end - start - 1
    if size < 60:
        out.append(size << 2)
    elif size < 0x100:
        out += b"\xf0" + bytes((size,))
    elif size < 0x10000:
        out += b"\xf4" + size.to_bytes(2, "little")
    elif size < 0x1000000:
        out += b"\xf8" + size.to_bytes(3, "little")
    else:
        out += b"\xfc" + size.to_bytes(4, "little")
    out += src[start:end]


def _emit_copy(out, offset, size):
    # Long copies are cut into 64-byte pieces, leaving >= 4 for the last one.
    while size >= 68:
        out += struct.pack("<BH", 0xFE, offset)  # length 64, 2-byte offset
        size -= 64
    if size > 64:
        out += struct.pack("<BH", 0xEE, offset)  # length 60
        size -= 60
    if size < 12 and offset < 2048:
        out += bytes((1 | ((size - 4) << 2) | ((offset >> 8) << 5), offset & 0xFF))
    else:
        out += struct.pack("<BH", 2 | ((size - 1) << 2), offset)


def _match_length(src, a, b, limit):
    """Length of the common run of ``src[a:]`` and ``src[b:]`` (a < b), b+len <= limit."""
    # Doubling probes, then a binary search, all on slices (memcmp in C).
    size = 0
    step = 8
    while True:
        step = min(step, limit - b - size)
        if step <= 0:
            return size
        if src[a + size:a + size + step] == src[b + size:b + size + step]:
            size += step
            step <<= 1
        else:
            break
    lo, hi = 0, step  # common prefix of the failed probe lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if src[a + size:a + size + mid] == src[b + size:b + size + mid]:
            lo = mid
        else:
            hi = mid
    return size + lo


def _compress_fragment(src, base, end, out):
    """Append the elements of ``src[base:end]`` to ``out``."""
    if end - base < _INPUT_MARGIN or not _LITTLE:
        _emit_literal(out, src, base, end)
        return
    # words[k][j] is the little-endian word at base + 4*j + k.
    mv = memoryview(src)
    words = []
    for k in range(4):
        count = (end - base - k) // 4
        words.append(mv[base + k:base + k + 4 * count].cast("I"))
    table = {}
    limit = end - _INPUT_MARGIN  # last position a match may start from
    lit = base  # start of the pending literal
    ip = base + 1
    skip = 32
    while ip < limit:
        off = ip - base
        word = words[off & 3][off >> 2]
        cand = table.get(word)
        table[word] = ip
        if cand is None:
            ip += skip >> 5
            skip += 1
            continue
        skip = 32
        # A 4-byte match at cand: emit the literal before it, then copies.
        if lit < ip:
            _emit_literal(out, src, lit, ip)
        while True:
            size = 4 + _match_length(src, cand + 4, ip + 4, end)
            _emit_copy(out, ip - cand, size)
            ip += size
            lit = ip
            if ip >= limit:
                break
            # Remember ip - 1 and try ip at once, as the reference does.
            off = ip - 1 - base
            table[words[off & 3][off >> 2]] = ip - 1
            off += 1
            word = words[off & 3][off >> 2]
            cand = table.get(word)
            table[word] = ip
            if cand is None:
                break
        ip += 1
    if lit < end:
        _emit_literal(out, src, lit, end)


def compress(data):
    """Compress ``data`` (bytes-like) into one raw snappy block."""
    src = data if type(data) is bytes else bytes(data)
    n = len(src)
    if n > MAX_BLOCK:
        raise SnappyError("snappy: input too large")
    out = bytearray()
    _put_varint(out, n)
    for base in range(0, n, FRAGMENT):
        _compress_fragment(src, base, min(base + FRAGMENT, n), out)
    return bytes(out)
