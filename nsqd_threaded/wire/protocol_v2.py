"""TCP protocol V2: parsing and encoding as pure functions.

Nothing in this module touches a socket.  The connection handler
(:mod:`nsqd_threaded.server.protocol_v2`) reads bytes and calls these functions; the
tests call them directly with byte strings.

Error texts and their fatal/non-fatal classification follow nsqd 1.3 exactly
(see ``../shared/spec/tcp-protocol.md`` section 5).
"""

import re
import struct

from ..internal.gocompat import go_json, go_json_unmarshal, ms

MAGIC_V2 = b"  V2"
MAX_LINE = 16384  # nsqd reads command lines through a 16 KiB bufio.Reader

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

MSG_ID_LENGTH = 16
#: The message header: timestamp (int64 ns), attempts (uint16), ID (16 bytes).
#: The one definition of the 26 bytes that start a message frame's payload and
#: a diskqueue record (a "record" is this header followed by the body).
MESSAGE_HEADER = struct.Struct(">qH16s")
MSG_HEADER_LENGTH = MESSAGE_HEADER.size  # 26

_FRAME_HEADER = struct.Struct(">ii")
_MSG_FRAME_HEADER = struct.Struct(">iiqH")  # size, type, then MESSAGE_HEADER's timestamp and attempts
_INT32 = struct.Struct(">i")

_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")

# Only these three error codes leave the connection open.
NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class ProtocolError(Exception):
    """An error answered with an error frame ``<code> <description>``.

    ``fatal`` errors close the connection after the frame is written.
    """

    def __init__(self, code, description):
        super().__init__(code, description)
        self.code = code
        self.description = description
        self.fatal = code not in NON_FATAL_CODES

    @property
    def data(self):
        return ("%s %s" % (self.code, self.description)).encode("utf-8", "surrogateescape")


def frame(frame_type, data):
    """Encode one frame: size(4) type(4) data."""
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def response_frame(data):
    return frame(FRAME_TYPE_RESPONSE, data)


def error_frame(error):
    return frame(FRAME_TYPE_ERROR, error.data)


OK_FRAME = response_frame(b"OK")
CLOSE_WAIT_FRAME = response_frame(b"CLOSE_WAIT")
HEARTBEAT_FRAME = response_frame(b"_heartbeat_")
BAD_PROTOCOL_FRAME = frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL")


def message_frames(msgs, limit):
    """The message frames of ``msgs``, joined into chunks of at least ``limit`` bytes
    (the last may be less; ``sys.maxsize``: one chunk).

    The one message frame encoder.  ``msgs`` have ``timestamp``, ``attempts``,
    ``id`` and ``body``.  A chunk is joined once from the frames' parts
    (header, ID, body), so no body is copied into an intermediate frame.
    """
    parts = []
    pending = 0
    header = _MSG_FRAME_HEADER.pack
    overhead = MSG_HEADER_LENGTH + 4  # the frame type, then the message header
    for msg in msgs:
        body = msg.body
        size = overhead + len(body)
        parts += (header(size, FRAME_TYPE_MESSAGE, msg.timestamp, msg.attempts), msg.id, body)
        pending += size
        if pending >= limit:
            yield b"".join(parts)
            parts = []
            pending = 0
    if parts:
        yield b"".join(parts)


def joined_message_frames(msgs):
    """The message frames of ``msgs`` as one bytes object: :func:`message_frames` with no
    limit, without its per-message count of the chunk's size."""
    header = _MSG_FRAME_HEADER.pack
    overhead = MSG_HEADER_LENGTH + 4
    if len(msgs) == 1:  # (a consumer at RDY 1: one per FIN)
        msg = msgs[0]
        body = msg.body
        return b"".join((header(overhead + len(body), FRAME_TYPE_MESSAGE, msg.timestamp, msg.attempts), msg.id, body))
    parts = []
    for msg in msgs:
        body = msg.body
        parts += (header(overhead + len(body), FRAME_TYPE_MESSAGE, msg.timestamp, msg.attempts), msg.id, body)
    return b"".join(parts)


def encode_message(timestamp, attempts, msg_id, body):
    """The message payload: the frame-type-2 data and the diskqueue record."""
    return MESSAGE_HEADER.pack(timestamp, attempts, msg_id) + body


def decode_message(data):
    """Inverse of :func:`encode_message`: ``(timestamp, attempts, id, body)``."""
    if len(data) < MSG_HEADER_LENGTH:
        raise ValueError("invalid message buffer size (%d)" % len(data))
    timestamp, attempts, msg_id = MESSAGE_HEADER.unpack_from(data, 0)
    return timestamp, attempts, msg_id, bytes(data[MSG_HEADER_LENGTH:])


