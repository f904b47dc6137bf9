"""admin.markup, the one place nsqadmin's pages turn values into HTML: everything is escaped, and what
cannot be made safe (handlers, styles, scripts, foreign URLs, values of a wrong type) is refused."""

import pytest

from nsqd_threaded.admin.markup import Markup, document, el, frag, script_file

HOSTILE = "\"'><img src=x onerror=alert(1)>&"


def test_text_and_attribute_values_are_escaped():
    html = el("a", {"href": "/topics/x", "title": HOSTILE, "data-x": HOSTILE}, HOSTILE).render()
    assert "<img" not in html and "\"'>" not in html
    assert html.count("&quot;&#x27;&gt;&lt;img src=x onerror=alert(1)&gt;&amp;") == 3


def test_integers_are_formatted_and_other_types_refused():
    assert el("td", None, 1234567).render() == "<td>1,234,567</td>"
    for value in (1.5, True, {"a": 1}, object()):
        with pytest.raises(TypeError):
            el("td", None, value)


def test_handlers_styles_scripts_and_foreign_urls_are_refused():
    for name in ("onclick", "onerror", "style", "x y", "a=b"):
        with pytest.raises(ValueError):
            el("a", {name: "x"})
    for url in ("javascript:alert(1)", "http://elsewhere/", "//elsewhere/", "/\\elsewhere/", "x"):
        with pytest.raises(ValueError):
            el("a", {"href": url})
        with pytest.raises(ValueError):
            script_file(url)
    for tag in ("script", "style", "a b", "<b>"):
        with pytest.raises(ValueError):
            el(tag)


def test_markup_is_made_by_the_builder_only():
    with pytest.raises(TypeError):
        Markup("<b>forged</b>")
    piece = frag(el("b", None, "x"), " y")
    with pytest.raises(TypeError):
        "%s" % piece  # markup cannot be formatted into a string by hand
    with pytest.raises(TypeError):
        str(piece)
    page = document("en", el("head", None, el("title", None, "t")), el("body", None, piece)).render()
    assert page == '<!DOCTYPE html>\n<html lang="en"><head><title>t</title></head><body><b>x</b> y</body></html>\n'
