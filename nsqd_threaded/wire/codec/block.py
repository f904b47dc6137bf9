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
XORing 32-byte windows read as integers (the lowest set bit is the first
difference), not byte by byte (except on PyPy, whose JIT prefers the loop).

Once two matches share an offset (records of one size, such as a batch of
nsqd message frames), the fragment is XORed with itself shifted by that
offset, once, as big integers: a match at that offset then ends where the run
of zero bytes ends (a regex) and resumes at the next run of 20 zero bytes a
few bytes on (``bytes.find``), a literal between.  The bytes between two
records are thus crossed by C, not probed one by one in Python; shorter runs
are left in the literals, a little less compression for far fewer elements.
"""

import re
import struct
import sys


class SnappyError(ValueError):
    """Corrupt snappy data (block or framing)."""


MAX_BLOCK = 0xFFFFFFFF  # the varint length's bound
# The most output per input byte (a 64-byte copy in a 3-byte element): a block
# claiming more is corrupt, and is refused before anything is allocated.
MAX_EXPANSION = 22
FRAGMENT = 65536
_PYPY = sys.implementation.name == "pypy"  # the reference compresses in fragments of this size
_INPUT_MARGIN = 15  # the reference stops matching this close to a fragment's end


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
    if length > MAX_EXPANSION * len(src):
        raise SnappyError("snappy: length %d impossible for %d bytes" % (length, len(src)))
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


_COPY1 = struct.Struct("BB").pack
_COPY2 = struct.Struct("<BH").pack


def _emit_copy(out, offset, size):
    # Long copies are cut into 64-byte pieces, leaving >= 4 for the last one.
    if size >= 68:
        pieces = (size - 4) >> 6
        out += _COPY2(0xFE, offset) * pieces  # length 64, 2-byte offset
        size -= pieces << 6
    if size > 64:
        out += _COPY2(0xEE, offset)  # length 60
        size -= 60
    if size < 12 and offset < 2048:
        out += _COPY1(1 | ((size - 4) << 2) | ((offset >> 8) << 5), offset & 0xFF)
    else:
        out += _COPY2(2 | ((size - 1) << 2), offset)


# Repeated offsets (records of one size: a batch of message frames) are
# followed through the XOR of the fragment with itself shifted by the offset:
# a regex finds where a match ends (the end of a run of zero bytes) and
# ``find`` whether it resumes after a few differing bytes (a run of zeros).
_ZEROS = re.compile(b"\x00*").match
_REPEAT_USES = 2  # matches at one offset before its XOR is computed
_REPEAT_MAX = 2  # XORs per fragment: each costs a few passes over it
# A match at the offset resumes where _REPEAT_RUN bytes match again at most
# _REPEAT_GAP bytes further: shorter matches between are left in the literal,
# fewer elements for a little less compression.
_REPEAT_RUN = 20
_REPEAT_GAP = 44  # the literal stays under 60 bytes: a one-byte tag
# After _REPEAT_TRIAL bytes followed, a fragment whose gaps are more than
# 1/_REPEAT_WORTH of them goes back to the plain matcher.
_REPEAT_TRIAL = 512
_REPEAT_WORTH = 8
_RESUME = bytes(_REPEAT_RUN)


def _compress_fragment(src, out):
    """Append the elements of the fragment ``src`` (bytes, <= 64 KiB) to ``out``."""
    end = len(src)
    if end < _INPUT_MARGIN:
        _emit_literal(out, src, 0, end)
        return
    # words[k][j] is the word at 4*j + k (native order: only equality matters).
    mv = memoryview(src)
    words = tuple(mv[k:k + ((end - k) & ~3)].cast("I") for k in range(4))
    from_bytes = int.from_bytes
    bytewise = _PYPY
    table = {}
    get = table.get
    limit = end - _INPUT_MARGIN
    diffs = {}  # offset -> the fragment XOR itself shifted by offset (bytes)
    uses = {}  # offset -> matches at it so far
    whole = None  # src as an integer, once a diff is wanted
    repeat_max = 0 if bytewise else _REPEAT_MAX  # PyPy's JIT matches records faster by itself
    followed = gap_bytes = 0  # bytes covered by following offsets, and the literals among them
    zeros = _ZEROS
    lit = 0
    ip = 1
    skip = 32
    while ip < limit:
        word = words[ip & 3][ip >> 2]
        cand = get(word)
        table[word] = ip
        if cand is None:
            ip += skip >> 5
            skip += 1
            continue
        skip = 32
        # A 4-byte match at cand: emit the literal before it, then copies.
        if lit < ip:
            if ip - lit <= 60:
                out.append((ip - lit - 1) << 2)
                out += mv[lit:ip]
            else:
                _emit_literal(out, src, lit, ip)
        while True:
            offset = ip - cand
            diff = diffs.get(offset)
            if diff is None and len(diffs) < repeat_max:
                n_uses = uses.get(offset, 0) + 1
                uses[offset] = n_uses
                if n_uses >= _REPEAT_USES:
                    if whole is None:
                        whole = from_bytes(src, "little")
                    diff = (whole ^ (whole >> (offset << 3))).to_bytes(end, "little")[:end - offset]
                    diffs[offset] = diff
            # b: where the match at ip ends.
            if diff is not None:
                # diff[i] is src[i + offset] ^ src[i]: the match ends where its run of zeros does.
                b = zeros(diff, ip - offset + 4).end() + offset
            elif bytewise:
                # Extend the match byte by byte: PyPy's JIT makes this loop the fastest.
                a = cand + 4
                b = ip + 4
                while b < end and src[a] == src[b]:
                    a += 1
                    b += 1
            else:
                # CPython: the lowest set bit of the XOR of two windows (read as
                # little-endian ints) is the first differing byte.
                a = cand + 4
                b = ip + 4
                window = 32
                while b < end:
                    if b + window > end:
                        window = end - b
                    x = from_bytes(src[a:a + window], "little") ^ from_bytes(src[b:b + window], "little")
                    if x:
                        b += ((x & -x).bit_length() - 1) >> 3
                        break
                    a += window
                    b += window
                    window <<= 1
            size = b - ip
            if size < 12 and offset < 2048:
                out += _COPY1(1 | ((size - 4) << 2) | ((offset >> 8) << 5), offset & 0xFF)
            elif size <= 64:
                out += _COPY2(2 | ((size - 1) << 2), offset)
            else:
                _emit_copy(out, offset, size)
            ip = lit = b
            if ip >= limit:
                break
            if diff is not None:
                # Follow the offset across a gap of a few literal bytes: the
                # match resumes at the next run of zeros in diff.
                followed += size
                i = diff.find(_RESUME, b - offset + 1, b - offset + 1 + _REPEAT_GAP + _REPEAT_RUN)
                if i >= 0 and i + offset < limit:
                    ip = i + offset
                    gap_bytes += ip - b
                    if followed < _REPEAT_TRIAL or gap_bytes * _REPEAT_WORTH <= followed:
                        out.append((ip - b - 1) << 2)
                        out += mv[b:ip]
                        lit = ip
                        cand = ip - offset
                        continue
                    # Not rigid records: the literals would hide shorter matches.
                    diffs.clear()
                    repeat_max = 0
                    ip = b
            # Remember ip - 1 and try ip at once, as the reference does.
            ip1 = ip - 1
            table[words[ip1 & 3][ip1 >> 2]] = ip1
            word = words[ip & 3][ip >> 2]
            cand = get(word)
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
    if n <= FRAGMENT:
        if n:
            _compress_fragment(src, out)
    else:
        for base in range(0, n, FRAGMENT):
            _compress_fragment(src[base:base + FRAGMENT], out)
    return bytes(out)
