"""An edit inside one function body of a module applied in place (`splice.splice_body`) gives the tree a parse of the
whole new text gives: on mutations of every function body of the repository's modules, whichever route it takes
(the body parsed alone, `descent.parse_block`, or the whole item parsed again and compared)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.syntax import ast as A
from linnet.syntax import descent, splice
from linnet.syntax.items import Source, make_item
from tests.syntax.test_descent import ITEMS, VOCABULARY

SOURCE = Source("/corpus.linnet", "")


def _bodies(text: str) -> list[tuple[int, int]]:
    """(start, end) of each function body of a module's text (not a model's: `splice_body` leaves those)."""
    item = make_item(SOURCE, 0, text)
    if item.kind != "module" or not isinstance(item.ast, A.ModuleDef) or item.ast.is_model:
        return []
    return [(m.body.span.start, m.body.span.end) for m in A.flat_members(item.ast.members) if isinstance(m, A.FnDef)]


MODULES = [(text, bodies) for _, text in ITEMS if len(text) < 6000 and (bodies := _bodies(text))]


@st.composite
def body_edits(draw) -> tuple[str, str]:
    """A module's text and that text with one to three edits strictly inside the braces of one function body."""
    text, bodies = draw(st.sampled_from(MODULES))
    start, end = draw(st.sampled_from(bodies))
    new, inner_end = text, end - 1  # edits stay in (start, inner_end]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(start + 1, inner_end))
        action = draw(st.sampled_from(["delete", "insert", "replace"]))
        gone = draw(st.integers(0, min(6, inner_end - at))) if action != "insert" else 0
        put = draw(st.sampled_from(VOCABULARY)) if action != "delete" else ""
        new = new[:at] + put + new[at + gone :]
        inner_end += len(put) - gone
    return text, new


def _spliced(old: str, new: str) -> tuple[str, list] | None:
    item = make_item(SOURCE, 0, old)
    if splice.splice_body(item, new) is None:
        return None
    assert item.interface == make_item(SOURCE, 0, new).interface  # what importers see is unchanged
    return repr(item.ast), [(p.code, p.message, p.span) for p in item.problems]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body_edits())
def test_a_spliced_body_edit_gives_the_tree_of_the_whole_new_text(edit):
    old, new = edit
    spliced = _spliced(old, new)
    if spliced is None:
        return
    fresh = make_item(SOURCE, 0, new)
    assert spliced == (repr(fresh.ast), [(p.code, p.message, p.span) for p in fresh.problems])


def test_a_valid_body_edit_takes_the_parse_of_the_body_alone(monkeypatch):
    calls = []
    parse_block = descent.parse_block
    monkeypatch.setattr(descent, "parse_block", lambda *args: calls.append(block := parse_block(*args)) or block)
    old = (
        "module M(c: C) {\n    fn f(x: [B]) -> [B] {\n        let y = x + 1\n        y\n    }\n\n"
        "    fn g() {\n        1\n    }\n}\n"
    )
    new = old.replace("x + 1", "(x *\n 2) + 1")
    assert _spliced(old, new) == (repr(make_item(SOURCE, 0, new).ast), [])
    assert len(calls) == 1 and isinstance(calls[0], A.Block)


CONFIGURED = (
    "module M(c: C) {\n    q_proj: Linear(c.n, c.n)\n    v_proj: Linear(c.n, c.n)\n\n"
    "    fn f(x: [B, c.n]) -> [B, c.n] {\n        let y = q_proj(x)\n        y * c.scale\n    }\n\n"
    "    fn g(x: [B, c.n]) -> [B, c.n] {\n        let d = c\n        x\n    }\n}\n"
)


def _whole_parses(monkeypatch) -> list:
    """The items `plan_splice` parses whole (it parses the body alone where it can)."""
    made = []
    monkeypatch.setattr(splice, "make_item", lambda *args: made.append(item := make_item(*args)) or item)
    return made


def test_an_edit_that_reads_no_other_config_field_takes_the_body_alone(monkeypatch):
    made = _whole_parses(monkeypatch)
    new = CONFIGURED.replace("q_proj(x)", "v_proj(x)")
    assert _spliced(CONFIGURED, new) == (repr(make_item(SOURCE, 0, new).ast), [])
    assert made == []  # (a call to another member, `v_proj(x)`, is not a config read)


def test_an_edit_that_reads_another_config_field_changes_the_interface(monkeypatch):
    made = _whole_parses(monkeypatch)
    for new in (
        CONFIGURED.replace("y * c.scale", "y * c.eps"),  # through the parameter
        CONFIGURED.replace("y * c.scale", "y * d.eps"),  # through `let d = c` in another function
    ):
        made.clear()
        assert _spliced(CONFIGURED, new) is None  # the item is checked anew: its interface differs
        assert len(made) == 1


def test_successive_body_edits_keep_the_interface_a_whole_parse_gives():
    item = make_item(SOURCE, 0, CONFIGURED)
    text = CONFIGURED
    steps = [
        ("let y = q_proj(x)", "let e = c\n        let y = q_proj(x)"),  # a new alias of the config, unused
        ("y * c.scale", "y * c.scale + 0"),  # an edit that keeps the interface
        ("y * c.scale + 0", "(y + 1) * c.scale"),
        ("(y + 1) * c.scale", "(y + 1) * c.scale * e.eps"),  # reads `eps` through the new alias: another interface
    ]
    results = []
    for old, new in steps:
        text = text.replace(old, new)
        edit = splice.splice_body(item, text)
        if edit is None:
            item = make_item(SOURCE, 0, text)
        else:
            assert repr(item.ast) == repr(make_item(SOURCE, 0, text).ast)
        assert item.interface == make_item(SOURCE, 0, text).interface
        results.append(edit is not None)
    assert results == [True, True, True, False]
