"""Every registry op through the PyTorch backend: the output shape equals the registry's shape
rule and the values equal the op's numpy reference (bit for bit where the op is `exact`), on
the op's own random cases, both in the interpreter and in generated code. That every op has a
lowering is tests/compiler/test_op_coverage.py's job."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.ops import REGISTRY
from tests.compiler.op_cases import assert_matches, case, reference, single_op_graph

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from linnet.compiler.torch.codegen import UNSUPPORTED, graph_function  # noqa: E402
from linnet.compiler.torch.interpret import Interpreter  # noqa: E402


def run_op(name: str, tensors: dict, const: dict, generated: bool):
    g, types, inputs = single_op_graph(name, tensors, const)
    flat = [torch.from_numpy(np.array(a)) for a in inputs]
    if generated:
        ns: dict = {}
        exec("import torch\nimport torch.nn.functional as F\n" + graph_function(g), ns)
        out = ns["f"]({}, *flat)
    else:
        out = Interpreter(g).run({}, *flat)
    return out, types


@pytest.mark.parametrize("generated", [False, True], ids=["interpret", "generated"])
@pytest.mark.parametrize("name", sorted(set(REGISTRY) - set(UNSUPPORTED)))
@settings(max_examples=8, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_op_matches_registry_and_reference(name, generated, shape, seed):
    rng = np.random.default_rng(seed)
    tensors, const = case(name, rng, shape)
    expected = reference(name, tensors, const)
    out, types = run_op(name, tensors, const, generated)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    refs = list(expected) if isinstance(expected, (tuple, list)) else [np.asarray(expected)]
    assert len(outs) == len(types) == len(refs)
    for o, t, ref in zip(outs, types, refs):
        assert tuple(o.shape) == tuple(d.as_int() for d in t.shape.dims), (name, tuple(o.shape), t)
        assert tuple(o.shape) == np.asarray(ref).shape
        got = o.numpy()
        assert got.dtype == np.asarray(ref).dtype, (name, got.dtype, np.asarray(ref).dtype)
        assert_matches(name, got, ref, "torch")