def decode_frame(data):
    """Split one complete frame into ``(frame_type, payload)`` (for clients/tests)."""
    size, frame_type = _FRAME_HEADER.unpack_from(data, 0)
    return frame_type, bytes(data[8 : 4 + size])


def split_frames(buf):
    """Split as many complete frames as ``buf`` holds.

    Returns ``([(frame_type, payload), ...], consumed)``.
    """
    frames = []
    pos = 0
    n = len(buf)
    unpack = _FRAME_HEADER.unpack_from
    while n - pos >= 8:
        size, frame_type = unpack(buf, pos)
        if size < 4:
            raise ValueError("invalid frame size %d" % size)
        end = pos + 4 + size
        if end > n:
            break
        frames.append((frame_type, bytes(buf[pos + 8 : end])))
        pos = end
    return frames, pos


# -- command lines ---------------------------------------------------------


def parse_line(line):
    """Split a command line (without its ``\\n``) into params, as nsqd does.

    One trailing ``\\r`` is dropped, then the line is split on every single
    space: ``b"PUB  t"`` gives ``[b"PUB", b"", b"t"]``.
    """
    if line.endswith(b"\r"):
        line = line[:-1]
    return line.split(b" ")


def parse_uint(raw):
    """Go's ``protocol.ByteToBase10``: digits only, empty is 0.

    Returns None for anything else.  The result is wrapped like Go's int64
    arithmetic would be only by the callers that care (REQ clamps).
    """
    n = 0
    for b in raw:
        if not 48 <= b <= 57:
            return None
        n = n * 10 + (b - 48)
    return n


def int64(n):
    """Wrap an unbounded int to a signed 64-bit value, as Go's arithmetic does."""
    n &= 0xFFFFFFFFFFFFFFFF
    return n - (1 << 64) if n >= 1 << 63 else n


#: ``unpack_from(buffer, offset)``: a 4-byte signed size read in place.
decode_size_from = _INT32.unpack_from


def decode_size(raw4):
    """A 4-byte big-endian *signed* length (nsqd reads sizes as int32)."""
    return _INT32.unpack(raw4)[0]


def encode_size(n):
    return _INT32.pack(n)


def is_valid_name(name):
    """Topic/channel name rule: 1..64 bytes of ``[.a-zA-Z0-9_-]``, optional ``#ephemeral``."""
    if isinstance(name, bytes):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            return False
    return 0 < len(name) <= 64 and _NAME_RE.fullmatch(name) is not None


def text(raw):
    """Bytes from the wire as text for an error description."""
    return raw.decode("utf-8", "surrogateescape")


# -- body sizes ------------------------------------------------------------


def check_body_size(cmd, size, max_size, code="E_BAD_BODY"):
    """IDENTIFY / AUTH body size checks, in nsqd's order (too big, then <= 0)."""
    if size > max_size:
        raise ProtocolError(code, "%s body too big %d > %d" % (cmd, size, max_size))
    if size <= 0:
        raise ProtocolError(code, "%s invalid body size %d" % (cmd, size))


def check_message_size(cmd, size, max_msg_size):
    """PUB / DPUB body size checks, in nsqd's order (<= 0, then too big)."""
    if size <= 0:
        raise ProtocolError("E_BAD_MESSAGE", "%s invalid message body size %d" % (cmd, size))
    if size > max_msg_size:
        raise ProtocolError("E_BAD_MESSAGE", "%s message too big %d > %d" % (cmd, size, max_msg_size))


def check_mpub_body_size(size, max_body_size):
    if size <= 0:
        raise ProtocolError("E_BAD_BODY", "MPUB invalid body size %d" % size)
    if size > max_body_size:
        raise ProtocolError("E_BAD_BODY", "MPUB body too big %d > %d" % (size, max_body_size))


def check_mpub_count(count, max_body_size):
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise ProtocolError("E_BAD_BODY", "MPUB invalid message count %d" % count)


