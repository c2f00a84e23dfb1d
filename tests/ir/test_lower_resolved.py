"""Lowering consumes the checker's resolved form (linnet/ir/lower.py, semantics/resolved.py):
names mean what the checker resolved them to, calls bind as it bound them, and values it could
not know where it checked are computed in the instance being lowered. The first tests failed
before the switch (lowering looked names up, took a module parameter for the member the checker
meant, passed an int for a float parameter); the others hold what the switch must keep
(values the checker leaves unknown, a method checked under its config argument, a default
computed in the callee, an imported body's error located in its file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from linnet.ir import ProgramError, build, format_program
from linnet.ir.build import check_source, lower_program, read_source
from linnet.ir.core import walk_ops
from tests.conftest import EXAMPLES, ROOT

CASES = ROOT / "tests" / "semantics" / "cases"


def ops(program, entry: str = "forward", name: str | None = None):
    return [op for op in walk_ops(program.entries[entry]) if name is None or op.name == name]


class _NoLookups:
    """Stands for the analysis's names: lowering must not ask it anything."""

    def __call__(self, *args, **kwargs):
        raise AssertionError(f"lowering looked a name up: {args}")

    def __getattr__(self, name):
        raise AssertionError(f"lowering used the names' `{name}`")


@pytest.mark.parametrize(
    "source, preset",
    [(EXAMPLES / "llama.linnet", "llama_3_1_8b"), (ROOT / "tests/fixtures/imports/causal_lm.linnet", "tiny")],
)
def test_lowering_looks_no_name_up(source: Path, preset: str):
    """The checker bound every name and call; lowering reads what it resolved (with imported
    modules, and llama3 rope scaling's config argument)."""
    info = check_source(*read_source(source), preset)
    expected = format_program(lower_program(info, max_positions=16))
    info = check_source(*read_source(source), preset)
    info.analysis.globals = _NoLookups()
    assert format_program(lower_program(info, max_positions=16)) == expected


SHADOW = """
config C {
    d: int = 4
}

module Gain(d: int, scale: float = 2.0) {
    scale: [d]

    fn forward(x: [B, d]) -> [B, d] {
        x * scale
    }
}

model M(c: C) {
    gain: Gain(c.d)

    entry fn forward(x: [B, c.d]) -> [B, c.d] {
        gain(x)
    }
}
"""


def test_a_member_named_like_a_module_parameter_is_the_member():
    """Inside a module a member hides a module parameter of its name (the checker's order:
    locals, members, module parameters); lowering took the parameter, 2.0, and never read the
    tensor `gain.scale`."""
    (mul,) = ops(build(SHADOW), name="mul")
    assert mul.args["y"].producer.name == "param" and mul.args["y"].producer.attrs["path"] == "gain.scale"


FLOATS = """
config C {
    d: int = 4
}

fn halve(x: [N], s: float) -> [N] {
    x * (s / 2)
}

module Third(s: float) {
    fn forward(x: [N]) -> [N] {
        x * (s / 3)
    }
}

model M(c: C) {
    third: Third(1)

    entry fn forward(x: [c.d]) -> [c.d] {
        third(halve(x, 3))
    }
}
"""


def test_an_int_given_for_a_float_parameter_is_a_float():
    """The checker converts `3` for `s: float` to 3.0; lowering passed the int on, and `3 / 2`
    of ints is exact division: "3 is not divisible by 2"."""
    factors = [op.args["y"] for op in ops(build(FLOATS), name="mul")]
    assert factors == [1.5, pytest.approx(1 / 3)]


def test_compile_time_locals_lower_to_their_values():
    """tests/semantics/cases/locals.linnet: what the checker now leaves unknown is computed."""
    program = build(CASES / "locals.linnet")
    assert program.entries["positions"].outputs[0].dims[0].as_int() == 4  # n = 2; n = n * 2
    assert program.entries["count"].outputs[0].dims[0].as_int() == 3  # n = n + 1 per layer
    assert {p.path: p.shape for p in program.params}["proj.lin.weight"] == (4, 4)  # `wide` is false


METHOD_CONFIG = """
config C {
    d: int = 4
}

module Scaled(d: int) {
    fn forward(x: [B, d], s: RopeScaling?) -> [B, d] {
        if s == none { x } else { x * s.factor }
    }
}

model M(c: C) {
    scaled: Scaled(c.d)

    entry fn forward(x: [B, c.d]) -> [B, c.d] {
        scaled(x, none)
    }
}
"""


def test_a_method_is_lowered_from_its_check_under_its_config_arguments():
    """A method's config parameter is checked under the config's defaults with its module;
    lowered under `none`, the branch taken is the one that check never saw."""
    graph = build(METHOD_CONFIG).entries["forward"]
    assert graph.outputs == graph.inputs and ops(build(METHOD_CONFIG)) == []


DEFAULT = """
config C {
    d: int = 4
}

fn twice(x: [N], a: float, b: float = a * 2.0) -> [N] {
    x * b
}

module Scale(s: float) {
    fn forward(x: [N]) -> [N] {
        twice(x, s)
    }
}

model M(c: C) {
    scale: Scale(1.5)

    entry fn forward(x: [c.d]) -> [c.d] {
        scale(x)
    }
}
"""


def test_a_default_the_caller_did_not_know_is_computed_in_the_callee():
    """`Scale` is checked for every `s`: the default `a * 2.0` of its call is not known there,
    so lowering computes it in `twice`, with `a` bound to this instance's 1.5."""
    (mul,) = ops(build(DEFAULT), name="mul")
    assert mul.args["y"] == 3.0


def test_an_imported_body_that_fails_under_the_importers_config_is_a_located_error():
    """tests/fixtures/imports/odd: `c.d / 2` in the imported `Half` with the importer's d = 5: the check
    reports it at the member that builds `Half` (it passed, and lowering failed), the imported line labelled."""
    with pytest.raises(
        ProgramError, match=r"main\.linnet:9:11: error\[L206\]: `Half` under this config: c\.d / 2"
    ) as err:
        build(ROOT / "tests" / "fixtures" / "imports" / "odd" / "main.linnet", preset="odd")
    assert "lib.linnet:7:21" in str(err.value)


def test_an_imported_module_that_did_not_parse_whole_is_its_located_syntax_error(tmp_path: Path):
    """An imported file's syntax errors are not the importer's diagnostics, so the importer lowers; a member
    declaration of llama.linnet's `LlamaAttention` that did not parse whole (recovery dropped its arguments) then
    crashed lowering (AttributeError in an op's dtype rule) where it is the syntax error, located in its file."""
    good = "v_proj: Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, use_bias=c.attention_bias)"
    llama = (EXAMPLES / "llama.linnet").read_text(encoding="utf-8")
    assert llama.count(good) == 1
    broken = llama.replace(good, good.replace("head_dim,", "head_dim,,"))
    (tmp_path / "llama.linnet").write_text(broken, encoding="utf-8")
    (tmp_path / "mistral.linnet").write_text((EXAMPLES / "mistral.linnet").read_text(encoding="utf-8"))
    info = check_source(*read_source(tmp_path / "mistral.linnet"), None)
    assert not info.analysis.errors
    with pytest.raises(ProgramError, match=r"llama\.linnet:83:\d+: error\[L001\]: unexpected `,` \(`LlamaAttention`"):
        lower_program(info, max_positions=16)
