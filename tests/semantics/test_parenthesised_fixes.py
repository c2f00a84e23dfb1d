"""A fix that rewrites an operand rewrites all of it: an operand that starts or ends with a parenthesised
expression spanned without that parenthesis, so casting `(a) * 2` wrote `(cast(a) * 2, i32)`, which does not
parse."""

from __future__ import annotations

from linnet.semantics.program import Document
from tests.conftest import apply_fix

SOURCE = "fn widths(a: i64[N], b: i32[N]) -> i32[N] {\n    (a) * 2 + b\n}\n"


def test_a_cast_fix_casts_the_whole_parenthesised_operand_and_checks_clean():
    (diag,) = Document("widths.linnet", SOURCE).analyze().diagnostics
    assert diag.code == "L302" and diag.message == "`+` mixes i64 and i32"
    (fix,) = [f for f in diag.fixes if f.message == "cast `(a) * 2` to i32"]
    fixed = apply_fix(SOURCE, fix)
    assert fixed == SOURCE.replace("(a) * 2 + b", "cast((a) * 2, i32) + b")
    assert Document("widths.linnet", fixed).analyze().diagnostics == []
