"""One scalar semantics (types/scalars.py): each operator gives the same value in a config
field, folded in a function body, folded by lowering, and as a tensor op run on every backend
(PyTorch interpreted and generated, JAX, ONNX Runtime). The expected values are Python's,
which are PyTorch's and JAX's (`torch.remainder`, `torch.floor_divide`)."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.ir import build
from linnet.ops import OPERATORS
from linnet.semantics.program import Document
from linnet.types.dims import Dim
from tests.compiler.op_cases import single_op_graph

# (a, operator, b, Python's value); `/` of ints is exact division (an error when inexact)
CASES = [
    ("-7.5", "%", "2.0", 0.5),
    ("7.5", "%", "-2.0", -0.5),
    ("-7", "%", "2", 1),
    ("7", "%", "-2", -1),
    ("-7", "//", "2", -4),
    ("7.5", "//", "-2.0", -4.0),
    ("-7.5", "//", "2.0", -4.0),
    ("7", "//", "-2", -4),
    ("-7.5", "/", "2.0", -3.75),
    ("-8", "/", "2", -4),
    ("-7", "+", "2.5", -4.5),
    ("-7", "-", "2", -9),
    ("-7", "*", "2", -14),
    ("-2.0", "**", "3.0", -8.0),
    ("2", "**", "-1", 0.5),
    ("2", "**", "10", 1024),
]
IDS = [f"{a} {op} {b}" for a, op, b, _ in CASES]


def kind(value) -> str:
    return "float" if isinstance(value, float) else "int"


def written(a: str) -> str:
    """A negative literal as an operand: `-7.5 % 2.0` is `(-7.5) % 2.0` in Linnet and Python."""
    return f"({a})" if a.startswith("-") else a


@pytest.mark.parametrize("a, op, b, expected", CASES, ids=IDS)
def test_python_agrees(a, op, b, expected):
    assert eval(f"{a} {op} {b}") == expected


@pytest.mark.parametrize("a, op, b, expected", CASES, ids=IDS)
def test_config_field(a, op, b, expected):
    text = f"config C {{\n    v: {kind(expected)} = {a} {op} {b}\n}}\n"
    analysis = Document("c.linnet", text).analyze()
    assert analysis.diagnostics == []
    value = analysis.scenarios[0].configs["C"].values["v"]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("a, op, b, expected", CASES, ids=IDS)
def test_function_body(a, op, b, expected):
    text = f"fn f(x: [N]) -> [N] {{\n    let v = {a} {op} {b}\n    let _w = v\n    x\n}}\n"
    analysis = Document("f.linnet", text).analyze()
    assert analysis.diagnostics == []
    t = analysis.type_at(text.index("let v") + 4).type
    value = t.value.as_int() if isinstance(t.value, Dim) else t.value
    assert t.kind == kind(expected) and value == expected and type(value) is type(expected)


def lowered_constant(a: str, op: str, b: str, dtype: str):
    source = (
        "config C {\n    n: int = 1\n}\n\n"
        "model M(c: C) {\n"
        f"    entry fn forward(x: {dtype}[N]) -> {dtype}[N] {{\n"
        f"        x + ({a} {op} {b})\n"
        "    }\n}\n"
    )
    graph = build(source).entries["forward"]
    (add,) = [o for o in graph.ops if o.name == "add"]
    value = add.args["y"]
    return value.as_int() if isinstance(value, Dim) else value


@pytest.mark.parametrize("a, op, b, expected", CASES, ids=IDS)
def test_lowering(a, op, b, expected):
    value = lowered_constant(a, op, b, "f32" if isinstance(expected, float) else "i64")
    assert value == expected and type(value) is type(expected)


def test_inexact_int_division_is_refused_in_a_config_and_in_a_body():
    config = Document("c.linnet", "config C {\n    v: int = -7 / 2\n}\n").analyze()
    assert [(d.code, d.message) for d in config.diagnostics] == [("L404", "-7 is not divisible by 2")]
    body = Document("f.linnet", "fn f(x: [N]) -> [N] {\n    let _v = -7 / 2\n    x\n}\n").analyze()
    assert [(d.code, d.message) for d in body.diagnostics] == [
        ("L206", "-7 / 2 is not exact: -7 is not divisible by 2")
    ]


@pytest.mark.parametrize("op", ["/", "//", "%"])
def test_zero_divisors_have_no_value(op):
    config = Document("c.linnet", f"config C {{\n    v: int = 7 {op} 0\n}}\n").analyze()
    body = Document("f.linnet", f"fn f(x: [N]) -> [N] {{\n    let _v = 7.0 {op} 0.0\n    x\n}}\n").analyze()
    assert [(d.code, d.message) for d in config.diagnostics] == [("L404", f"`{op}` by zero has no value")]
    assert [(d.code, d.message) for d in body.diagnostics] == [("L408", f"`{op}` by zero has no value")]


# ----------------------------------------------------------------------------- tensor ops, run


def tensors(a: str, b: str, expected):
    dtype = np.float32 if isinstance(expected, float) else np.int64
    return {"x": np.array([eval(a)] * 3, dtype=dtype), "y": np.array([eval(b)] * 3, dtype=dtype)}


# the tensors take the result's dtype; `/` and `**` on integer tensors do not exist (L303)
RUN_CASES = [c for c in CASES if isinstance(c[3], float) or c[1] not in ("/", "**")]


def run_torch(graph, inputs, generated: bool):
    torch = pytest.importorskip("torch")
    from linnet.compiler.torch.codegen import graph_function as function_source
    from linnet.compiler.torch.interpret import Interpreter

    flat = [torch.from_numpy(np.array(x)) for x in inputs]
    if generated:
        ns: dict = {}
        exec("import torch\nimport torch.nn.functional as F\n" + function_source(graph), ns)
        return ns["f"]({}, *flat).numpy()
    return Interpreter(graph).run({}, *flat).numpy()


def run_jax(graph, inputs):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    from linnet.compiler.jax.codegen import graph_function as function_source

    ns: dict = {}
    prelude = "import jax\nimport jax.numpy as jnp\nfrom jax import lax\nPRECISION = 'highest'\n"
    exec(prelude + function_source(graph), ns)
    return np.asarray(jax.jit(ns["f"])({}, *inputs))


def run_onnx(graph, inputs):
    ort = pytest.importorskip("onnxruntime")
    from linnet.compiler.onnx.lower import lower_entry, to_proto
    from linnet.ir.core import Program
    from linnet.types.core import F32

    program = Program("<test>", "f", None, F32, 1, 1, entries={"f": graph})
    session = ort.InferenceSession(to_proto(lower_entry(program, "f")).SerializeToString())
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs)))[0]


BACKENDS = {
    "torch-interpret": lambda g, i: run_torch(g, i, generated=False),
    "torch": lambda g, i: run_torch(g, i, generated=True),
    "jax": run_jax,
    "onnxruntime": run_onnx,
}
MARKS = {"torch-interpret": pytest.mark.torch, "torch": pytest.mark.torch, "jax": pytest.mark.jax}


@pytest.mark.parametrize("backend", [pytest.param(b, marks=MARKS.get(b, pytest.mark.onnxruntime)) for b in BACKENDS])
@pytest.mark.parametrize("a, op, b, expected", RUN_CASES, ids=[f"{a} {op} {b}" for a, op, b, _ in RUN_CASES])
def test_tensor_op_on_every_backend(backend, a, op, b, expected):
    graph, _, inputs = single_op_graph(OPERATORS[op], tensors(a, b, expected), {})
    out = BACKENDS[backend](graph, inputs)
    assert out.tolist() == [expected] * 3
    assert out.dtype == (np.float32 if isinstance(expected, float) else np.int64)
