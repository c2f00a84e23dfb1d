"""Functions called with dims that are products, sums or multiples of the caller's (`[E, B * S, n]`
through a `...` parameter, `[B * S, n]` into `[M, N]`), through one and two levels of calls: what
checks lowers and runs equal to numpy. A function whose body needs a factor (`B`) that no
argument's shape carries as a whole dim is lowered in its caller (it once failed with "the dim `B`
is used here but no tensor argument has it as a dim")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from linnet.ir import build, format_program
from linnet.semantics.program import Document
from tests.conftest import check_golden

GOLDEN = Path(__file__).parent / "golden"

# The reported case, smallest form: a `...` function called with a product dim.
PRODUCT_THROUGH_ELLIPSIS = """config C {
    n: int = 4
}

fn double(x: [..., N]) -> [..., N] {
    x + x
}

model M(c: C) {
    w: [3, c.n, c.n]

    entry fn forward(x: [B, S, c.n]) -> [3, B * S, c.n] {
        double(unsqueeze(reshape(x, [B * S, c.n]), 0) @ w)
    }
}
"""


def test_product_dim_through_ellipsis_lowers():
    text = format_program(build(PRODUCT_THROUGH_ELLIPSIS))
    check_golden(GOLDEN / "product_dim_through_ellipsis.ir", text)


# Helpers the cases call: `...` functions, named dims bound to products, multiples bound by exact
# division, an int parameter in a dim, a std function, and calls two levels deep.
FUNCTIONS = """config C {
    n: int = 4
}

fn double(x: [..., N]) -> [..., N] {
    x + x
}

fn twice_double(x: [..., N]) -> [..., N] {
    double(x) * 2.0
}

fn flatten_rows(x: [M, N]) -> [M * N] {
    reshape(x, [M * N])
}

fn nested_flat(x: [M, N]) -> [M * N] {
    flatten_rows(double(x))
}

fn pairs(x: [..., 2 * N]) -> [..., N, 2] {
    rearrange(x, "... (i two) -> ... i two", two=2)
}

fn halves(x: [2 * R, N]) -> [R, 2 * N] {
    reshape(x, [R, 2 * N])
}

fn grouped(x: [g * R, N], g: int) -> [g, R, N] {
    reshape(double(x), [g, R, N])
}

fn normed(x: [..., N]) -> [..., N] {
    softmax(double(x))
}

fn flat_doubled(x: [B, S, N]) -> [B * S, N] {
    double(reshape(x, [B * S, N]))
}
"""


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


B, S, T, N = 2, 3, 5, 4
X = np.random.default_rng(0).standard_normal((B, S, N)).astype(np.float32)
Y = np.random.default_rng(1).standard_normal((B, T, N)).astype(np.float32)
# name: (entry parameters, return type, body, inputs, numpy reference)
CASES = {
    "product_through_ellipsis": (
        "x: [B, S, c.n]",
        "[B * S, c.n]",
        "double(reshape(x, [B * S, c.n]))",
        (X,),
        lambda x: 2 * x.reshape(-1, N),
    ),
    "product_two_levels": (
        "x: [B, S, c.n]",
        "[B * S, c.n]",
        "twice_double(reshape(x, [B * S, c.n]))",
        (X,),
        lambda x: 4 * x.reshape(-1, N),
    ),
    "product_as_named_dim": (
        "x: [B, S, c.n]",
        "[B * S * c.n]",
        "flatten_rows(reshape(x, [B * S, c.n]))",
        (X,),
        lambda x: x.reshape(-1),
    ),
    "product_as_named_dim_two_levels": (
        "x: [B, S, c.n]",
        "[B * S * c.n]",
        "nested_flat(reshape(x, [B * S, c.n]))",
        (X,),
        lambda x: 2 * x.reshape(-1),
    ),
    "product_split_in_ellipsis_function": (
        "x: [B, S, c.n]",
        "[B * S, c.n / 2, 2]",
        "pairs(reshape(x, [B * S, c.n]))",
        (X,),
        lambda x: x.reshape(-1, N // 2, 2),
    ),
    "sum_through_ellipsis": (
        "x: [B, S, c.n], y: [B, T, c.n]",
        "[B, S + T, c.n]",
        "double(concat([x, y], dim=1))",
        (X, Y),
        lambda x, y: 2 * np.concatenate([x, y], 1),
    ),
    "product_of_sum_through_ellipsis": (
        "x: [B, S, c.n], y: [B, T, c.n]",
        "[B * (S + T), c.n]",
        "double(reshape(concat([x, y], dim=1), [B * (S + T), c.n]))",
        (X, Y),
        lambda x, y: 2 * np.concatenate([x, y], 1).reshape(-1, N),
    ),
    "multiple_bound_by_division": (
        "x: [B, S, c.n]",
        "[B * S, c.n]",
        "halves(reshape(x, [2 * B * S, c.n / 2]))",
        (X,),
        lambda x: x.reshape(-1, N),
    ),
    "int_parameter_times_product": (
        "x: [B, S, c.n]",
        "[2, B * S, c.n]",
        "grouped(reshape(concat([x, x], dim=0), [2 * B * S, c.n]), 2)",
        (X,),
        lambda x: 2 * np.concatenate([x, x], 0).reshape(2, -1, N),
    ),
    "product_made_inside_a_function": (
        "x: [B, S, c.n]",
        "[B * S, c.n]",
        "flat_doubled(x)",
        (X,),
        lambda x: 2 * x.reshape(-1, N),
    ),
    "std_function_under_product": (
        "x: [B, S, c.n]",
        "[B * S, c.n]",
        "normed(reshape(x, [B * S, c.n]))",
        (X,),
        lambda x: _softmax(2 * x.reshape(-1, N)),
    ),
}


def _source(name: str) -> str:
    params, ret, body, _, _ = CASES[name]
    return (
        FUNCTIONS
        + f"""
