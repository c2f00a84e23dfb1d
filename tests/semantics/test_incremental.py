"""Incremental analysis: reuse across edits equals a fresh analysis, and an edit inside one
function body re-checks that one item."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.semantics.program import Document, Workspace
from linnet.syntax import ast as A
from linnet.types.core import format_type
from tests.conftest import EXAMPLES

LLAMA = (EXAMPLES / "llama.linnet").read_text()
GPT2 = (EXAMPLES / "gpt2.linnet").read_text()
# modules with `if`s among their members and int parameters (checked generically in them)
VAE = (EXAMPLES / "autoencoder_kl.linnet").read_text()
MODERNBERT = (EXAMPLES / "modernbert.linnet").read_text()
SNIPPETS = [
    "x",
    " + 1.0",
    "\n",
    "let q = x\n",
    "}",
    "{",
    "(",
    "c.hidden_size",
    "c.hiden_size",
    "#",
    "fn ",
    "module ",
    "preset p = Llama { hidden_size = 100 }\n",
    "  ",
    'rearrange(x, "b s -> s b")',
    "[B, S]",
]


def summary(analysis):
    return sorted(
        (d.location.start.offset, d.location.end.offset, d.code, d.message, d.notes, d.presets)
        for d in analysis.diagnostics
    )


@st.composite
def edits(draw, length):
    out = []
    for _ in range(draw(st.integers(1, 6))):
        start = draw(st.integers(0, length))
        end = min(length, start + draw(st.integers(0, 40)))
        text = draw(st.sampled_from(SNIPPETS)) if draw(st.booleans()) else ""
        out.append((start, end, text))
        length += len(text) - (end - start)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from([LLAMA, GPT2]), st.data())
def test_incremental_equals_full(source, data):
    doc = Document("t.linnet", source)
    doc.analyze()
    text = source
    for start, end, new in data.draw(edits(len(source))):
        start, end = min(start, len(text)), min(end, len(text))
        doc.edit(start, end, new)
        text = text[:start] + new + text[end:]
        incremental = doc.analyze()
    assert doc.text == text
    fresh = Document("t.linnet", text).analyze()
    assert summary(incremental) == summary(fresh)
    # types too: hover at a few places
    for offset in range(0, len(text), max(1, len(text) // 25)):
        a, b = incremental.type_at(offset), fresh.type_at(offset)
        assert (a and (a.symbolic, a.concrete)) == (b and (b.symbolic, b.concrete))


def test_edit_inside_a_function_body_rechecks_one_item():
    doc = Document("llama.linnet", LLAMA)
    first = doc.analyze()
    assert first.stats.items_checked == 5
    at = LLAMA.index("        down_proj(silu(gate_proj(x)) * up_proj(x))") + 8
    doc.edit(at, at, "let unused_probe = x\n        ")
    again = doc.analyze()
    assert again.stats.items_parsed == 1
    assert again.stats.checked_names == ["LlamaMLP"]
    assert [d.code for d in again.diagnostics] == ["L901"]


def test_signature_edit_rechecks_the_users():
    doc = Document("llama.linnet", LLAMA)
    doc.analyze()
    at = LLAMA.index("fn forward(x: [..., c.hidden_size]) -> [..., c.hidden_size] {\n        down_proj")
    sig_end = LLAMA.index("-> [..., c.hidden_size]", at)
    doc.edit(sig_end, sig_end + len("-> [..., c.hidden_size]"), "-> [..., c.intermediate_size]")
    again = doc.analyze()
    assert "LlamaMLP" in again.stats.checked_names and "LlamaDecoderLayer" in again.stats.checked_names
    assert "LlamaAttention" not in again.stats.checked_names
    codes = sorted(d.code for d in again.diagnostics)
    assert codes == ["L201", "L201", "L204"]  # the body no longer fits; both users add the wrong shape


def test_preset_edit_rechecks_under_that_preset_only():
    doc = Document("llama.linnet", LLAMA)
    doc.analyze()
    at = LLAMA.index("num_key_value_heads = 3")
    doc.edit(at, at + len("num_key_value_heads = 3"), "num_key_value_heads = 4")
    again = doc.analyze()
    assert again.stats.checks_run == 5  # one check of each module, under the edited preset
    errors = [d for d in again.diagnostics if d.code == "L206"]
    assert errors and all(d.presets == ("smollm2_135m",) for d in errors)


def test_repeated_body_edits_do_not_grow_the_check_caches():
    """The language server analyses after every keystroke: caches keyed by replaced items must
    not accumulate (they held every old version's AST)."""
    text = (EXAMPLES / "llama.linnet").read_text()
    at = text.index("let q = ") + len("let q =")
    edited = text[:at] + " " + text[at:]
    doc = Document("llama.linnet", text)
    doc.analyze()
    sizes = []
    for n in range(1, 21):
        doc.update(edited if n % 2 else text)
        doc.analyze()
        ctx = doc._context[1]
        sizes.append(
            (len(ctx.members_cache), len(ctx.signatures), sum(map(len, ctx.cache_keys.values())), len(ctx.followed))
        )
    assert sizes[-1] == sizes[1] and sizes[-1][0] > 0 and sizes[-1][3] > 0
    assert sizes[-1][2] == sizes[-1][0] + sizes[-1][1]  # the index of the caches' keys: each entry once


def test_reordering_config_fields_reorders_printed_products():
    """A product of config fields prints in declaration order (as a fresh check would), also
    after an edit that only reorders the declarations (their atoms are not reused)."""
    text = """config C {
    total: int = kv * hd
    hd: int = 64
    kv: int = 3
}

fn g(c: C, x: [B, c.kv * c.hd]) -> [B, c.kv] {
    x
}
"""
    doc = Document("t.linnet", text)
    (before,) = doc.analyze().errors
    assert "returns [B, c.hd * c.kv]" in before.message
    doc.update(text.replace("    hd: int = 64\n    kv: int = 3\n", "    kv: int = 3\n    hd: int = 64\n"))
    (after,) = doc.analyze().errors
    assert "returns [B, c.kv * c.hd]" in after.message


def test_a_partial_analysis_checks_only_the_items_asked_and_the_full_one_reuses_them():
    """`analyze(only=...)`, the language server's first pass over a big file: the items it accepts are checked, the
    others not; what it reports is a subset of the full analysis (the same syntax errors); the full analysis that
    follows checks only the rest, and equals a fresh one."""
    broken = GPT2.replace("n_embd", "n_embdd", 1) + "\nfn broken(x: [B]) -> [B] {\n    x +\n}\n"
    fresh = Document("t.linnet", broken).analyze()
    doc = Document("t.linnet", broken)
    checked = [i for i in doc.items if i.kind in ("module", "fn") and i.ast is not None]
    first = checked[: len(checked) // 2]
    partial = doc.analyze(only=lambda item: item in first)
    assert set(partial.items) == set(first)
    assert set(summary(partial)) <= set(summary(fresh))
    assert (
        {d.code for d in partial.diagnostics if d.code.startswith("L0")}
        == {d.code for d in fresh.diagnostics if d.code.startswith("L0")}
        != set()
    )
    full = doc.analyze()
    assert summary(full) == summary(fresh)
    assert full.stats.items_checked == len(checked) - len(first)


# ----- function-level reuse: an edit inside one function body re-checks that function only (semantics/fn_reuse.py)

BODY_SNIPPETS = SNIPPETS + ["let unused_probe = x\n", "x + y", "q_proj", "v_proj", "c.head_dim", "1.0 / 0"]


def _bodies(doc):
    """(start, end) of the text inside the braces of every method body of the document's non-model modules."""
    out = []
    for item in doc.items:
        tree = item.ast
        if item.kind != "module" or tree is None or tree.is_model:
            continue
        for m in A.flat_members(tree.members):
            if isinstance(m, A.FnDef):
                out.append((item.offset + m.body.span.start + 1, item.offset + m.body.span.end - 1))
    return out


def _node(item, node):
    return (type(node).__name__, item.offset + node.span.start, item.offset + node.span.end)


def _anchor(analysis, anchor):
    loc = analysis.resolve(anchor)
    return (loc.start.offset, loc.end.offset) if loc is not None else repr(analysis.canonical(anchor))


def results(analysis):
    """Everything the checks of the document's modules and functions found, by position: located findings with
    their labels, references, calls, types, resolved names and calls, per binding."""
    out = []
    for item in analysis.document.items:
        ia = analysis.items.get(item)
        for names, result in ia.results if ia is not None else ():
            located = []
            for f in result.findings:
                labels = tuple((_anchor(analysis, lb.anchor), lb.message) for lb in f.labels)
                located.append((f.code, f.message, _anchor(analysis, f.anchor), labels, tuple(f.notes)))
            out.append(
                (
                    item.name,
                    tuple(names or ()),
                    located,
                    [(s.start, s.end, _anchor(analysis, t)) for s, t in result.refs],
                    [(caller, callee, s.start, s.end) for caller, callee, s in result.calls],
                    sorted((_node(item, n), format_type(t, concrete=True)) for n, t in result.types.items()),
                    sorted((_node(item, n), r.kind, r.name) for n, r in result.names.items()),
                    sorted((_node(item, n), c.kind, sorted(c.args)) for n, c in result.call_info.items()),
                    [(s.fn is not None and s.fn.name.id, s.counts) for s in result.segments or ()],
                )
            )
    return out


@st.composite
def body_edits(draw, doc):
    """Edits inside method bodies of `doc`'s current text (inserting a snippet, deleting a few characters), some
    analysed one by one, some together."""
    out = []
    text = doc.text
    for _ in range(draw(st.integers(1, 8))):
        probe = Document("probe.linnet", text, std=doc.std)
        bodies = _bodies(probe)
        if not bodies:
            break
        lo, hi = draw(st.sampled_from(bodies))
        start = draw(st.integers(lo, hi))
        end = min(hi, start + draw(st.integers(0, 12)))
        new = draw(st.sampled_from(BODY_SNIPPETS)) if draw(st.booleans()) else ""
        out.append((start, end, new, draw(st.booleans())))
        text = text[:start] + new + text[end:]
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from([LLAMA, GPT2, VAE, MODERNBERT]), st.data())
def test_body_edits_checked_in_parts_equal_a_fresh_check(source, data):
    """Typing inside function bodies, through the function-level reuse: diagnostics, hover and every result of
    every check equal a fresh analysis of the same text."""
    doc = Document("t.linnet", source)
    incremental = doc.analyze()
    for start, end, new, analyse in data.draw(body_edits(doc)):
        doc.edit(start, end, new)
        if analyse:
            incremental = doc.analyze()
    incremental = doc.analyze()
    fresh = Document("t.linnet", doc.text).analyze()
    assert summary(incremental) == summary(fresh)
    assert results(incremental) == results(fresh)
    for offset in range(0, len(doc.text), max(1, len(doc.text) // 40)):
        a, b = incremental.type_at(offset), fresh.type_at(offset)
        assert (a and (a.symbolic, a.concrete)) == (b and (b.symbolic, b.concrete))


def test_a_body_edit_keeps_the_modules_other_functions_and_checks_one():
    """An edit inside `LlamaAttention.project` keeps the item and its other functions' nodes (their results are
    reused), moves the spans after it, and checks `project` again under each binding."""
    doc = Document("llama.linnet", LLAMA)
    before = doc.analyze()
    item = next(i for i in doc.items if i.name == "LlamaAttention")
    fns = {m.name.id: m for m in A.flat_members(item.ast.members) if isinstance(m, A.FnDef)}
    step_span = fns["step"].span
    old_results = [r for _, r in before.items[item].results]
    at = LLAMA.index("let k = rearrange(k_proj(x)")
    doc.edit(at, at, "let unused_probe = x\n        ")
    after = doc.analyze()
    assert next(i for i in doc.items if i.name == "LlamaAttention") is item
    now = {m.name.id: m for m in A.flat_members(item.ast.members) if isinstance(m, A.FnDef)}
    assert all(now[name] is fn for name, fn in fns.items())
    assert now["step"].span.start == step_span.start + len("let unused_probe = x\n        ")
    assert after.stats.checked_names == ["LlamaAttention"]
    for old, (_, new) in zip(old_results, after.items[item].results):
        assert new is not old and new.segments is not None
        step_call = next(n for n in A.walk(now["step"].body) if isinstance(n, A.Call))
        assert new.call_info[step_call] is old.call_info[step_call]  # taken over, not checked again
    assert [d.code for d in after.diagnostics] == ["L901"]
    assert summary(after) == summary(Document("llama.linnet", doc.text).analyze())


def test_unread_members_follow_body_edits_checked_in_parts():
    """What the entries read is found again for the edited function only (the others' parts are the same objects,
    `Resolved.parts`): calling `v_proj` in place of `k_proj` leaves `k_proj` unread (L904), and undoing it reads
    it again, as fresh analyses find."""
    doc = Document("llama.linnet", LLAMA)
    assert not [d for d in doc.analyze().diagnostics if d.code == "L904"]
    at = LLAMA.index("k_proj(x)")
    for text in (LLAMA[:at] + "v" + LLAMA[at + 1 :], LLAMA, LLAMA[:at] + "v" + LLAMA[at + 1 :]):
        doc.update(text)
        again = doc.analyze()
        assert summary(again) == summary(Document("llama.linnet", text).analyze())
        assert [d.message.split("`")[1] for d in again.diagnostics if d.code == "L904"] == (
            ["k_proj"] if text != LLAMA else []
        )


MODULE_WITH_A_SIGNATURE_ERROR = """config C {
    n: int = 7
}

preset p = C { n = 7 }

module M(c: C) {
    fn f(x: [B, 4]) -> [B, 4] {
        x
    }

    fn g(x: [B, c.n / 2]) -> [B, c.n / 2] {
        x
    }
}
"""
USER = """
module User(c: C) {
    m: M(c)

    fn forward(x: [B, 3]) -> [B, 3] {
        m.g(x)
    }
}
"""


def _located(analysis):
    return [
        (d.location.path, d.code, d.location.start.offset, d.message, [lb.location.start.offset for lb in d.labels])
        for d in analysis.diagnostics
    ]


def test_cached_signature_errors_after_a_body_edit_point_where_the_text_moved():
    """`M.g`'s signature error under `User`'s call is cached with the call's values; an edit in `M.f`'s body above it
    moves `g`: a check of `User` after it (here and in a file importing `M`) labels the new place, as a fresh
    analysis does (the cached entry is dropped at the edit)."""
    at = MODULE_WITH_A_SIGNATURE_ERROR.index("        x\n    }\n\n    fn g") + 9
    edited = MODULE_WITH_A_SIGNATURE_ERROR[:at] + " + x" + MODULE_WITH_A_SIGNATURE_ERROR[at:]
    user_edited = USER.replace("m.g(x)", "m.g(x) + x")
    # one file
    doc = Document("t.linnet", MODULE_WITH_A_SIGNATURE_ERROR + USER)
    doc.analyze()
    doc.update(edited + USER)
    doc.analyze()
    doc.update(edited + user_edited)
    assert _located(doc.analyze()) == _located(Document("t.linnet", edited + user_edited).analyze())
    # a file importing the module
    ws, fresh = Workspace(), Workspace()
    importer = 'from "m.linnet" import C, M\n' + USER
    ws.open("m.linnet", MODULE_WITH_A_SIGNATURE_ERROR)
    ws.open("u.linnet", importer).analyze()
    ws.open("m.linnet", edited).analyze()
    fresh.open("m.linnet", edited)
    importer_edited = 'from "m.linnet" import C, M\n' + user_edited
    again = ws.open("u.linnet", importer_edited).analyze()
    assert _located(again) == _located(fresh.open("u.linnet", importer_edited).analyze())
    assert any(d[1] == "L206" and d[4] for d in _located(again))


PRESET_EQUAL_TO_DEFAULTS = """config C {
    d: int = 8
    h: int = 2
}

preset p = C { d = 8, h = 2 }

module M(c: C) {
    fn f(x: [B, c.d]) -> [B, c.d] {
        x
    }
}

model Top(c: C) {
    m: M(c)

    fn forward(y: [B, 3]) -> [B, c.d] {
        m.f(y)
    }
}
"""


def _labels(analysis):
    return [
        (d.code, d.message, [(lb.location.start.line, lb.message) for lb in d.labels]) for d in analysis.diagnostics
    ]


def test_labels_follow_where_equal_config_values_come_from_after_an_edit():
    """A preset equal to the config's defaults shares their binding (one value); after an edit makes them differ
    (a default changed), or makes a preset spell out a value it took from the defaults, the preset's finding labels
    the preset's `d = 8`, as a fresh analysis does. The shared atom, the cached signature and the item's result
    under the value were keyed by the values alone and kept the defaults' `d: int = 8` (a difference found by
    bench/diff_incremental.py on bert.linnet, whose `bert_base_uncased` spells out the defaults)."""
    other_default = PRESET_EQUAL_TO_DEFAULTS.replace("h: int = 2", "h: int = 1")
    from_defaults = PRESET_EQUAL_TO_DEFAULTS.replace("preset p = C { d = 8, h = 2 }", "preset p = C { h = 3 }")
    spelt_out = PRESET_EQUAL_TO_DEFAULTS.replace("preset p = C { d = 8, h = 2 }", "preset p = C { d = 8, h = 3 }")
    for before, after in (
        (PRESET_EQUAL_TO_DEFAULTS, other_default),
        (from_defaults, spelt_out),
        (spelt_out, from_defaults),
    ):
        for preset in (None, "p"):
            ws = Workspace()
            ws.open("t.linnet", before).analyze(preset)
            again = ws.open("t.linnet", after).analyze(preset)
            assert _labels(again) == _labels(Workspace().open("t.linnet", after).analyze(preset))
    fresh = Workspace().open("t.linnet", spelt_out).analyze("p")
    (error,) = [d for d in fresh.diagnostics if d.code == "L203"]
    assert (error.labels[-1].location.start.line, error.labels[-1].message) == (6, "`d` = 8")  # 1-based: the preset


def test_products_print_in_declaration_order_when_a_preset_leaves_its_defaults():
    """A preset equal to the defaults until a default changes: its value's atoms are all made again (its `a` now
    comes from the preset), not only the field whose origin changed; a product of a new atom and a reused one
    printed in the order of their making (`c.hd * c.a`), not as declared (`c.a * c.hd`), as a fresh analysis does."""
    text = """config C {
    a: int = 5
    hd: int = 64
}

preset p = C { a = 5 }

fn g(c: C, x: [B, c.a * c.hd]) -> [B, c.a] {
    x
}
"""
    edited = text.replace("a: int = 5", "a: int = 3")
    for preset in (None, "p"):
        ws = Workspace()
        ws.open("t.linnet", text).analyze(preset)
        messages = [d.message for d in ws.open("t.linnet", edited).analyze(preset).diagnostics]
        assert messages == [d.message for d in Workspace().open("t.linnet", edited).analyze(preset).diagnostics]
        assert all("c.hd * c.a" not in m for m in messages)


def test_an_importer_lowers_the_imported_body_as_edited_after_a_first_items_pass():
    """After the server's first-items pass over llama.linnet (a partial analysis of its start: the items after the
    cut are parsed again after it) and an edit that breaks `LlamaDecoderLayer.step`'s body, mistral.linnet's checks
    are reused (the interfaces it reads are unchanged) and named the layer from before the edit: its lowering (the
    cost hover, `lower_analysis`) succeeded with the old body where a fresh workspace's refuses the broken one."""
    from linnet.errors import SourceError
    from linnet.ir.build import lower_analysis

    llama, mistral = str(EXAMPLES / "llama.linnet"), str(EXAMPLES / "mistral.linnet")
    importer = (EXAMPLES / "mistral.linnet").read_text()
    old = "positions, rows)\n        x + mlp(post_attention_layernorm(x))\n"
    assert LLAMA.count(old) == 1
    broken = LLAMA.replace(old, "positions, rows)+ mlattention_layernorm(x))\n")
    refused = r"llama.linnet:\d+:\d+: error\[L001\]: unexpected `\)` \(`LlamaDecoderLayer` under this config\)"
    fresh = Workspace()
    fresh.open(llama, broken)
    with pytest.raises(SourceError, match=refused):
        lower_analysis(fresh.open(mistral, importer).analyze(), "mistral_7b_instruct_v0_3")
    ws = Workspace()
    ws.open(mistral, importer).analyze()  # reads llama.linnet from disk
    cut = LLAMA.index("\nmodule LlamaAttention") + 1  # the server's first pass: the items before it
    ws.open(llama, LLAMA[:cut]).analyze(None, only=lambda item: True)
    ws.open(llama, broken)
    with pytest.raises(SourceError, match=refused):
        lower_analysis(ws.open(mistral, importer).analyze(), "mistral_7b_instruct_v0_3")


def test_a_body_edit_in_a_module_the_model_builds_is_checked_again_with_its_instances():
    """The root model's check that follows its calls into each instance (instances.py) keeps what it found
    across edits: an edit in a module's body that breaks one instance is reported, and taking it back clears it,
    as a fresh analysis does (a kept finding would stay stale)."""
    text = (Path(__file__).parent / "cases" / "instance_values.linnet").read_text()
    text = text.replace("preset odd = Widths { width = 6 }", "preset odd = Widths { width = 12 }")
    text = text.replace("if stride == 3 { x[:, :, :H - 1] } else { x }", "x").replace(
        "linears[k](x)", "linears[k - 1](x)"
    )
    doc = Document("instance_values.linnet", text)
    assert doc.analyze().errors == []
    at = text.index("norm(x)\n")
    doc.edit(at, at + len("norm(x)"), 'rearrange(x, "b (g c) h w -> b (c g) h w", g=8)')
    broken = doc.analyze()
    assert [d.code for d in broken.errors] == ["L205"] and "12 is not divisible by 8" in broken.errors[0].message
    fresh = Document("instance_values.linnet", doc.text).analyze()
    assert [d.message for d in fresh.errors] == [d.message for d in broken.errors]
    doc.edit(at, at + len('rearrange(x, "b (g c) h w -> b (c g) h w", g=8)'), "norm(x)")
    assert doc.analyze().errors == []


@pytest.mark.parametrize(
    ("case", "old", "new"),
    [
        ("method_values", "linears[i](x)", "linears[0](x)"),  # `layer(h, 2)` checked with its value read this body
        ("returned_sizes", "channels / 2", "channels / 4"),  # `half()`'s value: the body of a size a method returns
        ("returned_bools", "c.d > 4", "c.d > 8"),  # `doubled()`'s value: the branch a method chooses
        ("returned_bools", "c.window != none", "c.window == none"),  # a top-level function's: the model's check
        ("returned_floats", "2.0 * c.rate", "c.rate"),  # `doubled_rate()`'s value: a rate dropout needs below 1
        ("returned_tuples", "(c.ch, 8)", "(64, 8)"),  # `sizes()`'s values: the sizes a `let` takes apart
        ("returned_tuples", "2.0 * c.rate)", "c.rate)"),  # a float in a tuple of a tuple and a float
        ("returned_strs", "c.ch > 8", "c.ch < 8"),  # `activation(c)`'s value: a top-level function's str
    ],
)
def test_a_body_edit_checks_again_the_functions_that_read_that_body(case, old, new):
    """A function whose check read another method's body at a call (`fn_reuse.Segment.reads`) is checked again
    when that body is edited: before, its part was taken as it was, and an L212 that the edit removed stayed."""
    text = (Path(__file__).parent / "cases" / f"{case}.linnet").read_text()
    doc = Document(f"{case}.linnet", text)
    doc.analyze()
    at = text.index(old)
    doc.edit(at, at + len(old), new)
    incremental = doc.analyze()
    fresh = Document(f"{case}.linnet", doc.text).analyze()
    assert summary(incremental) == summary(fresh)
    assert results(incremental) == results(fresh)
    assert {d.code for d in fresh.errors} != {d.code for d in Document(case, text).analyze().errors}
