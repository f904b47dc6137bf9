"""The inside of one broker, as a document: what ``GET /debug/state`` answers.

Topics -> channels -> clients, with each queue's memory part and its backend
(for a disk queue: file numbers, read and write positions, writes since the
last fsync), each channel's in-flight messages in deadline order and its
deferred messages by due time (the first :data:`LIST_LIMIT` of each, with
totals), and the process's threads with where each one is waiting.

Message bodies are left out unless the caller passes ``bodies``, a
predicate deciding per topic and per channel (the HTTP route builds it from
``--debug-state-bodies`` and the auth server's answer); each topic and
channel says in ``bodies`` whether its lists carry them.

Read-only and off the hot path: each topic's and channel's lock is held just
long enough to copy figures and bounded lists (``Topic.inside``,
``Channel.inside``); the document is built after the locks are released.
Nothing runs unless it is asked for.
"""

import os
import sys
import threading

from ..settings.options import VERSION
from ..wire.message import RECORD_HEADER, Message

LIST_LIMIT = 100  # messages listed per queue (in flight, deferred, memory)
BODY_PREVIEW = 32  # bytes of a message body shown

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hex_id(msg_id):
    return msg_id.decode("ascii", "replace") if isinstance(msg_id, bytes) else str(msg_id)


def body_preview(body):
    """A body as /debug/state (and a peek) shows it: its first BODY_PREVIEW bytes as text."""
    text = bytes(body[:BODY_PREVIEW]).decode("utf-8", "replace")
    return text + ("..." if len(body) > BODY_PREVIEW else "")


def _queued(item):
    """A memory-queue entry (a Message, or a topic's packed record) -> (id, attempts, body)."""
    if isinstance(item, Message):
        return item.id, item.attempts, item.body
    _, attempts, msg_id = RECORD_HEADER.unpack_from(item)
    return msg_id, attempts, item[RECORD_HEADER.size:]


def _message_doc(msg_id, attempts, body, show_body, **extra):
    doc = {"id": _hex_id(msg_id), "attempts": attempts}
    if show_body:
        doc["body"] = body_preview(body)
    doc.update(extra)
    return doc


def _channel_state(channel, topic_name, now_ns, limit, bodies):
    raw = channel.inside(limit)  # the channel's lock is held only in there
    show = bodies is not None and bodies(topic_name, channel.name)
    doc = {"name": channel.name}
    for key in ("paused", "message_count", "requeue_count", "timeout_count", "memory_depth", "backend"):
        doc[key] = raw[key]
    doc["depth"] = raw["memory_depth"] + raw["backend"].get("depth", 0)
    doc["bodies"] = show
    doc["memory"] = [_message_doc(*_queued(item), show) for item in raw["memory"]]
    doc["in_flight_count"] = raw["in_flight_count"]
    doc["in_flight"] = [
        _message_doc(mid, attempts, body, show, client_id=client_id, deadline_in_ms=(expiry - now_ns) // 1000000)
        for mid, attempts, body, client_id, expiry in raw["in_flight"]
    ]
    doc["deferred_count"] = raw["deferred_count"]
    doc["deferred"] = [_message_doc(mid, attempts, body, show, due_in_ms=(due - now_ns) // 1000000)
                       for mid, attempts, body, due in raw["deferred"]]
    doc["clients"] = [_client_state(c) for c in raw["clients"]]
    return doc


def _client_state(client):
    # Plain attribute reads: each is one consistent value; together they are a moment's picture.
    return {
        "id": client.id,
        "remote_address": client.remote_address,
        "client_id": client.client_id,
        "hostname": client.hostname,
        "user_agent": client.user_agent,
        "ready_count": client.ready_count,
        "in_flight_count": client.in_flight_count,
        "message_count": client.message_count,
        "finish_count": client.finish_count,
        "requeue_count": client.requeue_count,
        "msg_timeout_ms": client.msg_timeout_ns // 1000000,
        "tls": client.tls,
        "deflate": client.deflate,
        "snappy": client.snappy,
    }


def _topic_state(topic, now_ns, limit, bodies):
    raw = topic.inside(limit)  # the topic's lock is held only in there
    show = bodies is not None and bodies(topic.name, "")
    doc = {"name": topic.name}
    for key in ("paused", "message_count", "message_bytes", "memory_depth", "backend"):
        doc[key] = raw[key]
    doc["depth"] = raw["memory_depth"] + raw["backend"].get("depth", 0)
    doc["bodies"] = show
    doc["memory"] = [_message_doc(*_queued(item), show) for item in raw["memory"]]
    doc["channels"] = sorted((_channel_state(c, topic.name, now_ns, limit, bodies) for c in raw["channels"]),
                             key=lambda c: c["name"])
    return doc


def _where(frame):
    """``(top, ours)``: the innermost frame, and the innermost frame in this package (what it waits for)."""
    if frame is None:
        return "", ""
    top = "%s (%s:%d)" % (frame.f_code.co_name, os.path.basename(frame.f_code.co_filename), frame.f_lineno)
    f = frame
    while f is not None:
        if f.f_code.co_filename.startswith(_PACKAGE_DIR):
            return top, "%s (%s:%d)" % (f.f_code.co_name, os.path.relpath(f.f_code.co_filename, _PACKAGE_DIR),
                                        f.f_lineno)
        f = f.f_back
    return top, ""


def threads_state():
    """Every thread of the process: name, and where it is (``sys._current_frames``, where the runtime has it)."""
    current_frames = getattr(sys, "_current_frames", None)
    frames = current_frames() if current_frames is not None else {}
    out = []
    for thread in threading.enumerate():
        top, ours = _where(frames.get(thread.ident))
        out.append({"name": thread.name, "daemon": thread.daemon, "top": top, "waiting_in": ours})
    del frames
    out.sort(key=lambda t: t["name"])
    return out


def broker_state(nsqd, limit=LIST_LIMIT, bodies=None):
    """The document of ``GET /debug/state`` for one NSQD.

    Without ``bodies`` no message body is in it.  ``bodies(topic, channel)``
    (``channel`` empty for the topic's own queue) says whether that queue's
    messages show the first :data:`BODY_PREVIEW` bytes of their bodies; it is
    called once per topic and per channel, without any lock held.
    """
    now_ns = nsqd.clock.time_ns()  # the broker's clock: deadlines are on it
    topics = sorted(nsqd.topics(), key=lambda t: t.name)
    return {
        "version": VERSION,
        "now_ns": now_ns,
        "start_time": int(nsqd.start_time),
        "list_limit": limit,
        "mem_queue_size": nsqd.options.mem_queue_size,
        "msg_timeout_ms": int(nsqd.options.msg_timeout * 1000),
        "topics": [_topic_state(t, now_ns, limit, bodies) for t in topics],
        "threads": threads_state(),
    }