model M(c: C) {{
    entry fn forward({params}) -> {ret} {{
        {body}
    }}
}}
"""
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_checks_and_lowers(name):
    source = _source(name)
    errors = [d for d in Document("t.linnet", source).analyze().diagnostics if d.severity == "error"]
    assert errors == []
    build(source)  # raises LoweringError if what checks does not lower


def test_only_the_call_with_a_product_dim_is_lowered_in_its_caller():
    """`flat_doubled(x: [B, S, N])` reads B and S from its argument and stays a function; the
    `double` it calls with [B * S, N] is lowered in it."""
    program = build(_source("product_made_inside_a_function"))
    assert sorted(program.functions) == ["flat_doubled"]
    assert program.functions["flat_doubled"].dim_vars == ["B", "S"]


BACKENDS = [
    b
    for b, module in (("torch", "torch"), ("jax", "jax"), ("onnxruntime", "onnxruntime"))
    if importlib.util.find_spec(module)
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_equal_to_numpy(name, backend, tmp_path):
    import linnet

    path = tmp_path / f"{name}.linnet"
    path.write_text(_source(name))
    model = linnet.load(path, backend=backend, random_weights=True, progress=False)
    _, _, _, inputs, reference = CASES[name]
    (out,) = model.run("forward", *inputs)
    np.testing.assert_allclose(out, reference(*inputs), rtol=1e-6, atol=1e-6)


# A module's method with `...`, called in a loop over layers with a product dim: the method reads
# its own weights (relative to its receiver) where it is lowered in its caller.
LAYERS = """config C {
    n: int = 4
    num_layers: int = 2
}

module Layer(c: C) {
    weight: [c.n, c.n]

    fn forward(x: [..., c.n]) -> [..., c.n] {
        x @ transpose(weight) + x
    }
}

model M(c: C) {
    layers: [Layer(c); c.num_layers]

    entry fn forward(x: [B, S, c.n]) -> [B * S, c.n] {
        let h = reshape(x, [B * S, c.n])
        for layer in layers {
            h = layer(h)
        }
        h
    }
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_method_in_a_loop_runs_equal_to_numpy(backend, tmp_path):
    import json

    from safetensors.numpy import save_file

    import linnet

    rng = np.random.default_rng(2)
    weights = [rng.standard_normal((N, N)).astype(np.float32) for _ in range(2)]
    save_file({f"layers.{i}.weight": w for i, w in enumerate(weights)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"n": N, "num_layers": 2}))
    path = tmp_path / "layers.linnet"
    path.write_text(LAYERS)
    model = linnet.load(path, tmp_path, backend=backend, progress=False)
    (out,) = model.run("forward", X)
    h = X.reshape(-1, N)
    for w in weights:
        h = h @ w.T + h
    np.testing.assert_allclose(out, h, rtol=1e-5, atol=1e-5)
