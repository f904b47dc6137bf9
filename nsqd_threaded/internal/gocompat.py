"""Go's text formats, reproduced byte for byte: quoting, JSON, durations, integers.

nsqd's clients and operators see what Go's standard library writes: ``%q`` in
error texts, ``encoding/json`` in IDENTIFY responses and ``/stats``,
``time.Duration`` in flags and ``/config``, ``strconv`` in flag values.
Everything that imitates one of those lives here, so each has one
implementation.  Pure functions only: no I/O, no state.
"""

import decimal
import json
import math
import re
import sys
from itertools import chain, compress

# -- %q (strconv.Quote) ------------------------------------------------------

_QUOTE_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}


def go_quote(raw):
    """Render bytes (or text) the way Go's ``%q`` (``strconv.Quote``) does, for error texts.

    Printable runes (``str.isprintable`` is Go's ``unicode.IsPrint``) are kept
    as is; each byte of invalid UTF-8 becomes ``\\xNN``; other runes are
    escaped as ``\\a``..``\\v``, ``\\xNN`` (below space and DEL), ``\\uNNNN``
    or ``\\UNNNNNNNN``.
    """
    text = raw.decode("utf-8", "surrogateescape") if isinstance(raw, (bytes, bytearray)) else raw
    out = ['"']
    for ch in text:
        esc = _QUOTE_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
            continue
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:  # an undecodable byte (surrogateescape)
            out.append("\\x%02x" % (o - 0xDC00))
        elif ch.isprintable():
            out.append(ch)
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        elif 0xD800 <= o <= 0xDFFF:  # not a valid rune
            out.append("\\ufffd")
        elif o < 0x10000:
            out.append("\\u%04x" % o)
        else:
            out.append("\\U%08x" % o)
    out.append('"')
    return "".join(out)


# -- encoding/json: writing ------------------------------------------------------

# Go 1.19 (nsqd 1.3.0's toolchain) escapes HTML characters and U+2028/9, writes
# \b and \f as \u0008 and \u000c, and replaces invalid UTF-8 with U+FFFD.
_JSON_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_JSON_SPECIAL_RE = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029\ud800-\udfff]')


def _json_special(m):
    ch = m.group()
    esc = _JSON_ESCAPES.get(ch)
    if esc is not None:
        return esc
    if "\ud800" <= ch <= "\udfff":
        return "\\ufffd"
    return "\\u%04x" % ord(ch)


def go_json_string(value):
    """A JSON string as Go's encoding/json writes it (HTML-safe, UTF-8)."""
    return '"' + _JSON_SPECIAL_RE.sub(_json_special, value) + '"'


