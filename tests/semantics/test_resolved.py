"""The checker's resolved form (semantics/resolved.py, `Analysis.resolved`): what each name
refers to and how each call binds, so that lowering consumes it instead of resolving again."""

from __future__ import annotations

from pathlib import Path

import pytest

from linnet.ops import REGISTRY
from linnet.semantics.program import Document, std_library
from linnet.syntax import ast as A
from linnet.types.core import F32, ConfigT, TensorT, UnknownT, format_type
from linnet.types.dims import format_dim
from tests.conftest import EXAMPLES, ROOT

SOURCE = """config C {
    hidden: int = 8
    heads: int = 2
    scale: float = 0.5
}

preset wide = C { hidden = 16, heads = 4 }

fn halve(x: [..., 2 * H], factor: float = 2.0) -> [..., H] {
    x[..., :H] / factor
}

module Block(c: C, n: int = 3) {
    proj: Linear(c.hidden, c.hidden, use_bias=false)
    gain: [c.hidden]
    state cache: [max_batch, c.hidden]

    fn forward(x: [B, c.hidden]) -> f32[B, c.hidden / 2] {
        let y = proj(x) * gain
        let x = halve(y)
        let heads = rearrange(y, "b (h d) -> b h d", h=c.heads)
        let _first = sum(heads, dim=1)
        let _same = self_check(y)
        cast(x * c.scale * n + pi, f32)
    }

    fn self_check(x: [B, c.hidden]) -> [B, c.hidden] {
        transpose(transpose(x, 0, 1), 0, 1) * 1.0 + 0.0 * max_batch
    }
}
"""


@pytest.fixture(scope="module")
def analysis():
    a = Document("r.linnet", SOURCE).analyze()
    assert [d for d in a.diagnostics if d.is_error] == []
    return a


def body_of(analysis, item: str, fn: str) -> A.FnDef:
    mdef = analysis.globals(item).ast
    return next(m for m in A.flat_members(mdef.members) if isinstance(m, A.FnDef) and m.name.id == fn)


def names_in(node, name: str) -> list[A.Name]:
    return [n for n in A.walk(node) if isinstance(n, A.Name) and n.id == name]


def call_of(analysis, fn: A.FnDef, text: str) -> A.Call:
    item = analysis.globals("Block")
    return next(
        n for n in A.walk(fn.body) if isinstance(n, A.Call) and item.text[n.span.start : n.span.end].startswith(text)
    )


def test_names_refer_to_their_definitions(analysis):
    r = analysis.resolved("Block", "defaults")
    fn = body_of(analysis, "Block", "forward")
    lets = {s.targets[0].id: s.targets[0] for s in fn.body.stmts if isinstance(s, A.Let)}
    param_x = fn.params[0].name
    # `x` is the parameter until `let x` shadows it; then the local
    uses = [r.ref(n) for n in names_in(fn.body, "x") if n is not lets["x"]]
    assert [(u.kind, u.node) for u in uses] == [("param", param_x), ("local", lets["x"])]
    (y_use, *_) = [r.ref(n) for n in names_in(fn.body, "y") if n is not lets["y"]]
    assert y_use.kind == "local" and y_use.node is lets["y"]
    gain = r.ref(names_in(fn.body, "gain")[0])
    assert (gain.kind, gain.value, gain.node.name.id) == ("member", "param", "gain")
    proj = r.ref(names_in(fn.body, "proj")[0])
    assert (proj.kind, proj.value) == ("member", "submodule")
    n = r.ref(names_in(fn.body, "n")[0])
    assert n.kind == "module_param" and n.value is not None and n.value.name == "n"
    (b_dim,) = [r.ref(x) for x in names_in(fn.params[0], "B")]
    assert b_dim.kind == "dim" and b_dim.node is names_in(fn.params[0], "B")[0]
    field = r.ref(next(a.name for a in A.walk(fn.body) if isinstance(a, A.Attr) and a.name.id == "scale"))
    assert field.kind == "config_field" and field.node.name.id == "scale" and field.value.values["scale"] == 0.5
    assert r.ref(names_in(fn.body, "pi")[0]).kind == "constant"
    assert r.ref(names_in(fn.body, "f32")[0]).value is F32
    assert r.ref(names_in(fn.body, "halve")[0]).kind == "fn"
    assert r.ref(names_in(fn.body, "rearrange")[0]).value is REGISTRY["rearrange"]
    check = body_of(analysis, "Block", "self_check")
    assert r.ref(names_in(check.body, "max_batch")[0]).kind == "load_dim"


