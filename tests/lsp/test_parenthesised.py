"""What the language server reads from spans, around parenthesised expressions: a hover over an expression quotes
all of it (its operand's parentheses were cut off: `x + x) * 2.0`), a call result's hint follows the parentheses
around the call, and at a name inside parentheses hover, go-to-definition, highlights and rename answer as they do
for the bare name (the node of `(e)` keeps its contents' span: nothing that points at a name moved)."""

from __future__ import annotations

from linnet.lsp import navigation
from linnet.lsp.hints import inlay_hints
from linnet.lsp.hover import hover_markdown
from linnet.semantics.program import Document

SOURCE = """fn twice(x: [B, H]) -> [B, H] {
    let y = (x + x) * 2.0
    let z = ((y))
    z * (y) + y
}
"""


def _analysis():
    return Document("parens.linnet", SOURCE).analyze()


def test_a_hover_over_an_expression_quotes_its_parenthesised_operand_whole():
    analysis = _analysis()
    at = SOURCE.index(") * 2.0") + 2  # on the `*`
    markdown, (start, end) = hover_markdown(analysis, at, None)
    assert SOURCE[start:end] == "(x + x) * 2.0"
    assert markdown.startswith("```linnet\n(x + x) * 2.0: [B, H]\n```")


def test_a_name_inside_parentheses_answers_as_the_bare_name():
    analysis = _analysis()
    declared = SOURCE.index("y = ")
    bare = SOURCE.rindex("+ y") + 2
    for inside in (SOURCE.index("((y))") + 2, SOURCE.index("(y) +") + 1):
        assert SOURCE[inside] == "y"
        markdown, (start, end) = hover_markdown(analysis, inside, None)
        assert (SOURCE[start:end], markdown) == ("y", hover_markdown(analysis, bare, None)[0])
        assert markdown.startswith("```linnet\ny: [B, H]\n```")
        found = navigation.definition(analysis, inside)
        assert (found.start.offset, found.end.offset) == (declared, declared + 1)
        assert navigation.rename_range(analysis, inside) == (inside, inside + 1)
    lit = sorted((loc.start.offset, loc.end.offset) for loc, _ in navigation.highlights(analysis, bare))
    assert [SOURCE[s:e] for s, e in lit] == ["y"] * 4
    plan = navigation.plan_rename(analysis, bare, "w")
    edits = navigation.rename_edits([analysis], plan, "w")
    renamed = SOURCE
    for loc in sorted(edits, key=lambda loc: -loc.start.offset):
        renamed = renamed[: loc.start.offset] + "w" + renamed[loc.end.offset :]
    assert renamed == SOURCE.replace("let y", "let w").replace("(y)", "(w)").replace("+ y", "+ w")


def test_a_call_result_s_hint_follows_its_parentheses():
    source = "fn f(x: [B, H]) -> [B, H] {\n    (exp(x))\n}\n"
    analysis = Document("hint.linnet", source).analyze()
    (hint,) = [h for h in inlay_hints(analysis, 0, len(source), None, 80) if h.kind == "result"]
    assert (source[: hint.offset].splitlines()[-1], hint.label) == ("    (exp(x))", "-> [B, H]")
