"""The Prometheus exposition format, parsed strictly, and the check that /metrics agrees with /stats."""

import re

import pytest

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|Inf)\Z|NaN\Z")


TIMESTAMP = re.compile(r"-?[0-9]+\Z")


TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


SUFFIXES = {"summary": ("", "_sum", "_count"), "histogram": ("_bucket", "_sum", "_count")}
TOPIC_KEYS = {
    "nsq_topic_depth": "depth",
    "nsq_topic_backend_depth": "backend_depth",
    "nsq_topic_messages_total": "message_count",
    "nsq_topic_message_bytes_total": "message_bytes",
    "nsq_topic_paused": "paused",
}
CHANNEL_KEYS = {
    "nsq_channel_depth": "depth",
    "nsq_channel_backend_depth": "backend_depth",
    "nsq_channel_in_flight": "in_flight_count",
    "nsq_channel_deferred": "deferred_count",
    "nsq_channel_messages_total": "message_count",
    "nsq_channel_requeued_total": "requeue_count",
    "nsq_channel_timed_out_total": "timeout_count",
    "nsq_channel_clients": "client_count",
    "nsq_channel_paused": "paused",
}


class ExpositionError(AssertionError):
    pass


def _unescape_help(text, lineno):
    out = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt == "\\":
                out.append("\\")
            elif nxt == "n":
                out.append("\n")
            else:
                raise ExpositionError("line %d: invalid escape \\%s in HELP" % (lineno, nxt))
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _parse_labels(line, pos, lineno):
    """Parse ``{name="value",...}`` starting at ``line[pos] == "{"``; returns (labels, next pos)."""
    labels = {}
    pos += 1
    while True:
        if line[pos : pos + 1] == "}":
            return labels, pos + 1
        m = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*").match(line, pos)
        if not m:
            raise ExpositionError("line %d: bad label name at %d" % (lineno, pos))
        name = m.group(0)
        if name.startswith("__"):
            raise ExpositionError("line %d: reserved label name %s" % (lineno, name))
        if name in labels:
            raise ExpositionError("line %d: duplicate label %s" % (lineno, name))
        pos = m.end()
        if line[pos : pos + 2] != '="':
            raise ExpositionError("line %d: expected =\" after label %s" % (lineno, name))
        pos += 2
        value = []
        while True:
            if pos >= len(line):
                raise ExpositionError("line %d: unterminated label value" % lineno)
            ch = line[pos]
            if ch == '"':
                pos += 1
                break
            if ch == "\\":
                nxt = line[pos + 1 : pos + 2]
                if nxt not in ("\\", '"', "n"):
                    raise ExpositionError("line %d: invalid escape \\%s in label value" % (lineno, nxt))
                value.append("\n" if nxt == "n" else nxt)
                pos += 2
            else:
                value.append(ch)
                pos += 1
        labels[name] = "".join(value)
        if line[pos : pos + 1] == ",":
            pos += 1
        elif line[pos : pos + 1] != "}":
            raise ExpositionError("line %d: expected , or } after label %s" % (lineno, name))


