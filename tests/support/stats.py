"""Helpers of the /stats tests: golden documents and the schema they follow.

Golden files (tests/support/golden/), written from http-api.md §8.1 and §8.2:

* ``stats_schema.json``: for every JSON object kind (top level, topic, channel,
  client, pub count, e2e, percentile, memory), its keys in order with their
  types and omission rules.  ``check_schema`` applies it to every document
  fetched by the tests.
* ``stats_*.json``: whole documents for given scenarios, compared key by key
  (same keys, same order, same JSON types, same values).  Placeholders stand
  for volatile values: ``"<int>"``, ``"<number>"``, ``"<string>"`` and
  ``"<address>"`` (a local ``ip:port``).
* ``stats_text_input.json`` / ``stats_text_expected.txt``: a hand-made snapshot
  and its text rendering, written with the §8.2 format strings.
"""

import datetime
import json
import pathlib
import re

from support.http_api import assert_text

GOLDEN = pathlib.Path(__file__).parent / "golden"


SCHEMA = json.loads((GOLDEN / "stats_schema.json").read_text())


UPTIME_RE = r"(?:(?:\d+h)?(?:\d+m)?\d+(?:\.\d+)?s|\d+(?:\.\d+)?(?:ms|µs|ns))"


CONNECTED_RE = r"(?:\d+h\d+m\d+s|\d+m\d+s|\d+s)"


HEADER_RE = (
    r"nsqd v1\.3\.0 \(built w/\S+\)\n"
    r"start_time (?P<start>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:\d\d))\n"
    r"uptime (?P<uptime>" + UPTIME_RE + r")\n"
)


def golden(name):
    return json.loads((GOLDEN / name).read_text())


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), "duplicate keys %r" % keys
    return dict(pairs)


def get_json(h, **params):
    """Raw /stats JSON: checked compact and duplicate-free, then decoded in key order."""
    params.setdefault("format", "json")
    query = "&".join("%s=%s" % kv for kv in params.items())
    r = h.get("/stats?" + query)
    assert r.status == 200
    assert r.headers["Content-Type"] == "application/json; charset=utf-8"
    assert r.headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    assert b"\n" not in r.body and b'": ' not in r.body and b", " not in r.body
    doc = json.loads(r.body, object_pairs_hook=_no_duplicate_keys)
    check_schema(doc)
    return doc, r.body


def get_text(h, **params):
    query = "&".join("%s=%s" % kv for kv in params.items())
    r = h.get("/stats" + ("?" + query if query else ""))
    assert_text(r, r.body)
    return r.body.decode()