def go_float(f):
    """A float64 as Go's encoding/json writes it (``0``, ``0.99``, ``1e+21``, ``1e-7``)."""
    if f == 0:
        return "0"
    a = abs(f)
    if 1e-6 <= a < 1e21:
        text = format(decimal.Decimal(repr(f)), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    text = repr(f)
    if text[-4:-1] == "e-0":  # Go cleans up e-09 to e-9 (a negative two-digit exponent only)
        text = text[:-2] + text[-1]
    return text


# Fast path: the stdlib encoder (C on CPython; PyPy's own is faster than the
# slow path too) writes the whole document in one call, and what it writes
# differently from Go is then rewritten in its text.  Strings, in one regex
# pass when a quick look finds anything to fix: \b and \f, HTML characters,
# U+2028/9 and lone surrogates (``\\`` is matched first, so an escaped
# backslash followed by "b" or "f" is left alone).  Floats, which come out as
# ``repr``: each float token holds a match of _FRACTION_RE, or of
# _EXPONENT_RE when written without a fraction, and those that ``repr``
# writes unlike Go (whole numbers, exponents) are rewritten with
# :func:`go_float`.  A string can hold such text too, so the rewrite is kept
# only when it found exactly as many tokens as the document holds floats
# (counted by a walk that also checks the types); otherwise, and for any
# type the stdlib writes differently, the document takes the slow path.
_STDLIB_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode
_STRING_FIX_RE = re.compile(r'\\\\|\\b|\\f|[<>&\u2028\u2029\ud800-\udfff]')
_STRING_FIXES = {"\\b": "\\u0008", "\\f": "\\u000c", "<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                 "\u2028": "\\u2028", "\u2029": "\\u2029"}
_NON_ASCII_FIX_RE = re.compile("[\u2028\u2029\ud800-\udfff]")
# Anchored on "." or "e" rather than on the number's start: re scans for a literal quickly.
_FRACTION_RE = re.compile(r"\.[0-9]+(?:e[-+][0-9]+)?(?=[,\]}])")
_EXPONENT_RE = re.compile(r"(?<=[0-9])e[-+][0-9]+(?=[,\]}])")
_NUMBER_CHARS = frozenset("-0123456789")
_VALUE_STARTS = frozenset(":,[")
# Exact types only: a subclass may print itself differently (the slow path
# calls str() on ints and repr() on floats).
_ATOM_TYPES = frozenset((str, int, bool, type(None)))
_FAST_TYPES = _ATOM_TYPES | {dict, list, tuple, float}
_STR_TYPES = frozenset((str,))
_IS_DICT = frozenset((dict,)).__contains__
_IS_SEQUENCE = frozenset((list, tuple)).__contains__
_IS_FLOAT = frozenset((float,)).__contains__


def _string_fix(m):
    text = m.group()
    if text == "\\\\":
        return text
    fix = _STRING_FIXES.get(text)
    return fix if fix is not None else "\\ufffd"


def _needs_string_fix(text):
    # One-character searches are much faster than two-character ones.
    return (
        ("\\" in text and ("\\b" in text or "\\f" in text))
        or "<" in text
        or ">" in text
        or "&" in text
        or (not text.isascii() and _NON_ASCII_FIX_RE.search(text) is not None)
    )


def _fix_floats(text, floats):
    """``text`` with its ``floats`` float tokens in Go's form, or None when they cannot be told apart.

    Every float token holds a match of :data:`_FRACTION_RE` or (written
    without a fraction) of :data:`_EXPONENT_RE`, so when there are as many
    matches as floats, every match is a float token.
    """
    out = []
    done = found = 0
    for m in _FRACTION_RE.finditer(text):
        found += 1
        start, end = m.span()
        if end - start == 2 and text[end - 1] == "0":  # a whole number: repr's ".0" goes
            if text[start - 2 : start] == "-0" and text[start - 3 : start - 2] in _VALUE_STARTS:
                out.append(text[done : start - 2])
                out.append("0")
            else:
                out.append(text[done:start])
            done = end
        elif "e" in m.group():
            done = _fix_float_token(text, start, end, done, out)
    if found and out:
        out.append(text[done:])
        text = "".join(out)
    if "e-" in text or "e+" in text:
        out = []
        done = 0
        for m in _EXPONENT_RE.finditer(text):
            start, end = m.span()
            while start and text[start - 1] in _NUMBER_CHARS:
                start -= 1
            if text[start - 1 : start] != ".":  # else the exponent of a fraction, counted above
                found += 1
                done = _fix_float_token(text, start, end, done, out)
        if out:
            out.append(text[done:])
            text = "".join(out)
    return text if found == floats else None


def _fix_float_token(text, start, end, done, out):
    """Append what precedes the token ending at ``end`` and the token in Go's form; the new ``done``."""
    while start and text[start - 1] in _NUMBER_CHARS:
        start -= 1
    out.append(text[done:start])
    try:
        out.append(go_float(float(text[start:end])))
    except ValueError:  # not a number: text in a string, which the count will tell
        out.append(text[start:end])
    return end


def _float_count_by_level(doc):
    """How many floats ``doc`` holds, or None when the stdlib encoder cannot write it as the slow path would.

    Exact types only, str keys only, finite floats only, and no deeper than
    the recursion limit (a cycle, or a document the slow path cannot write).
    A walk level by level whose per-node work is done by C iterators: on
    CPython several times faster than :func:`_float_count_by_value`.
    """
    level = [doc]
    floats = 0
    for _ in range(sys.getrecursionlimit()):
        types = list(map(type, level))
        kinds = set(types)
        if not kinds <= _FAST_TYPES:
            return None
        if float in kinds:
            if not all(map(math.isfinite, compress(level, map(_IS_FLOAT, types)))):
                return None
            floats += types.count(float)
        children = []
        if dict in kinds:
            dicts = list(compress(level, map(_IS_DICT, types)))
            if not _STR_TYPES.issuperset(map(type, chain.from_iterable(dicts))):
                return None
            children.extend(chain.from_iterable(map(dict.values, dicts)))
        if list in kinds or tuple in kinds:
            children.extend(chain.from_iterable(compress(level, map(_IS_SEQUENCE, types))))
        if not children:
            return floats
        level = children
    return None


class _Unfit(Exception):
    """A value the stdlib encoder would write otherwise than the slow path."""


def _float_count_by_value(doc):
    """:func:`_float_count_by_level` as a plain recursive walk: on PyPy several times faster."""
    try:
        return _count_floats(doc)
    except (_Unfit, RecursionError):
        return None


def _count_floats(obj):
    t = type(obj)
    if t is str or t is int or t is bool or obj is None:
        return 0
    if t is float:
        if not math.isfinite(obj):
            raise _Unfit
        return 1
    n = 0
    if t is dict:
        for k, v in obj.items():
            if type(k) is not str:
                raise _Unfit
            n += _count_floats(v)
    elif t is list or t is tuple:
        for v in obj:
            n += _count_floats(v)
    else:
        raise _Unfit
    return n


_float_count = _float_count_by_value if sys.implementation.name == "pypy" else _float_count_by_level


def _fast_encode(doc):
    """``go_json(doc)`` through the stdlib encoder, or None when that cannot be done."""
    floats = _float_count(doc)
    if floats is None:
        return None
    try:
        text = _STDLIB_ENCODE(doc)
    except RecursionError:
        return None
    if floats:
        text = _fix_floats(text, floats)
        if text is None:
            return None
    return _STRING_FIX_RE.sub(_string_fix, text) if _needs_string_fix(text) else text


class RawMessage(str):
    """JSON text that :func:`go_json` writes as it is, as Go's ``json.RawMessage``: a part of a
    document written ahead by code that knows its shape (a /stats channel object)."""

    __slots__ = ()


def _encode(obj, out):
    if type(obj) is RawMessage:
        out.append(obj)
    elif isinstance(obj, str):
        out.append(go_json_string(obj))
    elif obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, int):
        out.append(str(obj))
    elif isinstance(obj, float):
        out.append(go_float(obj))
    elif isinstance(obj, dict):
        out.append("{")
        first = True
        for k, v in obj.items():
            if not first:
                out.append(",")
            first = False
            out.append(go_json_string(k))
            out.append(":")
            _encode(v, out)
        out.append("}")
    else:
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(",")
            _encode(v, out)
        out.append("]")


def go_json_slow(doc):
    """:func:`go_json` written value by value in Python, for what the json encoder cannot do."""
    out = []
    _encode(doc, out)
    return "".join(out)


def go_json(doc):
    """``json.Marshal`` of ``doc``: compact, keys in the dict's order, Go's strings and floats.

    A :class:`RawMessage` in it is written as it is (the stdlib encoder would quote it: a
    document that holds one takes the slow path).
    """
    if type(doc) is not float:
        text = _fast_encode(doc)
        if text is not None:
            return text
    return go_json_slow(doc)


# -- encoding/json: reading -------------------------------------------------------


class JSONObject(list):
    """A decoded JSON object as its (key, value) pairs, in document order (duplicates kept)."""


def _reject_constant(name):
    raise ValueError("invalid JSON constant %s" % name)


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


# Stateless once built: shared by every broker of the process.
_GO_JSON_DECODER = json.JSONDecoder(object_pairs_hook=JSONObject, parse_constant=_reject_constant)


def go_json_loads(data):
    """Parse JSON bytes as Go's encoding/json reads them; ValueError when Go would fail.

    Objects come back as :class:`JSONObject` (pairs, so the caller applies
    Go's rules for duplicate and case-folded keys); NaN and Infinity are not
    JSON.  Invalid UTF-8 in strings is kept as surrogates here:
    :func:`go_json_text` turns it into U+FFFD as Go does.
    """
    try:
        # (json.loads with these hooks would build a decoder, its scanner included, on every call)
        return _GO_JSON_DECODER.decode(bytes(data).decode("utf-8", "surrogateescape"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def go_json_text(value):
    """A decoded JSON string with invalid UTF-8 replaced by U+FFFD, as Go decodes it."""
    return _SURROGATE_RE.sub("\ufffd", value)


def go_json_fold_key(key):
    """Fold a key the way encoding/json matches it to a field name (case-insensitive).

    Besides ASCII case, Go's folding maps U+017F (long s) to "s" and U+212A
    (Kelvin sign) to "k"; ``str.lower`` already covers the latter.
    """
    return key.lower().replace("\u017f", "s")


_INT_RANGES = {int: (-(1 << 63), (1 << 63) - 1), "int32": (-(1 << 31), (1 << 31) - 1)}


def go_json_unmarshal(data, fields):
    """``json.Unmarshal`` of JSON bytes into a struct with ``fields`` (name -> str, bool, int or "int32").

    Returns the fields present and not null (a dict); ValueError when Go
    would fail.  Go's rules: keys match case-insensitively, a later key wins
    but ``null`` changes nothing, unknown keys are ignored, a value of the
    wrong type (or an integer out of range) anywhere fails the whole decode,
    a ``null`` document is a no-op, and invalid UTF-8 in strings becomes U+FFFD.
    """
    doc = go_json_loads(data)
    if doc is None:
        return {}
    if not isinstance(doc, JSONObject):
        raise ValueError("not a JSON object")
    out = {}
    for key, value in doc:
        name = go_json_fold_key(key)
        kind = fields.get(name)
        if kind is None or value is None:
            continue
        if kind is str:
            if not isinstance(value, str):
                raise ValueError("%s: want a string" % name)
            value = go_json_text(value)
        elif kind is bool:
            if not isinstance(value, bool):
                raise ValueError("%s: want a bool" % name)
        else:
            lo, hi = _INT_RANGES[kind]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError("%s: want an integer in [%d, %d]" % (name, lo, hi))
        out[name] = value
    return out


# -- time.Duration ------------------------------------------------------------------


def ns(seconds):
    """A duration held as float seconds, as Go's integer nanoseconds."""
    return int(round(seconds * 1e9))


def ms(seconds):
    """A duration held as float seconds, in whole milliseconds as Go computes ``d / time.Millisecond``.

    Go durations are integer nanoseconds; ``int(seconds * 1000)`` would turn
    1.001 s into 1000 ms.
    """
    return ns(seconds) // 1000000


_UNITS = {
    "ns": 1,
    "us": 1000,
    "\u00b5s": 1000,  # MICRO SIGN
    "\u03bcs": 1000,  # GREEK SMALL LETTER MU
    "ms": 1000000,
    "s": 1000000000,
    "m": 60 * 1000000000,
    "h": 3600 * 1000000000,
}

_MAX_NS = (1 << 63) - 1  # Go's Duration is an int64 count of nanoseconds


def parse_duration_ns(text):
    """Go's ``time.ParseDuration``: ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+`` -> int nanoseconds."""
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError("time: invalid duration %s" % go_quote(text))
    total = 0
    while s:
        if s[0] != "." and not _is_digit(s[0]):
            raise ValueError("time: invalid duration %s" % go_quote(text))
        whole, s = _split(s, _is_digit)
        fraction = ""
        if s[:1] == ".":
            fraction, s = _split(s[1:], _is_digit)
        if not whole and not fraction:
            raise ValueError("time: invalid duration %s" % go_quote(text))
        unit_text, s = _split(s, _is_unit_char)
        if not unit_text:
            raise ValueError("time: missing unit in duration %s" % go_quote(text))
        unit = _UNITS.get(unit_text)
        if unit is None:
            raise ValueError("time: unknown unit %s in duration %s" % (go_quote(unit_text), go_quote(text)))
        value = int(whole or "0") * unit
        if fraction:
            # Go truncates float64(f) * (unit / scale); an exact rational
            # truncation differs only below a nanosecond.
            value += int(fraction) * unit // 10 ** len(fraction)
        total += value
        if total > _MAX_NS + 1:
            raise ValueError("time: invalid duration %s" % go_quote(text))
    if negative:
        return -total
    if total > _MAX_NS:
        raise ValueError("time: invalid duration %s" % go_quote(text))
    return total


def parse_duration(text):
    """Go duration text -> float seconds; ValueError with Go's wording otherwise."""
    return parse_duration_ns(text) / 1e9


def format_duration(seconds):
    """Float (or int) seconds -> Go's ``Duration.String()``: ``1m0s``, ``250ms``, ``0s``."""
    return format_duration_ns(round(seconds * 1000000000))


def format_duration_ns(ns):
    """Int nanoseconds -> Go's ``Duration.String()``."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1000:
        return "%s%dns" % (sign, ns)
    if ns < 1000000:
        return sign + _fraction(ns, 3) + "\u00b5s"
    if ns < 1000000000:
        return sign + _fraction(ns, 6) + "ms"
    secs, frac = divmod(ns, 1000000000)
    text = _fraction(frac, 9, whole=secs % 60) + "s"
    minutes = secs // 60
    if minutes:
        text = "%dm%s" % (minutes % 60, text)
        hours = minutes // 60
        if hours:
            text = "%dh%s" % (hours, text)
    return sign + text


def _fraction(value, digits, whole=None):
    """``value`` scaled down by 10**digits as Go prints it: no trailing zeros, no bare dot."""
    if whole is None:
        whole, value = divmod(value, 10 ** digits)
    frac = ("%0*d" % (digits, value)).rstrip("0")
    return "%d.%s" % (whole, frac) if frac else "%d" % whole


def _is_digit(c):
    return "0" <= c <= "9"


def _is_unit_char(c):
    """Go takes everything up to the next number as the unit name."""
    return c != "." and not _is_digit(c)


def _split(s, accept):
    """Split ``s`` after its longest prefix of characters that ``accept``."""
    i = 0
    while i < len(s) and accept(s[i]):
        i += 1
    return s[:i], s[i:]


# -- net.JoinHostPort / net.SplitHostPort -------------------------------------------


def join_host_port(host, port):
    """``host:port``, an IPv6 host in brackets (Go's net.JoinHostPort and net.Addr strings)."""
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


# On Linux a unix socket name starting with "@" is in the abstract namespace (no file), as Go's
# net package takes it there; elsewhere it would be a relative path, which is_socket_path refuses.
_SOCKET_PREFIXES = ("/", "./", "../", "@") if sys.platform.startswith("linux") else ("/", "./", "../")


def is_socket_path(address):
    """True when a listen or dial address names a unix socket: a ``str`` starting with ``/``, ``./`` or
    ``../``, or on Linux ``@`` (an abstract socket: :func:`is_abstract_socket`).

    Go NSQ takes every address that is not ``host:port`` as a socket path, so a
    forgotten port (``--tcp-address=localhost``) silently makes a socket file
    in the working directory; a path here must look like one, and ``host:port``
    never does (neither a host nor a port contains ``/`` or starts with ``@``).
    """
    return isinstance(address, str) and address.startswith(_SOCKET_PREFIXES)


def is_abstract_socket(address):
    """True for a Linux abstract-namespace socket name, ``@name``: no file, gone with its last listener."""
    return is_socket_path(address) and address.startswith("@")


def unix_sockaddr(path):
    """The address ``bind``/``connect`` take for a socket path: ``@name`` becomes ``\0name`` (Go's mapping)."""
    return "\0" + path[1:] if path.startswith("@") else path


def split_host_port(address):
    """``"host:port"`` or ``"[v6]:port"`` -> ``(host, port)``; the host may be empty.

    ValueError (Go's text) when there is no numeric port.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("address %s: missing port in address" % address)
    return host.strip("[]"), int(port)


# -- strconv (flag values) ------------------------------------------------------------

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def parse_go_int(text):
    """Go's ``strconv.ParseInt(s, 0, 64)``: ``0x``/``0o``/``0b`` prefixes, leading ``0`` = octal."""
    sign, body = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    if re.fullmatch(r"0_*[0-7][0-7_]*", body):  # Go's legacy octal; Python wants 0o
        body = "0o" + body[1:]
    value = None
    if body and all(c.isascii() and (c.isalnum() or c == "_") for c in body):
        try:
            value = int(sign + body, 0)
        except ValueError:
            pass
    if value is None:
        raise ValueError("invalid integer %s" % go_quote(text))
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError("integer %s out of range" % go_quote(text))
    return value


def parse_go_bool(text):
    """Go's ``strconv.ParseBool``, which ``flag`` uses for ``--name=value``."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError("invalid boolean %s (true or false)" % go_quote(text))