def test_calls_bind_arguments_with_defaults_and_solved_dims(analysis):
    r = analysis.resolved("Block", "defaults")
    fn = body_of(analysis, "Block", "forward")
    halve = r.call(call_of(analysis, fn, "halve("))
    assert halve.kind == "fn" and halve.callee.name.id == "halve"
    assert list(halve.args) == ["x", "factor"]
    assert halve.args["x"].node is not None and isinstance(halve.args["x"].value, TensorT)
    factor = halve.args["factor"]
    assert factor.node is None and factor.value.value == 2.0 and isinstance(factor.default, A.FloatLit)
    assert {k: format_dim(v) for k, v in halve.dims.items()} == {"H": "c.hidden / 2"}
    assert halve.dims["H"].as_int() == 4

    rearrange = r.call(call_of(analysis, fn, "rearrange("))
    assert rearrange.kind == "op" and rearrange.callee is REGISTRY["rearrange"]
    assert rearrange.args["pattern"].value == "b (h d) -> b h d"
    assert list(rearrange.sizes) == ["h"] and rearrange.sizes["h"].value.as_int() == 2
    total = r.call(call_of(analysis, fn, "sum("))
    assert total.args["dim"].value == 1 and total.args["keepdim"].node is None  # index converted, default filled

    forward = r.call(call_of(analysis, fn, "proj("))
    assert forward.kind == "forward" and forward.callee.name.id == "forward" and forward.item.name == "Linear"
    method = r.call(call_of(analysis, fn, "self_check("))
    assert method.kind == "method" and method.receiver is None


def test_submodule_constructors_bind_their_parameters(analysis):
    r = analysis.resolved("Block", "defaults")
    mdef = analysis.globals("Block").ast
    ctor = next(m.ctor for m in A.flat_members(mdef.members) if isinstance(m, A.FieldDecl) and m.name.id == "proj")
    linear = r.call(ctor)
    assert linear.kind == "module" and linear.item.name == "Linear"
    assert list(linear.args) == ["in_features", "out_features", "use_bias"]
    assert linear.args["in_features"].value.value.as_int() == 8
    assert linear.args["use_bias"].value.value is False


def test_a_preset_or_a_config_value_picks_the_check(analysis):
    fn = body_of(analysis, "Block", "forward")
    node = call_of(analysis, fn, "halve(")
    assert analysis.resolved("Block", "wide").call(node).dims["H"].as_int() == 8
    wide = next(s for s in analysis.scenarios if s.name == "wide").configs["C"]
    assert analysis.resolved("Block", config={"c": wide}).call(node).dims["H"].as_int() == 8
    assert analysis.resolved("Block", config={"c": ConfigT(wide)}).call(node).dims["H"].as_int() == 8
    assert analysis.resolved("C") is None  # a config is data, not checked code


def test_folded_values(analysis):
    r = analysis.resolved("Block", "defaults")
    fn = body_of(analysis, "Block", "forward")
    scale = next(a for a in A.walk(fn.body) if isinstance(a, A.Attr) and a.name.id == "scale")
    assert r.value(scale) == 0.5
    halve = analysis.resolved("halve")
    sliced = next(s for s in A.walk(body_of_fn(analysis, "halve").body) if isinstance(s, A.Slice))
    assert format_dim(halve.value(sliced.stop)) == "H"


def body_of_fn(analysis, name: str) -> A.FnDef:
    return analysis.globals(name).ast


def test_standard_library_items_are_resolved_by_their_own_check(analysis):
    r = analysis.resolved("rms_norm")
    assert r is not None
    std = std_library()
    item = next(i for i in std.items if i.name == "rms_norm")
    assert r.types is std.analysis(item).resolved(item).types
    kinds = {ref.kind for ref in r.names.values()}
    assert {"param", "op", "dtype"} <= kinds


def definitions(root) -> set[int]:
    """The A.Name nodes that define rather than use a name."""
    out = set()
    for n in A.walk(root):
        if isinstance(n, A.Let):
            out |= {id(t) for t in n.targets}
        elif isinstance(n, (A.Param, A.FieldDecl, A.StateDecl, A.FnDef, A.ModuleDef, A.Generic)):
            out.add(id(n.name))
        elif isinstance(n, A.For):
            out.add(id(n.var))
        elif isinstance(n, A.Arg) and n.name is not None:
            out.add(id(n.name))
    return out


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.linnet")) + [Path(p) for p in std_library().paths()])
def test_every_name_use_and_call_is_resolved(path):
    """What lowering needs is all there: in the examples and the standard library, every name
    use the checker typed has a Ref and every call a CallInfo whose arguments are bound."""
    document = Document(str(path), path.read_text())
    analysis = document.analyze()
    for item, ia in analysis.items.items():
        defined = definitions(item.ast)
        for _, result in ia.results:
            for node, t in result.types.items():
                if isinstance(node, A.Name) and id(node) not in defined and not isinstance(t, UnknownT):
                    assert node in result.names, f"{item.name}: `{node.id}` ({format_type(t)}) is not resolved"
                if isinstance(node, A.Call) and not isinstance(t, UnknownT):
                    info = result.call_info.get(node)
                    assert info is not None, f"{item.name}: a call at {node.span} is not resolved"
                    if info.kind == "conversion":  # `int(x)`, `len(xs)`: a builtin named by a string, no parameters
                        assert info.callee in ("int", "len"), info.callee
                        continue
                    params = info.callee.params
                    wanted = [p.name if info.kind == "op" else p.name.id for p in params]
                    wanted = [w for w, p in zip(wanted, params) if getattr(p, "kind", None) != "sizes"]
                    assert list(info.args) == wanted, (item.name, list(info.args), wanted)
                    for arg in info.args.values():
                        assert not isinstance(arg.value, UnknownT), (item.name, arg)


