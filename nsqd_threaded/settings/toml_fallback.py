"""A TOML parser for Python < 3.11, which has no :mod:`tomllib`.

It reads the subset nsqd config files use and refuses the rest with an
error, never a wrong value.  :mod:`nsqd_threaded.settings.config` uses it only when
``tomllib`` is missing, so this module can be deleted once 3.11 is the floor.
"""

import re


class TOMLDecodeError(ValueError):
    """Invalid TOML, or TOML outside the supported subset (the message starts with ``line N:``)."""


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[A-Za-z0-9_.+:-]+")
_DEC_INT = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)")
_PREFIXED_INT = re.compile(r"0x[0-9A-Fa-f](_?[0-9A-Fa-f])*|0o[0-7](_?[0-7])*|0b[01](_?[01])*")
_FLOAT = re.compile(
    r"[+-]?(0|[1-9](_?[0-9])*)(\.[0-9](_?[0-9])*([eE][+-]?[0-9](_?[0-9])*)?|[eE][+-]?[0-9](_?[0-9])*)"
    r"|[+-]?(inf|nan)"
)
_DATE_LIKE = re.compile(r"\d{4}-\d{2}|\d{2}:\d{2}")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def loads(text):
    """Parse the TOML subset nsqd config files use; TOMLDecodeError on anything else.

    Supported: comments, ``key = value`` (bare, quoted and dotted keys),
    ``[table]`` headers, basic and literal strings, integers, floats,
    booleans, and arrays of those (nested, spanning lines).  Not supported:
    multi-line strings, inline tables, arrays of tables, dates and times.
    """
    return _TomlParser(text).document()


