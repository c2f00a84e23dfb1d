"""Every registry op the JAX backend lowers (test_op_coverage.py: every op, or a reason): under
jax.jit, the output shape equals the registry's shape rule and the values equal the op's numpy
reference and the PyTorch backend's output (bit for bit where the op is `exact`), on the op's
own random cases. Also the generated JAX of the examples (goldens, no jax import when
generating)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linnet.compiler.jax.codegen import (
    PASSES,
    UNSUPPORTED,
    fused_key,
    fused_names,
    generate,
    graph_function,
    module_source,
)
from linnet.ir import build
from linnet.ir.pipeline import prepare
from linnet.ops import REGISTRY
from tests.compiler.op_cases import assert_matches, case, reference, single_op_graph
from tests.conftest import EXAMPLES, check_golden
from tests.ir.test_ir import CASES

GOLDEN = Path(__file__).resolve().parents[1] / "ir" / "golden"
HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.parametrize("name", sorted(CASES))
def test_generated_jax_golden(name):
    file, preset, config = CASES[name]
    program = build(EXAMPLES / file, preset=preset, config=config, max_positions=16)
    text = generate(program).replace(str(EXAMPLES), "examples")
    compile(text, name, "exec")  # valid Python
    check_golden(GOLDEN / f"{name}.jax.py", text)


def test_jax_codegen_imports_no_framework():
    code = (
        "import sys\nfrom linnet.ir import build\nfrom linnet.compiler.jax.codegen import generate\n"
        "generate(build('examples/llama.linnet', preset='smollm2_135m'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'jax', 'jaxlib', 'onnx')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=EXAMPLES.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- running (needs jax)


@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)  # i64 stays i64, as the IR says
    return jax


def run_jax(jax, g, inputs):
    ns: dict = {}
    exec("import jax\nimport jax.numpy as jnp\nimport jax.scipy.special\nfrom jax import lax\nPRECISION = 'highest'\n"
         + graph_function(g), ns)  # fmt: skip
    out = jax.jit(ns["f"])({}, *inputs)
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


def run_torch(g, inputs):
    import torch

    from linnet.compiler.torch.codegen import graph_function as torch_source

    ns: dict = {}
    exec("import torch\nimport torch.nn.functional as F\n" + torch_source(g), ns)
    out = ns["f"]({}, *[torch.from_numpy(np.array(a)) for a in inputs])
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.jax
@pytest.mark.parametrize("name", sorted(set(REGISTRY) - set(UNSUPPORTED)))
@settings(max_examples=5, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), seed=st.integers(0, 2**16))
def test_op_matches_registry_reference_and_torch(jax, name, shape, seed):
    rng = np.random.default_rng(seed)
    tensors, const = case(name, rng, shape)
    expected = reference(name, tensors, const)
    g, types, inputs = single_op_graph(name, tensors, const)
    outs = run_jax(jax, g, inputs)
    refs = list(expected) if isinstance(expected, (tuple, list)) else [np.asarray(expected)]
    theirs = run_torch(g, inputs) if HAVE_TORCH else refs
    assert len(outs) == len(types) == len(refs) == len(theirs)
    for o, t, ref, tor in zip(outs, types, refs, theirs):
        assert o.shape == tuple(d.as_int() for d in t.shape.dims), (name, o.shape, t)
        assert o.shape == np.asarray(ref).shape
        assert o.dtype == np.asarray(ref).dtype, (name, o.dtype, np.asarray(ref).dtype)
        assert_matches(name, o, ref, "jax")
        assert_matches(name, o, tor, "jax")


@pytest.mark.jax
def test_cache_write_drops_positions_past_the_cache(jax):
    """A padded prefill may run past the cache; those writes are dropped, the rest land."""
    rng = np.random.default_rng(0)
    tensors, const = case("cache_write", rng, (2,))
    tensors["positions"] = np.array([5, 0], dtype=np.int64)  # row 2 at 5, 6: 6 is past the 6 positions
    g, _, inputs = single_op_graph("cache_write", tensors, const)
    (out,) = run_jax(jax, g, inputs)
    want = tensors["cache"].copy()
    want[2, :, 5] = tensors["new"][0, :, 0]
    want[0, :, 0:2] = tensors["new"][1]
    np.testing.assert_array_equal(out, want)


@pytest.mark.jax
def test_write_cache_on_a_cache_held_flat_matches_the_reference(jax):
    """The prelude's `write_cache` on a cache held as [rows * H, T, D] (how the backend holds
    KV caches) writes what the registry's reference writes into [rows, H, T, D]: rows out of
    order; a write running past the cache is dropped there, the rest untouched."""
    rng = np.random.default_rng(1)
    tensors, _ = case("cache_write", rng, (2,))
    tensors["positions"] = np.array([5, 0], dtype=np.int64)  # row 2 at 5, 6: 6 is past the 6 positions
    from linnet.compiler.jax.prelude import write_cache

    cache = tensors["cache"]
    n, h, t, d = cache.shape
    out = jax.jit(write_cache)(cache.reshape(n * h, t, d), tensors["rows"], tensors["positions"], tensors["new"])
    want = cache.copy()  # the registry's reference, with the write past the cache cut off
    want[2, :, 5] = tensors["new"][0, :, 0]
    want[0, :, 0:2] = tensors["new"][1]
    np.testing.assert_array_equal(np.asarray(out).reshape(n, h, t, d), want)
    tensors["positions"] = np.array([1, 3], dtype=np.int64)  # all in range: the reference itself
    out = jax.jit(write_cache)(cache.reshape(n * h, t, d), tensors["rows"], tensors["positions"], tensors["new"])
    np.testing.assert_array_equal(np.asarray(out).reshape(n, h, t, d), reference("cache_write", tensors, {}))


@pytest.mark.parametrize(
    "names, key",
    [
        (
            ["l.0.attn.q_proj.weight", "l.0.attn.k_proj.weight", "l.0.attn.v_proj.weight"],
            "l.0.attn.{q,k,v}_proj.weight",
        ),
        (["mlp.gate_proj.weight", "mlp.up_proj.weight"], "mlp.{gate,up}_proj.weight"),
        (["blk.1.w", "blk.11.w"], "blk.1{,1}.w"),  # one name a prefix of the other
        (["a.weight", "b.c.weight"], "{a,b.c}.weight"),
    ],
)
def test_fused_key_names_its_members_in_order(names, key):
    assert fused_key(names) == key
    assert fused_names(key) == names
    assert fused_names(names[0]) is None  # a checkpoint name is not a fused key


TWO_LAYERS = """
config C { d: int = 8 }
model M(c: C) {
    a: Linear(c.d, c.d)
    b: Linear(c.d, c.d)
    entry fn both(x: [B, c.d]) -> [B, c.d] { a(x) + b(x) }
ONLY_A}
"""


@pytest.mark.parametrize("only_a", [False, True])
def test_layers_sharing_an_input_are_fused_unless_another_entry_reads_one_alone(tmp_path, only_a):
    entry = "    entry fn only_a(x: [B, c.d]) -> [B, c.d] { a(x) }\n" if only_a else ""
    (tmp_path / "m.linnet").write_text(TWO_LAYERS.replace("ONLY_A", entry))
    prepared = prepare(build(tmp_path / "m.linnet"), PASSES)
    fused = {t.key: t.sources for t in prepared.param_transforms}
    text = module_source(prepared, "equivalent")
    if only_a:
        assert fused == {} and "FUSED_WEIGHTS = []" in text and "self.a.weight" in text
    else:
        assert fused == {"{a,b}.weight": ["a.weight", "b.weight"]}
        assert "getattr(self, '{a,b}').weight" in text and "self.a.weight" not in text
