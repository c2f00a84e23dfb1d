"""Integers past Python's limit on decimal conversion (`sys.get_int_max_str_digits()`, 4,300 digits) in dims: a
product that big is a located error about its size, and a value that big which the checker only substitutes (a
config field's square) is printed in full; neither is an internal error (L000) naming Python's limit."""

from __future__ import annotations

import contextlib
import sys

from linnet.semantics.program import Document
from linnet.types.dims import int_text

DIGITS = "9" * 3000


@contextlib.contextmanager
def unlimited_int_text():
    """Python's own `str(int)` without its digit limit: the reference the printed number is compared with."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(limit)


def diagnostics(text: str):
    return Document("/tmp/long.linnet", text).analyze().diagnostics


def test_a_product_of_two_long_literals_is_a_located_error_about_its_size():
    text = f"module M() {{\n    w: [{DIGITS} * {DIGITS}]\n}}\n"
    (d,) = diagnostics(text)
    assert d.code == "L408", d.message
    assert (
        d.message
        == "`*` of a 3000-digit int and a 3000-digit int is too large for a compile-time int (more than 4096 bits)"
    )
    start = text.index(DIGITS)
    assert (d.location.line, d.location.start.offset, d.location.end.offset) == (2, start, start + 2 * 3000 + 3)


def test_a_long_value_a_message_quotes_is_printed_in_full():
    text = (
        f"config C {{\n    x: int = {DIGITS}\n}}\n\n"
        "module M(c: C) {\n    w: [c.x * c.x]\n\n    fn forward(x: [2]) -> [2] {\n        x + w\n    }\n}\n"
    )
    (d,) = diagnostics(text)
    with unlimited_int_text():
        square = str(int(DIGITS) ** 2)
    assert d.code == "L201"
    assert d.message == f"shapes don't broadcast: [2] and [c.x * c.x] (dim 0: 2 vs {square})"


def test_past_a_length_a_number_is_described_by_its_length():
    with unlimited_int_text():
        for digits in (4301, 19000):
            assert int_text(10 ** (digits - 1)) == str(10 ** (digits - 1))
    assert int_text(10**30000) == "a 30,001-digit int"
    assert int_text(10**30000 - 1) == "a 30,000-digit int"
