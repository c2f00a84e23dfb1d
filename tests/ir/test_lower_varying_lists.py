"""Lowering a loop over submodules that differ (`[Up(...) for i in range(n)]`) where each element changes the
size of the value the loop carries: the checker leaves those dims unknown (tests/semantics/cases/varying_lists),
lowering unrolls the loop, solves each call's dims from its arguments and checks the entry's declared result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from linnet.errors import SourceError
from linnet.ir import build

CASE = Path(__file__).parent.parent / "semantics" / "cases" / "varying_lists.linnet"


def source(text: str | None = None) -> str:
    text = CASE.read_text(encoding="utf-8") if text is None else text
    # the case's deliberate rank error is not lowered: drop the function that holds it
    return text[: text.index("    fn rank(")] + "}\n"


def test_each_element_gets_its_own_sizes():
    graph = build(source()).entries["decode"]
    (out,) = graph.outputs
    assert [str(d) for d in out.dims] == ["B", "8", "2 * H", "2 * W"]


def test_a_wrong_declared_result_is_an_error():
    """The check that follows the model's calls into each element (semantics/instances.py) reports it before
    lowering would (L204)."""
    wrong = source().replace("-> [B, 8, 2 * H, 2 * W]", "-> [B, 8, 4 * H, 2 * W]")
    with pytest.raises(SourceError, match=r"L204\]: `decode` returns \[B, 8, 2 \* H, 2 \* W\], declared .*4 \* H"):
        build(wrong)


@pytest.mark.torch
def test_it_runs_as_numpy_says():
    torch = pytest.importorskip("torch")
    from linnet.compiler.torch.codegen import flat_program
    from linnet.compiler.torch.interpret import Interpreter

    program = flat_program(build(source()))
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, 16, 3, 5)).astype(np.float32)
    w0, w1 = rng.standard_normal(16).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    params = {"ups.0.weight": torch.from_numpy(w0), "ups.1.weight": torch.from_numpy(w1)}
    out = Interpreter(program.entries["decode"]).run(params, torch.from_numpy(z)).numpy()
    up = z.repeat(2, axis=2).repeat(2, axis=3) * w0[:, None, None]  # element 0: nearest x2, 16 channels
    np.testing.assert_allclose(out, up[:, :8] * w1[:, None, None], rtol=1e-6)


BRANCHES = """
config Q {
    n: int = 2
}

module Down(channels: int, scale: int) {
    weight: [channels]

    fn forward(x: [B, channels, H, W]) -> [B, channels, (H - 1) // scale + 1, (W - 1) // scale + 1] {
        if scale == 2 { x[:, :, :(H - 1) // 2 + 1, :(W - 1) // 2 + 1] } else { x }
    }
}

model M(c: Q) {
    downs: [Down(4, 2 - i) for i in range(c.n)]

    entry fn forward(x: [B, 4, H, W]) -> [B, 4, (H - 1) // 2 + 1, (W - 1) // 2 + 1] {
        let h = x
        for d in downs {
            h = d(h)
        }
        h
    }
}
"""


def test_an_if_on_a_module_parameter_takes_its_instance_branch():
    graph = build(BRANCHES).entries["forward"]
    assert [str(d) for d in graph.outputs[0].dims] == ["B", "4", "(H - 1) // 2 + 1", "(W - 1) // 2 + 1"]


def test_a_branch_that_breaks_its_function_type_is_an_error():
    """Reported by the check that follows the model's calls with each instance's values (semantics/instances.py),
    at the model's call, before lowering would."""
    wrong = BRANCHES.replace("x[:, :, :(H - 1) // 2 + 1,", "x[:, :, :(H - 1) // 2,")
    with pytest.raises(
        SourceError, match=r"L204\]: `d` with these arguments: `forward` returns .*\(H - 1\) // 2, .* declared"
    ):
        build(wrong)
