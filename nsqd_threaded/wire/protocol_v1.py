"""The nsqlookupd TCP protocol "V1", as pure functions: no sockets here.

A peer (an nsqd) sends the magic ``b"  V1"``, then command lines
``NAME[ param]*\\n``; IDENTIFY is followed by a 4-byte big-endian signed
length and a JSON body.  Every command gets one response, ``int32 BE length +
data`` with no frame type; an error is sent the same way as
``<CODE> <description>`` and then the connection is closed (every V1 error
is fatal).

nsqlookupd's connection loop (:mod:`nsqd_threaded.lookupd.tcp`) reads bytes and calls these functions;
they return responses or raise :class:`V1Error`.
"""

import json

from ..internal.gocompat import go_json, go_json_unmarshal
from .protocol_v2 import decode_size, encode_size, is_valid_name  # V1 sizes are V2's: int32 big-endian

MAGIC_V1 = b"  V1"
PING = b"PING\n"

# A command line longer than this (without its newline) closes the connection.
# nsqlookupd has no limit (its reader grows without bound); nsqd's longest
# line, "UNREGISTER <64-byte topic> <64-byte channel>", is under 150 bytes.
MAX_LINE = 64 * 1024

# The largest IDENTIFY body accepted.  nsqlookupd allocates whatever size is
# announced (a negative one crashes it); nsqd's body is ~150 bytes.
MAX_IDENTIFY_BODY = 1024 * 1024


# Go's unicode.IsSpace, which strings.TrimSpace uses (Python's str.strip also
# strips \x1c-\x1f, which Go keeps).
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


class V1Error(Exception):
    """A client error: sent as ``CODE description``, then the connection is closed."""

    def __init__(self, code, description):
        super().__init__(code, description)
        self.code = code
        self.description = description

    def __str__(self):
        return "%s %s" % (self.code, self.description)

    def response(self):
        """The error's bytes on the wire (size prefix included)."""
        return encode_response(str(self).encode("utf-8", "surrogateescape"))


def encode_response(data):
    """``int32 BE len(data) + data``: a V1 response, success or error alike."""
    return encode_size(len(data)) + data


OK = encode_response(b"OK")
BAD_PROTOCOL = encode_response(b"E_BAD_PROTOCOL")


def parse_line(line):
    """A command line (bytes, newline included or not) -> its params as str.

    As nsqlookupd: trimmed of (Unicode) whitespace at both ends, then split on
    every single space, so ``b"  PING  \\r\\n"`` is ``["PING"]`` and an empty
    line is ``[""]``.  Bytes that are not UTF-8 survive as surrogate escapes.
    """
    return line.decode("utf-8", "surrogateescape").strip(_GO_SPACE).split(" ")


def topic_channel(command, params):
    """REGISTER/UNREGISTER's ``(topic, channel)`` (channel ``""`` when absent); extra params are ignored."""
    if not params:
        raise V1Error("E_INVALID", "%s insufficient number of params" % command)
    topic = params[0]
    channel = params[1] if len(params) >= 2 else ""
    if not is_valid_name(topic):
        raise V1Error("E_BAD_TOPIC", "%s topic name '%s' is not valid" % (command, topic))
    if channel and not is_valid_name(channel):
        raise V1Error("E_BAD_CHANNEL", "%s channel name '%s' is not valid" % (command, channel))
    return topic, channel


def check_identify_size(size):
    """The announced IDENTIFY body size; a size nsqlookupd could not read is a read failure."""
    if size < 0 or size > MAX_IDENTIFY_BODY:
        raise V1Error("E_BAD_BODY", "IDENTIFY failed to read body")


# PeerInfo's JSON fields (keys folded as Go's encoding/json matches them) -> type.
PEER_FIELDS = {
    "remote_address": str,
    "hostname": str,
    "broadcast_address": str,
    "tcp_port": int,
    "http_port": int,
    "version": str,
    "topology_zone": str,
    "topology_region": str,
}

def decode_peer_info(body):
    """An IDENTIFY body -> the PeerInfo fields it sets (a dict), as Go's json.Unmarshal would.

    Go's decoding rules are :func:`~nsqd_threaded.internal.gocompat.go_json_unmarshal`'s
    (a float or an out-of-range integer for a port fails the whole decode);
    then the required fields are checked.  Raises V1Error(E_BAD_BODY).
    """
    try:
        fields = go_json_unmarshal(body, PEER_FIELDS)
    except ValueError:
        raise V1Error("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
    if not fields.get("broadcast_address") or not fields.get("tcp_port") or not fields.get("http_port"):
        raise V1Error("E_BAD_BODY", "IDENTIFY missing fields")
    if not fields.get("version"):
        raise V1Error("E_BAD_BODY", "IDENTIFY missing fields")
    return fields


def identify_response(broadcast_address, hostname, tcp_port, http_port, version, http_socket=None):
    """The IDENTIFY reply (a Go map: keys sorted), size prefix included.

    ``http_socket`` (not in Go's reply, which Go's nsqd ignores): the unix
    socket of a lookupd's HTTP API, whose ``http_port`` is -1, so that an
    nsqd on the same host can still ask it for a new topic's channels.
    """
    doc = {
        "broadcast_address": broadcast_address,
        "hostname": hostname,
        "http_port": http_port,
        "tcp_port": tcp_port,
        "version": version,
    }
    if http_socket is not None:
        doc["http_socket"] = http_socket
    return encode_response(go_json({k: doc[k] for k in sorted(doc)}).encode("utf-8"))


# -- nsqd's side: the commands it sends, the replies it reads -------------------------


def encode_identify(doc):
    """``IDENTIFY\\n`` + size + body: a Go map marshalled, so keys sorted and compact."""
    body = go_json({k: doc[k] for k in sorted(doc)}).encode("utf-8")
    return b"IDENTIFY\n" + encode_size(len(body)) + body


def encode_register(topic, channel=""):
    """``REGISTER t`` (a topic without channels) or ``REGISTER t c``."""
    return _topic_command(b"REGISTER", topic, channel)


def encode_unregister(topic, channel=""):
    return _topic_command(b"UNREGISTER", topic, channel)


def _topic_command(name, topic, channel):
    params = name + b" " + topic.encode("utf-8")
    if channel:
        params += b" " + channel.encode("utf-8")
    return params + b"\n"


def command_text(cmd):
    """A command as Go's logs show it: its line without the newline or body."""
    return cmd.split(b"\n", 1)[0].decode("utf-8", "replace")


def decode_response_size(raw4, limit):
    """Size of a V1 response from its 4-byte header; ValueError when it is over ``limit`` (or negative)."""
    size = decode_size(raw4)
    if size > limit or size < 0:
        raise ValueError("response body size (%d) is greater than limit (%d)" % (size, limit))
    return size


def registrations(topics):
    """The commands that register ``topics`` (``[(topic, [channel, ...])]``) on a fresh connection."""
    cmds = []
    for topic, channels in topics:
        if not channels:
            cmds.append(encode_register(topic))
        else:
            cmds.extend(encode_register(topic, c) for c in channels)
    return cmds


def parse_peer_info(data):
    """The IDENTIFY reply's fields nsqd keeps; ValueError when it is not a JSON object."""
    doc = json.loads(data.decode("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")

    def port(key):
        v = doc.get(key, 0)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    def text(key):
        v = doc.get(key, "")
        return v if isinstance(v, str) else ""

    return {
        "tcp_port": port("tcp_port"),
        "http_port": port("http_port"),
        "version": text("version"),
        "broadcast_address": text("broadcast_address"),
        "http_socket": text("http_socket"),  # "" from Go's lookupd, or one on TCP
    }
