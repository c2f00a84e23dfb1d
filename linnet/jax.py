"""`linnet.jax`: load a Linnet source for JAX/XLA (imports jax lazily, on first use).

`load(source, weights=None, preset=None, config=None, dtype="f32", numerics="equivalent",
device="cpu", max_batch=1, max_positions=768, mode="generated"|"stablehlo")` returns a
`JaxModel` (a `LoadedModel`): `run(entry, *arrays)` and the entries as attributes (`forward`,
`step`) take and return numpy arrays, `native.forward(...)` returns JAX arrays; `params` (by checkpoint
name, except weights fused for one dot, under a key naming their members such as
`model.layers.0.self_attn.{q,k,v}_proj.weight`) and the threaded, donated KV cache in `state`
(held as [max_batch * H_kv, T, D]). `load_exported(path, params=...|weights=...)`
runs a serialized StableHLO artifact without its source. See `linnet.runtimes.backends.jax_backend`.
"""

from __future__ import annotations


def load(source, weights=None, mode="generated", **kwargs):
    from linnet.runtimes.backends import backend_for

    return backend_for("jax_backend", mode).load(source, weights, **kwargs)


def load_exported(path, params=None, weights=None, device="cpu"):
    from linnet.runtimes.backends.jax_backend import load_exported as _load_exported

    return _load_exported(path, params=params, weights=weights, device=device)


def generate_source(source, preset=None, config=None, dtype="f32", numerics="equivalent", **kwargs) -> str:
    """The generated JAX module for `source` as text (what `linnet jax` writes)."""
    from linnet.compiler.jax.codegen import generate
    from linnet.ir import build

    return generate(build(source, preset=preset, config=config, dtype=dtype, **kwargs), numerics, standalone=True)
