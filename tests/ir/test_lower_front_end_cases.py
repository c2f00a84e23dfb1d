"""Lowering of the front-end defects' cases (issue 13, part 8): what now checks clean also
lowers to what it means."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from linnet.errors import LinnetError
from linnet.ir import build
from linnet.ir.build import _source_info, analyze_source, lower_program
from linnet.ir.core import walk_ops

SPLIT_HEADS = """
config C {
    heads: int = 4
    hidden: int = 8
}

## The head count is a parameter of the helper, not a known number where it is checked.
fn split_heads(x: [B, S, heads * D], heads: int) -> [B, heads, S, D] {
    rearrange(x, "b s (h d) -> b h s d", h=heads)
}

model M(c: C) {
    entry fn forward(x: [B, S, c.hidden]) -> [B, c.heads, S, c.hidden / c.heads] {
        split_heads(x, c.heads)
    }
}
"""


def test_a_head_count_parameter_lowers_to_its_value():
    graph = build(SPLIT_HEADS).entries["forward"]
    (op,) = [o for o in walk_ops(graph) if o.name == "rearrange"]  # in the function split_heads
    assert op.args["sizes"]["h"].as_int() == 4
    assert [d.as_int() for d in graph.outputs[0].dims[1:2] + graph.outputs[0].dims[3:]] == [4, 2]


@pytest.mark.torch
def test_a_head_count_parameter_runs():
    torch = pytest.importorskip("torch")
    from linnet.compiler.torch.codegen import flat_program
    from linnet.compiler.torch.interpret import Interpreter

    graph = flat_program(build(SPLIT_HEADS)).entries["forward"]
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    out = Interpreter(graph).run({}, torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(out, x.reshape(2, 3, 4, 2).transpose(0, 2, 1, 3))


def test_an_index_past_a_submodule_list_is_a_located_lowering_error():
    """Lowering builds what the checker would refuse (here: lowered in spite of the check's L212) with a located
    error, never a bare IndexError: the checker's own reach into int parameters has limits."""
    path = "tests/semantics/cases/method_values.linnet"
    text = Path(path).read_text(encoding="utf-8")
    analysis = analyze_source(path, text, "shallow")
    assert [d.code for d in analysis.diagnostics if d.severity == "error"] == ["L212"]
    info = _source_info(path, text, analysis, "shallow")
    with pytest.raises(LinnetError, match=r"method_values\.linnet:17:\d+: index 2 is out of range for a list of 2"):
        lower_program(info, optimize_ir=False)
