"""Go encoding/json text: float formatting, string escaping, MarshalIndent layout, and the
JSON blocks BLIS printed in the conformance cases, byte for byte."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import pytest

from blis_simpy.metrics.gojson import dumps, format_float, quote
from tests.conftest import CONFORMANCE
from tests.metrics.helpers import case_dir, load_expected

FLOATS = [
    (31.667365, "31.667365"),
    (9.473475295465853, "9.473475295465853"),
    (3103.7453000000005, "3103.7453000000005"),
    (0.0, "0"),
    (-0.0, "-0"),
    (1.0, "1"),
    (-2.0, "-2"),
    (123456789.0, "123456789"),
    (0.1, "0.1"),
    (0.292906907740768, "0.292906907740768"),
    (1e-7, "1e-7"),
    (-1.5e-7, "-1.5e-7"),
    (1e-6, "0.000001"),
    (9.99e-7, "9.99e-7"),
    (1.234e-10, "1.234e-10"),
    (5e-324, "5e-324"),
    (1e20, "100000000000000000000"),
    (1e16, "10000000000000000"),
    (1.5e17, "150000000000000000"),
    (1e21, "1e+21"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (0.000123, "0.000123"),
]


@pytest.mark.parametrize("value,text", FLOATS)
def test_format_float(value, text):
    assert format_float(value) == text


def test_format_float_fixed_notation_is_the_shortest_round_trip_digits():
    """In Go's fixed-notation range (1e-6 <= |f| < 1e21) a float is its shortest round-trip
    digits written out positionally, no trailing ``.0``: numpy's own Dragon4 positional
    formatter says the same for floats of every magnitude, whole numbers among them."""
    import numpy as np

    rng = np.random.default_rng(7)
    values = (rng.standard_normal(20000) * 10.0 ** rng.integers(-6, 21, 20000)).tolist()
    values += [float(i) for i in range(-300, 300)] + [1e15, 1e16, 9999999999999998.0, 1e-4,
                                                      0.0001000001, 123456789012345.6, 1e20]
    checked = 0
    for f in values:
        if 1e-6 <= abs(f) < 1e21:
            assert format_float(f) == np.format_float_positional(f, unique=True, trim="-"), repr(f)
            checked += 1
    assert checked > 19000


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_rejected(bad):
    with pytest.raises(ValueError):
        format_float(bad)
    with pytest.raises(ValueError):
        dumps({"x": bad})


def test_numbers_keep_their_type():
    assert dumps([1, 1.0, True, None, 2**62], indent=None) == "[1,1,true,null,4611686018427387904]"


def test_string_escaping_like_go():
    assert quote("plain text") == '"plain text"'
    assert quote('a"b\\c') == r'"a\"b\\c"'
    assert quote("<&>") == r'"\u003c\u0026\u003e"'
    assert quote("<&>", escape_html=False) == '"<&>"'
    assert quote("\n\r\t\b\f") == r'"\n\r\t\b\f"'
    assert quote("\x00\x01\x1f") == r'"\u0000\u0001\u001f"'
    assert quote("\u2028\u2029") == r'"\u2028\u2029"'
    assert quote("\x7fé漢µ") == '"\x7fé漢µ"'
    assert quote("\ud800") == r'"\ufffd"'


def test_quote_escapes_exactly_the_characters_go_escapes():
    """``quote`` finds the characters to escape with one regex search: every code point,
    alone and between plain text, is written as Go writes it (the named escapes, ``\\u00XX``
    for other control characters and, with HTML escaping, ``< > &``, U+2028/U+2029, U+FFFD
    for a lone surrogate), and nothing else is touched."""
    named = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}

    def go(c: str, html: bool) -> str:
        o = ord(c)
        if c in named:
            return named[c]
        if o < 0x20 or (html and c in "<>&"):
            return f"\\u{o:04x}"
        if o in (0x2028, 0x2029):
            return f"\\u{o:04x}"
        if 0xD800 <= o <= 0xDFFF:
            return "\\ufffd"
        return c

    for o in range(0x110000):
        c = chr(o)
        for html in (True, False):
            assert quote(c, escape_html=html) == '"' + go(c, html) + '"', hex(o)
    assert quote("ab<c\n", escape_html=False) == '"ab<c\\n"'
    assert quote("ab<c\n") == '"ab\\u003cc\\n"'


def test_marshal_indent_layout():
    obj = OrderedDict([("b", 1), ("a", [1.5, {"x": []}, {}]), ("c", {"<k>": "v"})])
    assert dumps(obj) == (
        '{\n'
        '  "b": 1,\n'
        '  "a": [\n'
        '    1.5,\n'
        '    {\n'
        '      "x": []\n'
        '    },\n'
        '    {}\n'
        '  ],\n'
        '  "c": {\n'
        '    "\\u003ck\\u003e": "v"\n'
        '  }\n'
        '}')
    assert dumps(obj, indent=None) == '{"b":1,"a":[1.5,{"x":[]},{}],"c":{"\\u003ck\\u003e":"v"}}'
    assert dumps([]) == "[]" and dumps({}) == "{}"
    assert dumps({1: 2}, indent=None) == '{"1":2}'
    with pytest.raises(TypeError):
        dumps({"x": object()})


def test_compact_output_parses_back():
    obj = {"k": [0.1, 1e-7, 1e21, -0.0, "s\u2028"]}
    assert json.loads(dumps(obj, indent=None)) == obj


def test_a01_block_byte_identical():
    block = load_expected("A01_golden1")["stdout_metrics"][0]
    assert type(block["completed_requests"]) is int
    stdout = (case_dir("A01_golden1") / "stdout.txt").read_text()
    text = "=== Simulation Metrics ===\n" + dumps(block) + "\n"
    assert stdout.startswith(text)


def _case_names():
    return sorted(p.name for p in CONFORMANCE.iterdir() if (p / "expected.json").exists())


@pytest.mark.parametrize("name", _case_names())
def test_every_printed_block_byte_identical(name):
    expected = load_expected(name)
    stdout = (case_dir(name) / "stdout.txt").read_text()
    blocks = ["=== Simulation Metrics ===\n" + dumps(b) + "\n" for b in expected["stdout_metrics"]]
    # blocks come first, consecutively, in this order
    assert stdout.startswith("".join(blocks))


# --- the fast paths against the definition, character by character --------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _reference_quote(s: str, escape_html: bool) -> str:
    """Go's string escaping, one character at a time (the module docstring's rules)."""
    out = []
    for c in s:
        o = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif c in "\b\f\n\r\t":
            out.append({"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        elif o < 0x20 or (escape_html and c in "<>&"):
            out.append(f"\\u{o:04x}")
        elif o in (0x2028, 0x2029):
            out.append(f"\\u{o:04x}")
        elif 0xD800 <= o <= 0xDFFF:
            out.append("\\ufffd")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _reference_float(f: float) -> str:
    """Go's float encoding from its definition: shortest round-trip digits via Decimal."""
    from decimal import Decimal
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    a = abs(f)
    if a < 1e-6 or a >= 1e21:
        digits = repr(a).split("e")[0].replace(".", "").lstrip("0").rstrip("0") or "0"
        exp = int(Decimal(repr(a)).adjusted())
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        ed = str(abs(exp))
        ed = ed if exp < 0 or len(ed) >= 2 else "0" + ed
        return ("-" if f < 0 else "") + f"{mant}e{'-' if exp < 0 else '+'}{ed}"
    text = format(Decimal(repr(f)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [1e-7, 1e-6, 9.99e-7, 1e21, 9.99e20, 1e16, 1e-4, 1e-5, 0.1, 1.0, -0.0, 123456789.0])


@given(_floats)
def test_format_float_matches_the_definition(f):
    assert format_float(f) == _reference_float(f)


@given(_text, st.booleans())
def test_quote_matches_the_definition(s, html):
    assert quote(s, escape_html=html) == _reference_quote(s, html)


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _floats | _text,
    lambda kids: st.lists(kids, max_size=4)
    | st.dictionaries(_text | st.integers() | st.booleans(), kids, max_size=4),
    max_leaves=20)


@given(_values, st.sampled_from(["  ", None, "\t"]))
def test_nested_values_match_a_plain_recursive_encoding(v, indent):
    """Cached keys and line breaks give what one member at a time would: keys that are not
    strings go through ``str`` (``True`` and ``1`` are different texts)."""
    def ref(x, depth):
        if x is None or isinstance(x, bool):
            return {None: "null", True: "true", False: "false"}[x]
        if isinstance(x, int):
            return str(x)
        if isinstance(x, float):
            return _reference_float(x)
        if isinstance(x, str):
            return _reference_quote(x, True)
        opening, closing, items = ("{", "}", [_reference_quote(str(k), True) + (": " if indent is not None else ":")
                                   + ref(val, depth + 1) for k, val in x.items()]) if isinstance(x, dict) \
            else ("[", "]", [ref(val, depth + 1) for val in x])
        if not items:
            return opening + closing
        if indent is None:
            return opening + ",".join(items) + closing
        inner = "\n" + indent * (depth + 1)
        return opening + ",".join(inner + it for it in items) + "\n" + indent * depth + closing
    assert dumps(v, indent=indent) == ref(v, 0)