def parse_mpub_messages(buf, pos, end, index, count, max_msg_size, out, expected=None):
    """Parse MPUB items from ``buf[pos:end]`` (bytes or bytearray).

    Appends each complete body (as ``bytes``) to ``out`` and returns the
    position after the last complete item.  Stops early when the buffer ends
    mid-item; the caller reads more and calls again with ``index=len(out)``.
    Raises ProtocolError for a bad item size, exactly as nsqd words it (the
    MPUB fails as a whole: what ``out`` holds then is unspecified).

    ``expected``: how many bytes of items the caller expects from ``pos`` (the
    MPUB's body size less what was parsed).  Items are sliced from a bytes
    copy of the buffer, and it bounds the copy, so that commands pipelined
    after the MPUB are not copied with it; when the inner sizes, which nsqd
    trusts, say more, the items past it are read all the same.

    The Python work per item is the cost of an MPUB, so it is kept small:
    a run of items of one size (what a producer of fixed-size messages
    sends) is recognised by column, as :func:`fin_run` does for FINs (every
    item's 4-byte size read at once, one C-level comparison per byte of the
    size), and its bodies sliced with no per-item checks; other items are
    read one by one.
    """
    bounded = False
    if type(buf) is not bytes:  # (a bytearray: its slices are bytearrays)
        stop = end
        if expected is not None and 0 < expected < end - pos:
            stop, bounded = pos + expected, True
        with memoryview(buf) as mv:
            span = bytes(mv[pos:stop])
        base, whole_end, end = pos, end, stop - pos
        pos = 0
    else:
        span, base = buf, 0
    if count - index > 1 and end - pos >= 8:
        pos, index = _mpub_uniform_run(span, pos, end, index, count, max_msg_size, out)
    unpack = _INT32.unpack_from
    append = out.append
    while index < count and end - pos >= 4:
        size = unpack(span, pos)[0]
        if size <= 0:
            raise ProtocolError("E_BAD_MESSAGE", "MPUB invalid message(%d) body size %d" % (index, size))
        if size > max_msg_size:
            raise ProtocolError("E_BAD_MESSAGE", "MPUB message too big %d > %d" % (size, max_msg_size))
        stop = pos + 4 + size
        if stop > end:
            break
        append(span[pos + 4 : stop])
        pos = stop
        index += 1
    if bounded and index < count:
        # The inner sizes say more than the body size: read on past it, as nsqd does.
        return parse_mpub_messages(buf, base + pos, whole_end, index, count, max_msg_size, out)
    return base + pos