def parse_prometheus(text):
    """Parse a 0.0.4 exposition strictly; returns {family: {"help", "type", "samples"}} in order.

    ``samples`` is a list of (sample_name, labels dict, float value).
    """
    if text and not text.endswith("\n"):
        raise ExpositionError("exposition does not end with a newline")
    families = {}
    current = None  # the family whose samples are being read
    finished = set()  # families whose sample block is over
    seen = set()
    for lineno, line in enumerate(text.split("\n")[:-1], 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) < 3 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE"):
                raise ExpositionError("line %d: unexpected comment %r" % (lineno, line))
            kind, name = parts[1], parts[2]
            if not METRIC_NAME.match(name):
                raise ExpositionError("line %d: invalid metric name %r" % (lineno, name))
            fam = families.setdefault(name, {"help": None, "type": None, "samples": []})
            if fam["samples"] or name in finished:
                raise ExpositionError("line %d: %s for %s after its samples" % (lineno, kind, name))
            if kind == "HELP":
                if fam["help"] is not None:
                    raise ExpositionError("line %d: second HELP for %s" % (lineno, name))
                fam["help"] = _unescape_help(parts[3] if len(parts) > 3 else "", lineno)
            else:
                if fam["type"] is not None:
                    raise ExpositionError("line %d: second TYPE for %s" % (lineno, name))
                if len(parts) != 4 or parts[3] not in TYPES:
                    raise ExpositionError("line %d: bad TYPE line %r" % (lineno, line))
                fam["type"] = parts[3]
            if current is not None and current != name:
                finished.add(current)
                current = None
            continue
        m = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*").match(line)
        if not m:
            raise ExpositionError("line %d: invalid sample %r" % (lineno, line))
        sample_name = m.group(0)
        pos = m.end()
        labels = {}
        if line[pos : pos + 1] == "{":
            labels, pos = _parse_labels(line, pos, lineno)
        rest = line[pos:]
        if not rest.startswith((" ", "\t")):
            raise ExpositionError("line %d: no blank before the value" % lineno)
        fields = rest.split()
        if len(fields) not in (1, 2) or not FLOAT.match(fields[0]):
            raise ExpositionError("line %d: bad value in %r" % (lineno, line))
        if len(fields) == 2 and not TIMESTAMP.match(fields[1]):
            raise ExpositionError("line %d: bad timestamp in %r" % (lineno, line))
        family = None
        for name, fam in families.items():
            for suffix in SUFFIXES.get(fam["type"], ("",)):
                if sample_name == name + suffix:
                    family = name
        if family is None:
            raise ExpositionError("line %d: sample %s has no HELP/TYPE before it" % (lineno, sample_name))
        fam = families[family]
        if fam["help"] is None or fam["type"] is None:
            raise ExpositionError("line %d: family %s lacks HELP or TYPE" % (lineno, family))
        if family in finished or (current is not None and current != family):
            raise ExpositionError("line %d: samples of %s are not contiguous" % (lineno, family))
        current = family
        key = (sample_name, tuple(sorted(labels.items())))
        if key in seen:
            raise ExpositionError("line %d: duplicate sample %r" % (lineno, key))
        seen.add(key)
        value = float(fields[0].replace("Inf", "inf").replace("NaN", "nan"))
        fam["samples"].append((sample_name, labels, value))
    for name, fam in families.items():
        if fam["help"] is None or fam["type"] is None:
            raise ExpositionError("family %s lacks HELP or TYPE" % name)
    return families


def sample(families, name, **labels):
    """The value of the one sample ``name{labels}`` (labels matched exactly)."""
    values = [v for fam in families.values() for n, lab, v in fam["samples"] if n == name and lab == labels]
    assert len(values) == 1, (name, labels, values)
    return values[0]


def assert_metrics_match_stats(fams, doc, tcp_clients):
    """Every topic/channel figure of a /stats JSON document, as /metrics shows it."""
    assert sample(fams, "nsq_up") == (1 if doc["health"] == "OK" else 0)
    assert sample(fams, "nsq_start_time_seconds") == doc["start_time"]
    assert sample(fams, "nsq_clients") == tcp_clients
    expected_series = 0
    for t in doc["topics"]:
        tl = {"topic": t["topic_name"]}
        for name, key in TOPIC_KEYS.items():
            assert sample(fams, name, **tl) == float(t[key]), (name, t["topic_name"])
            expected_series += 1
        for p in t["e2e_processing_latency"]["percentiles"] or []:
            q = repr(float(p["quantile"]))
            assert sample(fams, "nsq_topic_e2e_processing_latency_seconds", quantile=q, **tl) == pytest.approx(
                p["value"] / 1e9
            )
        for c in t["channels"]:
            cl = dict(tl, channel=c["channel_name"])
            for name, key in CHANNEL_KEYS.items():
                assert sample(fams, name, **cl) == float(c[key]), (name, cl)
                expected_series += 1
            for p in c["e2e_processing_latency"]["percentiles"] or []:
                q = repr(float(p["quantile"]))
                assert sample(
                    fams, "nsq_channel_e2e_processing_latency_seconds", quantile=q, **cl
                ) == pytest.approx(p["value"] / 1e9)
    # Nothing else is labelled by topic: no stale or extra series.
    labelled = [
        s
        for name, fam in fams.items()
        if name in TOPIC_KEYS or name in CHANNEL_KEYS
        for s in fam["samples"]
    ]
    assert len(labelled) == expected_series
