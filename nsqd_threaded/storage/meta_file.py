"""The disk queue's metadata file (``<name>.diskqueue.meta.dat``), in go-diskqueue's text format.

Five integers: the depth, then the read and the write position (file
number, offset), written as ``"%d\n%d,%d\n%d,%d\n"`` and read the way Go's
``Fscanf`` reads them.
"""

import re

_META_INT = re.compile(rb"[ \t]*([+-]?[0-9]+)")


def parse_meta(data):
    """Parse metadata as Go's ``Fscanf("%d\\n%d,%d\\n%d,%d\\n")`` does.

    Returns ``(fields, error)``: the integers parsed before the first
    mismatch (up to 5: depth, read file, read pos, write file, write pos) and
    None or a description of the mismatch.
    """
    fields = []
    pos = 0
    for sep in (b"\n", b",", b"\n", b",", b"\n"):
        m = _META_INT.match(data, pos)
        if not m:
            return fields, "expected integer at byte %d" % pos
        fields.append(int(m.group(1)))
        pos = m.end()
        if data[pos : pos + 1] != sep:
            if sep == b"\n" and len(fields) == 5 and pos == len(data):
                break  # a missing final newline is accepted
            return fields, "unexpected %r at byte %d" % (data[pos : pos + 1], pos)
        pos += 1
    return fields, None


def format_meta(depth, read_file_num, read_pos, write_file_num, write_pos):
    return b"%d\n%d,%d\n%d,%d\n" % (depth, read_file_num, read_pos, write_file_num, write_pos)
