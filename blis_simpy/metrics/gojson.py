"""JSON text exactly as Go's ``encoding/json`` writes it (``Marshal`` / ``MarshalIndent``).

BLIS prints its summaries with ``json.MarshalIndent(v, "", "  ")``; :func:`dumps` with the
default ``indent="  "`` produces the same bytes for the same values:

* mappings keep their insertion order (build them in Go's struct-field order); keys are
  strings (other keys are converted with ``str``);
* ``bool`` → ``true``/``false``, ``None`` → ``null``, ``int`` → decimal digits;
* ``float`` → Go's ``floatEncoder``: the shortest decimal that round-trips, in fixed
  notation (``1.0`` → ``1``, ``-0.0`` → ``-0``, ``123456789.0`` → ``123456789``) unless
  ``abs < 1e-6`` or ``abs >= 1e21``, which use exponent notation with a two-digit-minimum
  exponent where a ``e-0X`` exponent is cleaned to ``e-X`` (``1e-07`` → ``1e-7``;
  ``1e+21`` stays ``1e+21``). NaN and ±Inf are not JSON: :class:`ValueError`, as Go's
  ``UnsupportedValueError``;
* strings are escaped like Go with HTML escaping on (the default): ``"`` and ``\\`` with a
  backslash, ``\\b \\f \\n \\r \\t`` by name, other control characters and ``< > &`` as
  ``\\u00XX``, U+2028/U+2029 as ``\\u2028``/``\\u2029``, and lone surrogates (invalid
  UTF-8 in Go) as ``\\ufffd``. Everything else is written verbatim (UTF-8);
* ``MarshalIndent`` layout: one member per line, ``"key": value``, empty objects and arrays
  as ``{}`` and ``[]``. ``indent=None`` gives the compact ``Marshal`` form.

Lists and tuples are arrays; dataclasses are not handled (convert them to dicts first).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping

__all__ = ["dumps", "format_float", "quote"]


def _shortest_digits(f: float) -> tuple[str, int]:
    """Shortest round-trip digits ``d1d2…dn`` and point position ``e``: ``|f| = 0.d1…dn × 10^e``.

    ``f`` must be finite and non-zero. Python's ``repr`` and Go's ``strconv`` both produce the
    shortest digit string that round-trips, choosing the closest one on ties.
    """
    r = repr(abs(f))
    if "e" in r:
        mant, exp_s = r.split("e")
        exp = int(exp_s)
    else:
        mant, exp = r, 0
    if "." in mant:
        ip, fp = mant.split(".")
    else:
        ip, fp = mant, ""
    if fp == "0":
        fp = ""
    digits = ip + fp
    point = len(ip) + exp
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    return digits, point


def format_float(f: float) -> str:
    """A float64 as Go's ``encoding/json`` writes it."""
    f = float(f)
    r = repr(f)
    if "e" not in r and "n" not in r:
        # repr's fixed notation (1e-4 <= |f| < 1e16, or zero): the shortest round-trip
        # digits, as Go's; Go leaves out a fractional part of zero (1.0 -> 1, -0.0 -> -0)
        return r[:-2] if r.endswith(".0") else r
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"json: unsupported value: {f!r}")
    if f == 0.0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    sign = "-" if f < 0 else ""
    digits, point = _shortest_digits(f)
    a = abs(f)
    if a < 1e-6 or a >= 1e21:
        exp = point - 1
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        es = "-" if exp < 0 else "+"
        ed = str(abs(exp))
        if len(ed) < 2:
            # strconv pads to two digits; encoding/json then turns e-0X back into e-X
            ed = ed if es == "-" else "0" + ed
        return f"{sign}{mant}e{es}{ed}"
    n = len(digits)
    if point <= 0:
        body = "0." + "0" * (-point) + digits
    elif point >= n:
        body = digits + "0" * (point - n)
    else:
        body = digits[:point] + "." + digits[point:]
    return sign + body


_HEX = "0123456789abcdef"
_NAMED = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
          "\t": "\\t"}


