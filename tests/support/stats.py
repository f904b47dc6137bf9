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
import time

from nsqd_threaded.broker.stats import render_text_body

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


# -- the text layout (§8.2) --
#
# The golden pair stats_text_input.json / stats_text_expected.txt pins the
# layout independently; here a fetched JSON document is rendered with the
# broker's own function, to check that the text and the JSON say the same.


CONNECTED = "\x00connected\x00"  # replaced by CONNECTED_RE


def spec_body(doc):
    """The text after the three header lines, from a JSON document (memory excluded)."""
    assert "memory" not in doc
    return re.sub(r"connected: \S+\n", "connected: %s\n" % CONNECTED, render_text_body(doc, time.time()))


def assert_text_matches(text, doc):
    """``text`` is the §8.2 rendering of the JSON document ``doc`` (taken in the same steady state)."""
    m = re.match(HEADER_RE, text)
    assert m, text[:300]
    start = datetime.datetime.fromisoformat(m.group("start").replace("Z", "+00:00"))
    assert int(start.timestamp()) == doc["start_time"]
    body = re.escape(spec_body(doc)).replace(re.escape(CONNECTED), CONNECTED_RE)
    assert re.fullmatch(body, text[m.end() :]), "\n" + text[m.end() :] + "\n--- expected ---\n" + spec_body(doc)