DEFAULTS = """
fn twice(x: [N], a: float, b: float = a * 2.0) -> [N] {
    x * b * sqrt(4.0)
}
"""


def test_a_default_is_resolved_in_its_function_and_an_op_on_numbers_is_marked():
    analysis = Document("d.linnet", DEFAULTS).analyze()
    assert [d for d in analysis.diagnostics if d.is_error] == []
    r = analysis.resolved("twice")
    fn = body_of_fn(analysis, "twice")
    a_param, b_param = fn.params[1], fn.params[2]
    (a_use,) = names_in(b_param.default, "a")
    assert r.ref(a_use).kind == "param" and r.ref(a_use).node is a_param.name
    calls = {c.func.id: r.call(c) for c in A.walk(fn.body) if isinstance(c, A.Call)}
    assert calls["sqrt"].scalar and calls["sqrt"].folded == 2.0


def test_a_config_value_no_check_has_is_checked_on_demand():
    """`rope_inv_freq(half, theta, scaling: RopeScaling?)` is checked in the standard library
    under the config's defaults: `scaling == none` is false there. Under `none` (what SmolLM2
    passes) it is checked again, once, with `scaling == none` true."""
    analysis = Document("r.linnet", SOURCE).analyze()
    fn = body_of_fn(analysis, "rope_inv_freq")
    test = next(n for n in A.walk(fn.body) if isinstance(n, A.Compare) and isinstance(n.right, A.NoneLit))
    assert analysis.resolved("rope_inv_freq").value(test) is False
    under_none = analysis.resolved("rope_inv_freq", config={"scaling": None})
    assert under_none.value(test) is True and under_none.errors == []
    assert analysis.resolved("rope_inv_freq", config={"scaling": None}) is under_none


def test_an_imported_module_is_resolved_under_the_importers_config():
    """`causal_lm.linnet` imports llama.linnet's LlamaModel and configures it with its own
    preset `tiny` (head_dim 8), which llama.linnet's own analysis never checked it under."""
    path = ROOT / "tests" / "fixtures" / "imports" / "causal_lm.linnet"
    analysis = Document(str(path), path.read_text()).analyze()
    model = analysis.resolved("CausalLM", "tiny")
    mdef = analysis.globals("CausalLM").ast
    ctor = next(m.ctor for m in A.flat_members(mdef.members) if isinstance(m, A.FieldDecl) and m.name.id == "model")
    tiny = model.call(ctor).args["c"].value.value
    decoder = analysis.globals("Decoder")
    r = analysis.resolved(decoder, config={"c": tiny})
    rotary = next(m for m in A.flat_members(decoder.ast.members) if isinstance(m, A.FnDef) and m.name.id == "rotary")
    call = next(c for c in A.walk(rotary.body) if isinstance(c, A.Call) and c.func.id == "rope_inv_freq")
    assert r.call(call).args["half"].value.value.as_int() == 4 and r.errors == []


def test_the_errors_of_a_check_on_demand_are_kept():
    """tests/fixtures/imports/odd: a body that checks under its own file's config but not under
    the importer's. Its check on demand keeps the error in the imported file; the importer's
    analysis reports it too, at the member that builds the module (`imported.py`: it had no
    error, and lowering then failed)."""
    main = ROOT / "tests" / "fixtures" / "imports" / "odd" / "main.linnet"
    analysis = Document(str(main), main.read_text()).analyze()
    (reported,) = [d for d in analysis.diagnostics if d.is_error]
    assert reported.code == "L206" and reported.location.path == str(main) and reported.location.start.line == 9
    assert reported.message.startswith("`Half` under this config: c.d / 2 is not exact")
    assert [(lab.location.path.endswith("lib.linnet"), lab.location.start.line) for lab in reported.labels] == [
        (True, 7)
    ]
    odd = next(s for s in analysis.scenarios if s.name == "odd").configs["C"]
    (error,) = analysis.resolved(analysis.globals("Half"), config={"c": odd}).errors
    assert error.code == "L206" and error.location.path.endswith("lib.linnet") and error.location.start.line == 7
