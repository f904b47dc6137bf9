"""HTML made of elements: the one place nsqadmin's pages turn values into markup, escaping every one.

A page is built with :func:`el` (one element) and :func:`frag` (several in a
row); both return :class:`Markup`, the only thing they insert as-is.  Every
other child is text: a ``str`` is escaped, an ``int`` is formatted with
thousands separators, and anything else (a float, a bool, a dict that a node
sent) is refused with ``TypeError``, so a value of the wrong type is a bug
found in a test, never markup in a page.  Attribute values are always
escaped; attribute names are the code's own and must look like one, and two
kinds are refused outright: event handlers (``on...``) and ``style`` (the
Content-Security-Policy forbids both, and nothing here needs them).  A
``href``, ``src`` or ``action`` must be a path on nsqadmin itself (it starts
with one ``/``), so no value can become a ``javascript:`` URL or another server.

``Markup`` is not a ``str``: formatting it into a string (``"%s" % m``)
raises, so markup cannot be assembled by hand around this module.
"""

import html
import re

_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")
_VOID = frozenset(("meta", "link", "input", "br", "img"))
_URL_ATTRIBUTES = frozenset(("href", "src", "action"))


class Markup:
    """HTML made by :func:`el`, :func:`frag` or :func:`document` (construct it no other way)."""

    __slots__ = ("_html",)

    def __init__(self, text, _by_builder=None):
        if _by_builder is not _BUILDER:
            raise TypeError("Markup is made by el(), frag() or document() only")
        self._html = text

    def render(self):
        """The HTML text (for the response body)."""
        return self._html

    def __str__(self):
        raise TypeError("Markup is not text: insert it with el() or frag(), render() it for a response")

    def __repr__(self):
        return "Markup(%r)" % self._html

    def __eq__(self, other):
        return isinstance(other, Markup) and other._html == self._html

    def __hash__(self):
        return hash(self._html)


_BUILDER = object()  # the key only this module holds: Markup made elsewhere is refused


def text(value):
    """One child as HTML: Markup as it is, a str escaped, an int formatted; None and lists as in :func:`frag`."""
    if isinstance(value, Markup):
        return value._html
    if isinstance(value, str):
        return html.escape(value, quote=True)
    if isinstance(value, bool):
        raise TypeError("a bool is not page text (say what it means)")
    if isinstance(value, int):
        return "{:,}".format(value)
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return "".join(text(v) for v in value)
    raise TypeError("%s is not page text" % type(value).__name__)


def _attribute(name, value):
    if not _NAME.match(name) or name.startswith("on") or name == "style":
        raise ValueError("attribute %r is not allowed" % name)
    if value is None or value is False:
        return ""
    if value is True:
        return " " + name
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str):
        raise TypeError("attribute %s: %s is not a value" % (name, type(value).__name__))
    # a path, not "//host" or "/\\host" (browsers read both as another server)
    if name in _URL_ATTRIBUTES and (not value.startswith("/") or value[1:2] in ("/", "\\")):
        raise ValueError("attribute %s must be a path on this server, not %r" % (name, value))
    return ' %s="%s"' % (name, html.escape(value, quote=True))


def el(tag, attrs=None, *children):
    """``<tag attrs>children</tag>``; attrs maps names to values (None/False: left out, True: bare)."""
    if not _NAME.match(tag) or tag in ("script", "style"):
        raise ValueError("element %r is not allowed" % tag)
    opening = "<%s%s>" % (tag, "".join(_attribute(k, v) for k, v in (attrs or {}).items()))
    if tag in _VOID:
        if children:
            raise ValueError("<%s> has no children" % tag)
        return Markup(opening, _BUILDER)
    return Markup("%s%s</%s>" % (opening, text(children), tag), _BUILDER)


def frag(*children):
    """Several children in a row, as one piece of Markup."""
    return Markup(text(children), _BUILDER)


def script_file(src):
    """``<script src>`` of one of nsqadmin's own files: the only script a page has (never inline)."""
    return Markup("<script%s></script>" % _attribute("src", src), _BUILDER)


def document(lang, head, body):
    """A whole page: the doctype, then ``<html lang>`` around ``head`` and ``body`` (both from :func:`el`)."""
    return Markup("<!DOCTYPE html>\n%s\n" % el("html", {"lang": lang}, head, body)._html, _BUILDER)