def _escape_char(c: str, escape_html: bool) -> str:
    o = ord(c)
    if c in _NAMED:
        return _NAMED[c]
    if o < 0x20 or (escape_html and c in "<>&"):
        return "\\u00" + _HEX[o >> 4] + _HEX[o & 0xF]
    if o in (0x2028, 0x2029):
        return f"\\u{o:04x}"
    if 0xD800 <= o <= 0xDFFF:
        return "\\ufffd"
    return c


#: the characters :func:`_escape_char` changes, with and without HTML escaping
_ESCAPED = {True: re.compile('[\x00-\x1f"\\\\<>&\u2028\u2029\ud800-\udfff]'),
            False: re.compile('[\x00-\x1f"\\\\\u2028\u2029\ud800-\udfff]')}


def quote(s: str, *, escape_html: bool = True) -> str:
    """A string as a Go JSON string literal (quotes included)."""
    pattern = _ESCAPED[escape_html]
    if pattern.search(s) is None:
        return '"' + s + '"'
    return '"' + pattern.sub(lambda m: _escape_char(m.group(), escape_html), s) + '"'


def _scalar(v, escape_html: bool) -> str | None:
    t = type(v)
    if t is str:
        return quote(v, escape_html=escape_html)
    if t is int:
        return str(v)
    if t is float:
        return format_float(v)
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, str):
        return quote(v, escape_html=escape_html)
    if isinstance(v, bool):  # numpy.bool_ and friends
        return "true" if v else "false"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        return format_float(float(v))
    return None


def dumps(obj, *, indent: str | None = "  ", prefix: str = "", escape_html: bool = True) -> str:
    """Encode ``obj`` like Go's ``json.MarshalIndent(obj, prefix, indent)``.

    ``indent=None`` encodes like ``json.Marshal`` (no whitespace).
    """
    parts: list[str] = []
    _Encoder(indent, prefix, escape_html).encode(obj, parts, 0)
    return "".join(parts)


class _Encoder:
    """One :func:`dumps` call: the line breaks of each depth and the quoted keys, each
    made once (a results file repeats the same keys for every request)."""

    def __init__(self, indent: str | None, prefix: str, escape_html: bool) -> None:
        self.indent, self.prefix, self.escape_html = indent, prefix, escape_html
        self.colon = ": " if indent is not None else ":"
        self._breaks: list[str] = []
        self._keys: dict[str, str] = {}

    def brk(self, depth: int) -> str:
        """``","``-less line break before a member at ``depth`` ("" when compact)."""
        if self.indent is None:
            return ""
        while len(self._breaks) <= depth:
            self._breaks.append("\n" + self.prefix + self.indent * len(self._breaks))
        return self._breaks[depth]

    def key(self, k) -> str:
        """A member's quoted key and colon (keys that are not strings are converted with
        ``str`` and not cached: ``1``, ``1.0`` and ``True`` are one dict key but three texts)."""
        if type(k) is not str:
            return quote(str(k), escape_html=self.escape_html) + self.colon
        q = self._keys.get(k)
        if q is None:
            q = self._keys[k] = quote(k, escape_html=self.escape_html) + self.colon
        return q

    def encode(self, v, out: list, depth: int) -> None:
        s = _scalar(v, self.escape_html)
        if s is not None:
            out.append(s)
            return
        if isinstance(v, Mapping):
            self._members(v.items(), True, "{}", out, depth)
            return
        if isinstance(v, (list, tuple)):
            self._members(v, False, "[]", out, depth)
            return
        raise TypeError(f"json: unsupported type: {type(v).__name__}")

    def _members(self, members, keyed: bool, brackets: str, out: list, depth: int) -> None:
        """An object's ``(key, value)`` pairs (``keyed``) or an array's values, one a line."""
        inner, key, esc = self.brk(depth + 1), self.key, self.escape_html
        sep = brackets[0]
        for m in members:
            if keyed:
                k, val = m
                out.append(sep + inner + key(k))
            else:
                val = m
                out.append(sep + inner)
            sep = ","
            s = _scalar(val, esc)
            if s is not None:
                out.append(s)
            else:
                self.encode(val, out, depth + 1)
        out.append(brackets if sep == brackets[0] else self.brk(depth) + brackets[1])
