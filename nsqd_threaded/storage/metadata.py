"""nsqd.dat: the topics, channels and pause states that survive a restart.

The format is Go nsqd's, byte for byte, so a data directory moves between the
two: compact JSON, keys ``topics`` then ``version``; ``"channels":null`` for
a topic without (non-ephemeral) channels and ``"topics":null`` for none;
ephemeral topics and channels are never written.

Beyond Go's format, a channel with a delivery policy of its own (see
docs/policies.md) carries it in a ``"policy"`` key, which Go nsqd's decoder
ignores (and drops when it rewrites the file); a channel without has none,
so a data directory without policies is written byte for byte as Go does.
"""

import json
import os

from .files import fsync_dir, replace_atomically

FILE_NAME = "nsqd.dat"


def encode(topics, version):
    """``topics``: iterable of ``(name, paused, [(channel, paused[, policy]), ...])``; a channel's
    ``policy`` is a JSON object (a dict), written when given and not None."""
    docs = []
    for name, paused, channels in topics:
        if name.endswith("#ephemeral"):
            continue
        chans = []
        for c in channels:
            if c[0].endswith("#ephemeral"):
                continue
            chans.append({"name": c[0], "paused": c[1]})
            if len(c) > 2 and c[2] is not None:
                chans[-1]["policy"] = c[2]
        docs.append({"name": name, "paused": paused, "channels": chans or None})
    return json.dumps({"topics": docs or None, "version": version}, separators=(",", ":")).encode()


def decode(data):
    """Inverse of :func:`encode`, a channel as ``(name, paused, policy)`` (``policy`` None when the
    entry has none); unknown keys are ignored, bad entries raise ValueError."""
    doc = json.loads(data.decode("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("metadata is not a JSON object")
    out = []
    for t in doc.get("topics") or []:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ValueError("invalid topic entry %r" % (t,))
        channels = []
        for c in t.get("channels") or []:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise ValueError("invalid channel entry %r" % (c,))
            policy = c.get("policy")
            if policy is not None and not isinstance(policy, dict):
                raise ValueError("invalid channel policy %r" % (policy,))
            channels.append((c["name"], bool(c.get("paused")), policy))
        out.append((t["name"], bool(t.get("paused")), channels))
    return out


def write_atomic(path, data):
    """Temp file, fsync, rename over ``path``, fsync the directory; or, when ``path`` already
    holds exactly ``data``, only the two fsyncs.

    A broker writes nsqd.dat as it starts and as it stops, most often with the bytes it
    read (or wrote) a moment before.  Rewriting those costs two journal commits (several
    milliseconds each on a disk); fsyncing the file and its directory instead keeps the same
    promise (these bytes under this name survive power loss) and costs next to nothing when
    they are durable already.  The broker holds the data path's lock, so no one else
    replaces the file between the comparison and the fsyncs.
    """
    if read(path) == data:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(os.path.dirname(path))
            return
    replace_atomically(path, data, sync_dir=True)


def read(path):
    """The file's content, or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
