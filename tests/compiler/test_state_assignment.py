"""State assigned whole, state read across a write, and entry results against their declared
types: the three ways a structured program could be silently wrong (tests/fixtures/state)."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.ir import ProgramError, build
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "state"


def ema_reference(embed: np.ndarray, ids: list[int]) -> list[np.ndarray]:
    """examples' `Ema` by hand: avg = avg / 2 + sum(x) / 2 per step, logits of x + avg."""
    avg = np.zeros((1, embed.shape[1]), np.float32)
    out = []
    for i in ids:
        x = embed[[i]][None]  # [1, 1, d]
        avg = avg * np.float32(0.5) + np.float32(0.5) * x.sum(axis=1)[0:1]
        h = x + avg[[0]][:, None]
        out.append(h[:, -1] @ embed.T)
    return out


@pytest.mark.parametrize("backend", ["torch-interpret", "torch", "jax", "xla"])
def test_state_assigned_whole_is_carried_from_step_to_step(backend):
    import linnet

    pytest.importorskip("torch" if backend.startswith("torch") else "jax")
    from linnet.runtimes.loading import random_params

    model = linnet.load(FIXTURES / "ema.linnet", backend=backend, random_weights=True, progress=False)
    embed = random_params(model.program, 0)["embed.weight"]  # the weights `random_weights` draws
    ids = [3, 3, 7]
    got = [model.run("step", np.array([[i]]), np.array([p]), np.array([0]))[0] for p, i in enumerate(ids)]
    for ours, ref in zip(got, ema_reference(embed, ids)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got[0], got[1])  # the same token, another average


def test_onnx_refuses_state_assigned_whole_where_it_is_assigned():
    pytest.importorskip("onnxruntime")
    import linnet
    from linnet.errors import LinnetError

    with pytest.raises(LinnetError, match=r"ema.linnet:\d+: state `ema.avg` is assigned"):
        model = linnet.load(FIXTURES / "ema.linnet", backend="onnxruntime", random_weights=True, progress=False)
        model.run("step", np.array([[1]]), np.array([0]), np.array([0]))


def test_state_read_before_a_loop_that_writes_it_is_a_located_error():
    message = r"stale_read.linnet:\d+: state `cells.0.mem` is used here after it was written"
    with pytest.raises(ProgramError, match=message):
        build(FIXTURES / "stale_read.linnet")


def test_an_entry_returning_another_shape_than_declared_is_a_located_error():
    """The loop's carried value changes shape with the element's count: lowering found it (`forward` returns
    f32[B, 1], declares f32[B, 4] under n = 1); the check now runs the loop element by element as lowering runs
    it (linnet/semantics/counted.py), so the build stops at the check's located error under the defaults (n = 3:
    the second element slices 2 columns of 1, quoted as written)."""
    message = r"loop_shape.linnet:\d+:28: error\[L212\]: slice :k is out of range for a dim of size 1 \(k = 2\)"
    with pytest.raises(ProgramError, match=message):
        build(FIXTURES / "loop_shape.linnet", config={"n": 1})


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_loop_body_reading_its_carried_value_from_before_the_loop(backend):
    """`let first = h; for ... { h = layer(h) + first }`: the generated loop rebinds `h`, so
    `first` must stay its own variable (the interpreter runs the unrolled program)."""
    import linnet

    pytest.importorskip("torch" if backend == "torch" else "jax")
    pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    load = lambda b: linnet.load(
        FIXTURES / "loop_reads_its_start.linnet", backend=b, random_weights=True, progress=False
    )  # noqa: E731
    reference = load("torch-interpret").run("forward", x)[0]
    np.testing.assert_allclose(load(backend).run("forward", x)[0], reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "jax", "xla", "onnxruntime"])
def test_nested_loops_over_modules_with_caches_agree_with_the_interpreter(backend):
    """Two rows of a cache, prefill then decode then the other row, through loops inside loops."""
    import linnet

    pytest.importorskip("torch")
    pytest.importorskip({"torch": "torch", "onnxruntime": "onnxruntime"}.get(backend, "jax"))
    steps = [([[1, 2, 3]], [0], [1]), ([[4]], [3], [1]), ([[5]], [0], [0])]

    def run(b):
        model = linnet.load(
            FIXTURES / "nested_loops.linnet",
            backend=b,
            random_weights=True,
            progress=False,
            max_positions=8,
            max_batch=2,
        )
        return [model.run("step", *(np.array(a) for a in args))[0] for args in steps]

    for ours, ref in zip(run(backend), run("torch-interpret")):
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6 * float(np.abs(ref).max()))
