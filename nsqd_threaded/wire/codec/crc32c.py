"""CRC-32C (Castagnoli), as the snappy framing format checksums each chunk.

Pure Python; the classic byte-at-a-time table loop is slow on CPython (one
interpreted step per byte), so two faster methods:

- Short inputs, by words: the data is read as little-endian 64-bit words
  (one memoryview cast) and each word is folded in with four lookups in
  16-bit tables (slicing-by-8 with the byte tables merged pairwise).
- Longer inputs, by columns: CRC is linear, so the data is cut into blocks
  of ``L`` bytes and each block's own contribution (its CRC from a zero
  register) is the XOR of one table entry per byte, the table depending
  only on the byte's column.  Column ``j`` of all blocks is one strided
  slice; ``bytes.translate`` maps it through that column's table (split
  into four byte planes), the four planes are joined and read as one big
  integer, and those of all columns are XORed: all in C, 8 Python
  operations per column whatever the length.  Then one short loop chains
  the blocks (the register advanced over ``L`` bytes, two lookups in
  16-bit tables, XOR the block's contribution).

docs/performance.md has the rates of the three methods.

Tables are built on first use (a few tens of ms), not at import.
"""

import sys
import threading
from array import array

POLY = 0x82F63B78  # reflected Castagnoli polynomial
_LITTLE = sys.byteorder == "little"
_PYPY = sys.implementation.name == "pypy"


def _byte_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
        table.append(c)
    return table


BYTE_TABLE = tuple(_byte_table())


def _zero_tables(count):
    """tables[k][b]: the register after byte b then k zero bytes, from zero."""
    t = BYTE_TABLE
    tables = [list(t)]
    for _ in range(count - 1):
        tables.append([(c >> 8) ^ t[c & 0xFF] for c in tables[-1]])
    return tables


class _Columns:
    """Tables of the column method for blocks of ``block`` bytes."""

    def __init__(self, block, zero_tables):
        self.block = block
        # Column j's byte is followed by block-1-j bytes; its table as 4 byte planes.
        self.planes = tuple(
            tuple(bytes((v >> shift) & 0xFF for v in zero_tables[block - 1 - j])
                  for shift in (0, 8, 16, 24))
            for j in range(block))
        # Advancing the register over a block: its byte i acts like data byte i;
        # two bytes per lookup.
        z = [zero_tables[block - 1 - i] for i in range(4)]
        self.advance = (array("I", [z[0][v & 0xFF] ^ z[1][v >> 8] for v in range(65536)]),
                        array("I", [z[2][v & 0xFF] ^ z[3][v >> 8] for v in range(65536)]))


class _Tables:
    """All the tables, built once per process on first use; immutable after."""

    lock = threading.Lock()  # guards the one-time build of ``built``
    built = None


# Column blocks of 128 bytes for long inputs, 32 for middling ones (less
# per-column work), the word loop below that: crossovers measured on CPython;
# PyPy's JIT runs the word loop well, so it switches later.
COLUMNS_BLOCK = 128
COLUMNS_MIN = 8192 if _PYPY else 4096
COLUMNS_MAX = 65536  # the column method's piece
SHORT_BLOCK = 32
SHORT_MIN = COLUMNS_MIN if _PYPY else 768


def _build():
    zero = _zero_tables(COLUMNS_BLOCK)
    wide = []  # the word loop's 16-bit tables; byte i of a word has 7-i bytes after it
    for lo in (0, 2, 4, 6):
        ta = zero[7 - lo]
        tb = zero[6 - lo]
        wide.append(array("I", [ta[i & 0xFF] ^ tb[i >> 8] for i in range(65536)]))
    return tuple(wide), _Columns(COLUMNS_BLOCK, zero), _Columns(SHORT_BLOCK, zero)


def _tables():
    built = _Tables.built
    if built is None:
        with _Tables.lock:
            if _Tables.built is None:
                _Tables.built = _build()
            built = _Tables.built
    return built


def _by_words(mv, crc, wide):
    """The register after ``mv`` (a memoryview of bytes) from register ``crc``."""
    n = len(mv)
    t = BYTE_TABLE
    if n >= 16 and _LITTLE:
        w0, w1, w2, w3 = wide
        whole = n & ~7
        for w in mv[:whole].cast("Q"):
            w ^= crc
            crc = w0[w & 0xFFFF] ^ w1[(w >> 16) & 0xFFFF] ^ w2[(w >> 32) & 0xFFFF] ^ w3[w >> 48]
        mv = mv[whole:]
    for b in mv:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def _by_columns(body, crc, columns):
    """The register after the whole blocks of ``body`` (bytes); returns (register, bytes used)."""
    size = columns.block
    count = len(body) // size
    if len(body) != count * size:
        body = body[:count * size]
    from_bytes = int.from_bytes
    join = b"".join
    acc = 0  # the planes of all blocks' contributions, byte plane k at bytes [k*count, (k+1)*count)
    for j, (t0, t1, t2, t3) in enumerate(columns.planes):
        column = body[j::size]
        acc ^= from_bytes(join((column.translate(t0), column.translate(t1),
                                column.translate(t2), column.translate(t3))), "little")
    planes = acc.to_bytes(4 * count, "little")
    blocks = bytearray(4 * count)  # each block's contribution, as native uint32
    blocks[0::4] = planes[:count]
    blocks[1::4] = planes[count:2 * count]
    blocks[2::4] = planes[2 * count:3 * count]
    blocks[3::4] = planes[3 * count:]
    lo, hi = columns.advance
    for c in memoryview(blocks).cast("I"):
        crc = lo[crc & 0xFFFF] ^ hi[crc >> 16] ^ c
    return crc, count * size


def crc32c(data, crc=0):
    """CRC-32C of ``data`` (bytes-like), continuing from a previous result ``crc``."""
    if type(data) is not bytes:
        data = bytes(data)  # one C copy; a cast memoryview is slow to slice on PyPy
    wide, columns, short = _tables()
    crc ^= 0xFFFFFFFF
    n = len(data)
    pos = 0
    if n >= SHORT_MIN and _LITTLE:
        if n >= COLUMNS_MIN:
            # At most 64 KiB at a time: PyPy's int.from_bytes is quadratic in the length.
            while n - pos >= COLUMNS_MIN:
                piece = data if n <= COLUMNS_MAX else data[pos:pos + COLUMNS_MAX]
                crc, used = _by_columns(piece, crc, columns)
                pos += used
        if n - pos >= SHORT_MIN:
            crc, used = _by_columns(data[pos:] if pos else data, crc, short)
            pos += used
    return _by_words(memoryview(data)[pos:], crc, wide) ^ 0xFFFFFFFF


def masked(crc):
    """The snappy framing format's masked checksum of a CRC-32C."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