class _TomlParser:
    """A recursive-descent parser over the whole text; ``pos`` is the read position."""

    def __init__(self, text):
        self.text = text
        self.pos = 0
        self.doc = {}
        self.defined_tables = set()

    def error(self, message):
        line = self.text.count("\n", 0, self.pos) + 1
        return TOMLDecodeError("line %d: %s" % (line, message))

    def peek(self, n=1):
        return self.text[self.pos:self.pos + n]

    def skip_space(self):
        while self.peek() in (" ", "\t"):
            self.pos += 1

    def skip_comment(self):
        if self.peek() == "#":
            end = self.text.find("\n", self.pos)
            self.pos = len(self.text) if end < 0 else end

    def skip_to_newline(self):
        """Skip spaces and a comment, then one newline (``\\n`` or ``\\r\\n``); False if none follows."""
        self.skip_space()
        self.skip_comment()
        if self.peek(2) == "\r\n":
            self.pos += 2
        elif self.peek() == "\n":
            self.pos += 1
        else:
            return False
        return True

    def end_of_line(self):
        """After a statement: only spaces and a comment may follow on its line."""
        if not self.skip_to_newline() and self.pos < len(self.text):
            raise self.error("unexpected %r after value" % self.peek())

    def document(self):
        table = self.doc
        while True:
            self.skip_space()
            self.skip_comment()
            if self.pos >= len(self.text):
                return self.doc
            c = self.peek()
            if c in ("\n", "\r"):
                self.end_of_line()
            elif c == "[":
                table = self.table_header()
            else:
                self.key_value(table)

    def table_header(self):
        if self.peek(2) == "[[":
            raise self.error("arrays of tables ([[...]]) are not supported")
        self.pos += 1
        self.skip_space()
        keys = self.key()
        self.skip_space()
        if self.peek() != "]":
            raise self.error("expected ']' to close the table header")
        self.pos += 1
        if keys in self.defined_tables:
            raise self.error("table [%s] defined twice" % ".".join(keys))
        self.defined_tables.add(keys)
        self.end_of_line()
        return self.descend(self.doc, keys)

    def descend(self, table, keys):
        for k in keys:
            table = table.setdefault(k, {})
            if not isinstance(table, dict):
                raise self.error("key %r is not a table" % k)
        return table

    def key_value(self, table):
        keys = self.key()
        self.skip_space()
        if self.peek() != "=":
            raise self.error("expected '=' after key %r" % ".".join(keys))
        self.pos += 1
        self.skip_space()
        value = self.value()
        table = self.descend(table, keys[:-1])
        if keys[-1] in table:
            raise self.error("key %r defined twice" % ".".join(keys))
        table[keys[-1]] = value
        self.end_of_line()

    def key(self):
        """A possibly dotted key, as a tuple of parts."""
        parts = [self.simple_key()]
        while True:
            self.skip_space()
            if self.peek() != ".":
                return tuple(parts)
            self.pos += 1
            self.skip_space()
            parts.append(self.simple_key())

    def quoted_string(self):
        """The basic or literal string that starts here, or None when none does."""
        c = self.peek()
        if c == '"':
            return self.basic_string()
        if c == "'":
            return self.literal_string()
        return None

    def simple_key(self):
        key = self.quoted_string()
        if key is not None:
            return key
        m = _BARE_KEY.match(self.text, self.pos)
        if not m:
            raise self.error("expected a key, found %r" % self.peek())
        self.pos = m.end()
        return m.group()

    def value(self):
        text = self.quoted_string()
        if text is not None:
            return text
        c = self.peek()
        if c == "[":
            return self.array()
        if c == "{":
            raise self.error("inline tables are not supported")
        return self.scalar()

    def basic_string(self):
        if self.peek(3) == '"""':
            raise self.error("multi-line strings are not supported")
        self.pos += 1
        out = []
        while True:
            c = self.peek()
            if c in ("", "\n", "\r"):
                raise self.error("unterminated string")
            self.pos += 1
            if c == '"':
                return "".join(out)
            if c == "\\":
                out.append(self.escape())
            elif c < " " and c != "\t" or c == "\x7f":
                raise self.error("control character %r in string" % c)
            else:
                out.append(c)

    def escape(self):
        c = self.peek()
        self.pos += 1
        if c in _ESCAPES:
            return _ESCAPES[c]
        if c in ("u", "U"):
            width = 4 if c == "u" else 8
            digits = self.peek(width)
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.error("invalid \\%s escape" % c)
            self.pos += width
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise self.error("invalid unicode scalar \\%s%s" % (c, digits))
            return chr(code)
        raise self.error("invalid escape \\%s" % c)

    def literal_string(self):
        if self.peek(3) == "'''":
            raise self.error("multi-line strings are not supported")
        end = self.pos + 1
        while end < len(self.text) and self.text[end] not in "'\n\r":
            end += 1
        if self.text[end:end + 1] != "'":
            raise self.error("unterminated string")
        value = self.text[self.pos + 1:end]
        self.pos = end + 1
        return value

    def array(self):
        self.pos += 1
        items = []
        while True:
            self.skip_array_space()
            if self.peek() == "]":
                self.pos += 1
                return items
            items.append(self.value())
            self.skip_array_space()
            c = self.peek()
            if c == ",":
                self.pos += 1
            elif c != "]":
                raise self.error("expected ',' or ']' in array, found %r" % (c or "end of file"))

    def skip_array_space(self):
        """Inside arrays, newlines and comments are whitespace."""
        while self.skip_to_newline():
            pass

    def scalar(self):
        m = _SCALAR.match(self.text, self.pos)
        if not m:
            raise self.error("expected a value, found %r" % (self.peek() or "end of file"))
        token = m.group()
        if token in ("true", "false"):
            value = token == "true"
        elif _DEC_INT.fullmatch(token) or _PREFIXED_INT.fullmatch(token):
            value = int(token, 0) if token[:2] in ("0x", "0o", "0b") else int(token)
        elif _FLOAT.fullmatch(token):
            value = float(token)
        elif _DATE_LIKE.match(token):
            raise self.error("dates and times are not supported: %r" % token)
        else:
            raise self.error("invalid value %r" % token)
        self.pos = m.end()
        return value
