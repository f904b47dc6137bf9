"""A channel's next messages, for admins: nsqadmin's ``GET /api/peek/<topic>/<channel>`` (not in Go nsqadmin).

Each node that has the topic is asked for ``/channel/peek`` (a broker run
with ``--channel-peek``) through nsqadmin's own request, and only that answer
is ever read for bodies: a body in a node's ``/stats`` or ``/debug/state``
never becomes a peeked message.  Each message is copied field by field,
keeping a field only when it has the type the broker gives it, so nothing
else a node sends reaches the page.  As the inside view, nsqadmin sends no
``X-NSQ-Auth-Secret``: a broker with ``--auth-http-address`` refuses it, and
the node says so.
"""

import json
from urllib.parse import urlencode

from . import cluster

PEEK_COUNT = 20  # the messages asked of each node: the next few, not a dump of the queue

# A node's peek: "on" (its messages), "off" (no --channel-peek), "refused" (its auth wants a secret),
# "absent" (it has the topic but not the channel; left out of the answer), "failed" (anything else).
PEEK_STATES = ("on", "off", "refused", "absent", "failed")

# field -> the type the broker gives it; anything else is dropped
_MESSAGE_FIELDS = (("id", str), ("attempts", int), ("timestamp", int), ("body", str), ("state", str),
                   ("due_ns", int))


# a dead letter's provenance (``dead_letter``, see nsqd_threaded.broker.provenance): field -> type
_DEAD_LETTER_FIELDS = (("topic", str), ("channel", str), ("reason", str), ("attempts", int), ("id", str),
                       ("timestamp", int), ("at", int))


def _known_fields(item, fields):
    out = {}
    for key, kind in fields:
        value = item.get(key)
        if isinstance(value, kind) and not isinstance(value, bool):
            out[key] = value
    return out


def peek_message(item):
    """A peeked message as the broker sent it, keeping only its known fields of the right type (a dead
    letter's ``dead_letter`` object likewise)."""
    if not isinstance(item, dict):
        return None
    out = _known_fields(item, _MESSAGE_FIELDS)
    dead_letter = item.get("dead_letter")
    if isinstance(dead_letter, dict):
        out["dead_letter"] = _known_fields(dead_letter, _DEAD_LETTER_FIELDS)
    return out


def _message_of(data):
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError:
        return ""
    m = doc.get("message") if isinstance(doc, dict) else None
    return m if isinstance(m, str) else ""


def peek_node(client, address, topic, channel, n=PEEK_COUNT):
    """``{"peek": state, "messages": [...], "error": text}`` of one node (see PEEK_STATES)."""
    path = "/channel/peek?" + urlencode({"topic": topic, "channel": channel, "n": n})
    status, data = client.request("GET", address, path)
    if status == 200:
        try:
            doc = json.loads(data.decode("utf-8"))
        except ValueError:
            return {"peek": "failed", "messages": [], "error": "response is not JSON"}
        items = doc.get("messages") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            return {"peek": "failed", "messages": [], "error": "malformed answer: messages is not a list"}
        messages = [m for m in (peek_message(i) for i in items[:n]) if m is not None]
        return {"peek": "on", "messages": messages, "error": ""}
    message = _message_of(data)
    if status == 404 and message in ("TOPIC_NOT_FOUND", "CHANNEL_NOT_FOUND"):
        return {"peek": "absent", "messages": [], "error": message}
    if status == 404:
        return {"peek": "off", "messages": [], "error": ""}
    if status in (401, 403):
        return {"peek": "refused", "messages": [], "error": message or str(status)}
    return {"peek": "failed", "messages": [], "error": "got response %d %s" % (status, message)}


def channel_peek(admin, topic, channel, n=PEEK_COUNT):
    """The next ``n`` messages of a channel on each node that has it, in the nodes' order."""
    producers, g1 = admin.cluster.topic_producers(topic)
    names = {cluster.producer_address(p): cluster.http_address(p) for p in producers}
    g2 = cluster.gather(list(names), lambda a: peek_node(admin.client, a, topic, channel, n), "nsqadmin-peek")
    nodes = []
    for address in sorted(names, key=lambda a: names[a]):
        if address in g2.results:
            row = g2.results[address]
            if row["peek"] == "absent":
                continue
        else:
            row = {"peek": "failed", "messages": [], "error": str(g2.errors.get(address, ""))}
        row["node"] = names[address]
        nodes.append(row)
    return {"topic": topic, "channel": channel, "n": n, "nodes": nodes}, g1