def match_golden(actual, expected, path="$"):
    """``actual`` equals the golden ``expected``: same keys in the same order, same types and values."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), (path, actual)
        assert list(actual) == list(expected), (path, list(actual), list(expected))
        for key in expected:
            match_golden(actual[key], expected[key], "%s.%s" % (path, key))
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), (path, actual)
        for i, (a, e) in enumerate(zip(actual, expected)):
            match_golden(a, e, "%s[%d]" % (path, i))
    elif expected == "<int>":
        assert type(actual) is int, (path, actual)
    elif expected == "<number>":
        assert type(actual) in (int, float), (path, actual)
    elif expected == "<string>":
        assert type(actual) is str, (path, actual)
    elif expected == "<address>":
        assert type(actual) is str and re.fullmatch(r"127\.0\.0\.1:\d{1,5}", actual), (path, actual)
    else:
        assert type(actual) is type(expected) and actual == expected, (path, actual, expected)


def _check_type(value, typ, path):
    alternatives = typ.split("|")
    if value is None:
        assert "null" in alternatives, (path, "null not allowed")
        return
    kind = alternatives[0]
    if kind == "string":
        assert type(value) is str, (path, value)
    elif kind == "int":
        assert type(value) is int, (path, value)
    elif kind == "bool":
        assert type(value) is bool, (path, value)
    elif kind == "number":
        assert type(value) in (int, float), (path, value)
    elif kind.startswith("array:"):
        assert type(value) is list, (path, value)
        for i, item in enumerate(value):
            check_schema(item, kind[6:], "%s[%d]" % (path, i))
    elif kind.startswith("object:"):
        check_schema(value, kind[7:], path)
    else:
        raise AssertionError("bad schema type %r" % typ)


def check_schema(obj, kind="top", path="$"):
    """``obj`` follows stats_schema.json: known keys, schema order, required keys, omitempty, types."""
    assert type(obj) is dict, (path, obj)
    entries = SCHEMA[kind]
    order = [e[0] for e in entries]
    unknown = [k for k in obj if k not in order]
    assert not unknown, (path, unknown)
    positions = [order.index(k) for k in obj]
    assert positions == sorted(positions), (path, "key order", list(obj))
    for key, typ, *rule in entries:
        if key not in obj:
            assert rule, (path, "missing", key)
            continue
        value = obj[key]
        if rule == ["omitempty"]:
            assert value not in (0, "", False, None, []), (path, key, "omitempty key present with", value)
        _check_type(value, typ, "%s.%s" % (path, key))


# -- the text layout (§8.2), written independently from the format strings --


def spec_human(v):
    if v > 1e9:
        return "%0.1fs" % (v / 1e9)
    if v > 1e6:
        return "%0.1fms" % (v / 1e6)
    if v > 1e3:
        return "%0.1fus" % (v / 1e3)
    return "%0.1fns" % v


def spec_e2e(e2e):
    return ", ".join(spec_human(p["value"]) for p in e2e["percentiles"] or [])


CONNECTED = "\x00connected\x00"  # replaced by CONNECTED_RE


def spec_client(c):
    ident = "%s:%s %s" % (c["hostname"], c["remote_address"].rsplit(":", 1)[1], c["user_agent"])
    if c.get("pub_counts"):
        return "[V2 %-21s] msgs: %-8d topics: %s connected: %s" % (
            ident,
            sum(p["count"] for p in c["pub_counts"]),
            ",".join("%s=%d" % (p["topic"], p["count"]) for p in c["pub_counts"]),
            CONNECTED,
        )
    return "[V2 %-21s] state: %d inflt: %-4d rdy: %-4d fin: %-8d re-q: %-8d msgs: %-8d connected: %s" % (
        ident,
        c["state"],
        c["in_flight_count"],
        c["ready_count"],
        c["finish_count"],
        c["requeue_count"],
        c["message_count"],
        CONNECTED,
    )


def spec_body(doc):
    """The text after the three header lines, from a JSON document (memory excluded)."""
    out = "\nHealth: %s\n" % doc["health"]
    assert "memory" not in doc
    if not doc["topics"]:
        out += "\nTopics: None\n"
    else:
        out += "\nTopics:"
        for t in doc["topics"]:
            out += "\n%s[%-15s] depth: %-5d be-depth: %-5d msgs: %-8d e2e%%: %s\n" % (
                "*P " if t["paused"] else "   ",
                t["topic_name"],
                t["depth"],
                t["backend_depth"],
                t["message_count"],
                spec_e2e(t["e2e_processing_latency"]),
            )
            for c in t["channels"]:
                out += (
                    "%s[%-25s] depth: %-5d be-depth: %-5d inflt: %-4d def: %-4d re-q: %-5d timeout: %-5d "
                    "msgs: %-8d e2e%%: %s\n"
                    % (
                        "   *P " if c["paused"] else "      ",
                        c["channel_name"],
                        c["depth"],
                        c["backend_depth"],
                        c["in_flight_count"],
                        c["deferred_count"],
                        c["requeue_count"],
                        c["timeout_count"],
                        c["message_count"],
                        spec_e2e(c["e2e_processing_latency"]),
                    )
                )
                for cl in c["clients"] or []:
                    out += "        %s\n" % spec_client(cl)
    if not doc["producers"]:
        out += "\nProducers: None\n"
    else:
        out += "\nProducers:\n"
        for p in doc["producers"]:
            out += "   %s\n" % spec_client(p)
    return out


def assert_text_matches(text, doc):
    """``text`` is the §8.2 rendering of the JSON document ``doc`` (taken in the same steady state)."""
    m = re.match(HEADER_RE, text)
    assert m, text[:300]
    start = datetime.datetime.fromisoformat(m.group("start").replace("Z", "+00:00"))
    assert int(start.timestamp()) == doc["start_time"]
    body = re.escape(spec_body(doc)).replace(re.escape(CONNECTED), CONNECTED_RE)
    assert re.fullmatch(body, text[m.end() :]), "\n" + text[m.end() :] + "\n--- expected ---\n" + spec_body(doc)
