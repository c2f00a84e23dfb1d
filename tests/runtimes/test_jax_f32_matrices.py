"""bf16 on JAX/XLA's CPU with the matrices held in f32 (`linnet.compiler.jax.codegen`, `f32_matrices`): XLA's CPU
compiler has no bf16 dot and converted every bf16 weight to f32 on every call. The generated code now takes the
bf16 matrices widened once at load and computes what XLA's bf16 dot computed; these tests check that it is the
same arithmetic (bit for bit, with XLA's excess-precision rewrites off, as `equivalent` compiles), that only the CPU
inference layout uses it. The distance from transformers on the embedded SmolLM2 is test_parity_jax_bf16.py."""

from __future__ import annotations

import pytest

from tests.runtimes.conftest import LLAMA

jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.jax

import linnet.jax as lj  # noqa: E402
from linnet.compiler.jax.codegen import generate  # noqa: E402
from linnet.runtimes.backends.jax_backend import F32_MATRICES_NOTE  # noqa: E402
from tests.runtimes.test_jax_backend import MAX_POSITIONS, SMALL  # noqa: E402


def small_bf16(**kw):
    return lj.load(
        LLAMA,
        config=SMALL,
        dtype="bf16",
        max_positions=MAX_POSITIONS,
        random_weights=True,
        seed=1,
        progress=False,
        **kw,
    )


def test_matrices_are_held_in_f32_and_read_so():
    m = small_bf16()
    assert F32_MATRICES_NOTE in m.notes
    held = {k: str(v.dtype) for k, v in m.params.items()}
    rank = {k: v.ndim - (".*." in k) for k, v in m.params.items()}  # a layer's, of the layers held stacked
    assert {d for k, d in held.items() if rank[k] == 2} == {"float32"}
    assert {d for k, d in held.items() if rank[k] != 2} == {"bfloat16"}  # norm scales stay bf16
    src = m.source
    assert "The bf16 matrices are passed in f32" in src
    assert (
        "jnp.einsum(\"...i,oi->...o\", x.astype(jnp.float32), getattr(self, '{q,k,v}_proj').weight, "
        "precision=PRECISION).astype(jnp.bfloat16)" in src
    )
    assert "jnp.take(self.embed_tokens.weight, input_ids, axis=0, mode='clip').astype(jnp.bfloat16)" in src
    # `linnet jax --dtype bf16` (no device) and the per-name layout (sharding, training) keep bf16 parameters
    assert "The bf16 matrices" not in generate(m.prepared.program)
    per_name = small_bf16(fuse_linear_weights=False)
    assert {str(v.dtype) for v in per_name.params.values()} == {"bfloat16"}
    assert F32_MATRICES_NOTE not in per_name.notes


def test_same_arithmetic_as_xla_bf16_dots():
    """Under `equivalent` a bf16 program compiles with XLA's excess precision off (`JaxProgram.compiler_options`):
    otherwise XLA may keep values in f32 where a program converts f32 -> bf16 -> f32, and where it does depends on
    how the converts were written. So the logits of `forward`, `step` and the step model's ahead-of-time compiled
    step are bit for bit those of bf16 parameters."""
    import jax.numpy as jnp
    import numpy as np

    from linnet.compiler.jax.module import compile_program

    for mode in ("generated", "stablehlo"):
        m = small_bf16(mode=mode, max_batch=2)
        plain = compile_program(m.prepared.program, m.numerics, True, f32_matrices=False)
        assert plain.compiler_options == {"xla_allow_excess_precision": False}
        p16 = {k: v.astype(jnp.bfloat16) for k, v in m.params.items()}  # exact: they hold bf16 values
        ids = np.random.default_rng(0).integers(0, SMALL["vocab_size"], (2, 21)).astype(np.int64)
        held = np.asarray(m.forward(ids), np.float32)
        ref = np.asarray(plain.jitted("forward")(p16, {}, ids), np.float32)
        assert np.array_equal(held, ref), (mode, float(np.abs(held - ref).max()))
        state = {k: jnp.zeros_like(v) for k, v in m.state.items()}
        pos, rows = np.array([0, 0]), np.array([0, 1])
        ref_step, _ = plain.jitted("step")(p16, state, ids, pos, rows)
        ref_step = np.asarray(ref_step, np.float32)
        assert np.array_equal(np.asarray(m.step(ids, pos, rows), np.float32), ref_step), mode
        ahead = np.asarray(m.step_model().step(ids, pos, rows), np.float32)
        assert np.array_equal(ahead, ref_step), (mode, float(np.abs(ahead - ref_step).max()))


def test_f32_and_fast_keep_xla_defaults():
    from linnet.compiler.jax.module import compile_program

    m = small_bf16()
    assert compile_program(m.prepared.program, "fast", True).compiler_options is None
    f32 = lj.load(LLAMA, config=SMALL, max_positions=MAX_POSITIONS, random_weights=True, seed=1, progress=False)
    assert compile_program(f32.prepared.program, "equivalent", True).compiler_options is None