def _mpub_uniform_run(span, pos, end, index, count, max_msg_size, out):
    """The leading run of items whose size is the first one's, appended: ``(pos, index)`` after it."""
    size = _INT32.unpack_from(span, pos)[0]
    if not 0 < size <= max_msg_size:
        return pos, index  # (the item-by-item reading words the error)
    stride = 4 + size
    n = min(count - index, (end - pos) // stride)
    if n < 2:
        return pos, index
    stop = pos + n * stride
    # Column j holds byte j of every item's size: each must repeat the first item's.
    for j in range(4):
        if span[pos + j : stop : stride] != span[pos + j : pos + j + 1] * n:
            return pos, index  # (sizes differ: read one by one, from the start)
    out += [span[a : a + size] for a in range(pos + 4, stop, stride)]
    return stop, index + n


def encode_mpub_body(bodies):
    """Client side: the MPUB body for a list of message bodies."""
    parts = [_INT32.pack(len(bodies))]
    for b in bodies:
        parts.append(_INT32.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


# -- IDENTIFY --------------------------------------------------------------

# Field name -> kind.  Go's encoding/json matches keys case-insensitively.
_IDENTIFY_FIELDS = {
    "client_id": str,
    "hostname": str,
    "user_agent": str,
    "topology_region": str,
    "topology_zone": str,
    "heartbeat_interval": int,
    "output_buffer_size": int,
    "output_buffer_timeout": int,
    "sample_rate": "int32",
    "msg_timeout": int,
    "deflate_level": int,
    "feature_negotiation": bool,
    "tls_v1": bool,
    "deflate": bool,
    "snappy": bool,
}


def decode_identify(body):
    """Decode an IDENTIFY JSON body the way Go's encoding/json would.

    Returns a dict with only the known fields that were present and not null.
    Raises ProtocolError(E_BAD_BODY, "IDENTIFY failed to decode JSON body").
    Go semantics kept: keys match case-insensitively, a later duplicate key
    overrides an earlier one but ``null`` changes nothing, a type error
    anywhere fails the decode, NaN/Infinity are not JSON, a ``null`` document
    is a no-op, and invalid UTF-8 in strings becomes U+FFFD.
    """
    try:
        return go_json_unmarshal(body, _IDENTIFY_FIELDS)
    except ValueError:
        raise ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None


def negotiate_identify(fields, opts, client_timeout_ms=60000):
    """Validate decoded IDENTIFY fields against the broker's bounds.

    Returns the client's effective settings (a dict).  Validation order and
    texts follow nsqd: heartbeat, output buffer timeout, output buffer size,
    sample rate, msg timeout.  ``opts`` is an :class:`~nsqd_threaded.settings.options.Options`.
    """
    s = {}
    s["heartbeat_interval_ms"] = _negotiate(
        fields, "heartbeat_interval", "heartbeat interval", 0, client_timeout_ms // 2,
        1000, ms(opts.max_heartbeat_interval))
    s["output_buffer_timeout_ms"] = _negotiate(
        fields, "output_buffer_timeout", "output buffer timeout", 0, ms(opts.output_buffer_timeout),
        ms(opts.min_output_buffer_timeout), ms(opts.max_output_buffer_timeout))
    s["output_buffer_size"] = _negotiate(
        fields, "output_buffer_size", "output buffer size", 1, 16384, 64, opts.max_output_buffer_size)
    if fields.get("output_buffer_size") == -1:
        s["output_buffer_timeout_ms"] = 0  # no buffering: every write is flushed at once
    sr = fields.get("sample_rate", 0)
    if not 0 <= sr <= 99:
        raise _invalid("sample rate", sr)
    s["sample_rate"] = sr
    s["msg_timeout_ms"] = _negotiate(
        fields, "msg_timeout", "msg timeout", None, ms(opts.msg_timeout), 1000, ms(opts.max_msg_timeout))
    return s


def _negotiate(fields, name, what, off, default, low, high):
    """nsqd's rule for one IDENTIFY field: -1 asks for ``off`` (where ``off`` is not None),
    0 or absent for the broker's ``default``; any other value must lie in [low, high]
    (else E_BAD_BODY naming ``what``)."""
    value = fields.get(name, 0)
    if value == -1 and off is not None:
        return off
    if value == 0:
        return default
    if low <= value <= high:
        return value
    raise _invalid(what, value)


def _invalid(what, value):
    return ProtocolError("E_BAD_BODY", "IDENTIFY %s (%d) is invalid" % (what, value))


def deflate_level(negotiated, requested, max_level):
    """IDENTIFY's deflate_level: 6, or the requested level when deflate was
    negotiated and the request is > 0; then capped at --max-deflate-level
    (the cap applies even when deflate is off)."""
    level = 6
    if negotiated and requested > 0:
        level = requested
    return min(level, max_level)


def identify_response(settings, opts, tls_v1=False, deflate=False, snappy=False, deflate_level=6):
    """The feature-negotiation JSON, keys in nsqd's order, encoded like Go's encoding/json.

    ``deflate_level`` is the negotiated level (see :func:`deflate_level`).
    """
    level = min(deflate_level, opts.max_deflate_level)
    doc = {
        "max_rdy_count": opts.max_rdy_count,
        "version": opts.version,
        "max_msg_timeout": ms(opts.max_msg_timeout),
        "msg_timeout": settings["msg_timeout_ms"],
        "tls_v1": tls_v1,
        "deflate": deflate,
        "deflate_level": level,
        "max_deflate_level": opts.max_deflate_level,
        "snappy": snappy,
        "sample_rate": settings["sample_rate"],
        "auth_required": bool(opts.auth_http_addresses),
        "output_buffer_size": settings["output_buffer_size"],
        "output_buffer_timeout": settings["output_buffer_timeout_ms"],
        "topology_region": opts.topology_region,
        "topology_zone": opts.topology_zone,
    }
    return go_json(doc).encode("utf-8")


# A run of plain "FIN <16-byte id>\n" lines: ids without a space or a newline,
# not ending in "\r" (those would parse differently through parse_line).
_FIN_RUN = re.compile(rb"(?:FIN [^ \n]{15}[^ \n\r]\n)+")
FIN_LINE = 21  # bytes in a plain FIN line
# One plain FIN line (the group: the ID as bytes, one copy).
FIN_ONE = re.compile(rb"FIN ([^ \n]{15}[^ \n\r])\n")


def fin_run(buf, pos):
    """The message IDs of the plain FIN lines buffered at ``buf[pos:]``, and the position after them.

    A consumer sends one FIN per message; parsing a whole run with one regex
    match instead of line by line keeps its cost per message small.
    """
    # Usually everything buffered is FIN lines (and maybe the start of one):
    # checked column by column, each a C-level pass over the whole run; the
    # regex (a Python-visible cost per byte) only finds where a mixed run ends.
    count = (len(buf) - pos) // FIN_LINE
    if count == 1:  # (one line, as from a consumer at RDY 1: the regex alone, no column tests)
        m = FIN_ONE.match(buf, pos)
        if m is None:
            return [], pos
        return [m.group(1)], pos + FIN_LINE
    if count:
        run = bytes(buf[pos : pos + count * FIN_LINE])
        if (
            run[0::FIN_LINE] == b"F" * count
            and run[1::FIN_LINE] == b"I" * count
            and run[2::FIN_LINE] == b"N" * count
            and run.count(b" ") == count
            and run[3::FIN_LINE] == b" " * count
            and run.count(b"\n") == count
            and run[20::FIN_LINE] == b"\n" * count
            and b"\r" not in run[19::FIN_LINE]
        ):
            return _fin_ids(run), pos + len(run)
    m = _FIN_RUN.match(buf, pos)
    if m is None:
        return [], pos
    end = m.end()
    return _fin_ids(bytes(buf[pos:end])), end


def _fin_ids(run):
    """The IDs of a run of plain FIN lines: one C-level split, no slice per line in Python.
    (No ID holds a newline, so each separator is a line's end and the next line's "FIN ".)"""
    return run[4:-1].split(b"\nFIN ")
