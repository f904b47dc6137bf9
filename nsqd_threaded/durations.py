"""Go ``time.Duration`` text: parsing flag values and printing defaults.

nsqd's flags, config file and ``/config`` output all use Go's syntax
(``1m0s``, ``250ms``, ``1h30m``), so operators can copy values between a Go
nsqd and this one.  Durations are float seconds here, as in
:class:`~nsqd_threaded.options.Options`; the arithmetic is done in integer
nanoseconds, as Go does, so rounding and overflow match.
"""

from .protocol import go_quote

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


