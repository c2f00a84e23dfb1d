"""Dims as the generated JAX code computes them: `linnet.ir.render`'s text, with a slice bound clamped to its dim's
size (`min(4, S)`) written `jax.core.min_dim(4, S)`, which takes `jax.export`'s symbolic dims as well as ints
(Python's `min` compares them, and a comparison of `S` with 4 is inconclusive for every `S`)."""

from __future__ import annotations

from linnet.ir import render

MIN_CALL = "jax.core.min_dim"


def dim_text(d) -> str:
    """`render.dim_text` for generated JAX."""
    return render.dim_text(d, MIN_CALL)


def dims_text(dims, as_list: bool = False) -> str:
    """`render.dims_text` for generated JAX."""
    return render.dims_text(dims, as_list, MIN_CALL)
