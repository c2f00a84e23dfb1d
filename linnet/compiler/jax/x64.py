"""64-bit types for Linnet's own JAX work, scoped to the call and the thread: never `jax_enable_x64` for the process.

The Core IR's integers are i64 (token ids, positions, cache rows, gathers' indices), and the generated code, the
StableHLO artifacts' signatures and the PyTorch and ONNX backends agree on it. JAX holds 64-bit types only while
`jax_enable_x64` is on, and turning it on with `jax.config.update` changes every JAX caller in the process
(`jnp.arange(3)` becomes i64, Python floats f64; KerasHub's generate broke beside Linnet on the TPU). So each
Linnet function that traces, compiles, puts integer inputs on a device or calls a jitted function runs under
`jax.enable_x64(True)`, JAX's thread-local context manager (`x64_scoped` below; its enter and exit cost well under
a microsecond, measured in bench/x64_scope.py), and the caller's config is what it was before.

What JAX does across the scope's edge (JAX 0.10.2; tests/runtimes/test_jax_x64_scope.py runs on it): arrays made inside
keep their dtype outside (an i64 token array read back with numpy is i64); an executable compiled inside
(`jit(f).lower(...).compile()`) runs outside too, on arrays made inside; but a `jax.jit` function *called* outside
retraces with 32-bit types (the flag is part of its cache key), so Linnet's jitted functions are called only from
scoped functions, or held as a `ScopedJit`. Imports jax only when a scoped function is called.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def scope():
    """The context under which Linnet's JAX work runs: `jax.enable_x64(True)` for this thread until it exits."""
    import jax

    return jax.enable_x64(True)


def enabled() -> bool:
    """Whether 64-bit types are on here already (an outer scope, or the caller's own config): reading the flag costs
    a quarter of entering the context, and a decode step nests a few scoped calls."""
    import jax

    return bool(jax.config.jax_enable_x64)


def x64_scoped(fn: F) -> F:
    """`fn` run under `scope()` at each call, unless 64-bit types are on already (not for a generator's body, which
    runs after the call returns: scope its steps instead)."""

    @functools.wraps(fn)
    def scoped(*args, **kwargs):
        if enabled():
            return fn(*args, **kwargs)
        with scope():
            return fn(*args, **kwargs)

    return scoped  # type: ignore[return-value]


class ScopedJit:
    """A `jax.jit` function whose calls and `lower` run under `scope()` (so a caller holding it, such as a model's
    `functions`, never traces it with 32-bit types); its other attributes (`__wrapped__`, `eval_shape`, ...) are
    the jitted function's."""

    def __init__(self, jitted: Callable):
        self.jitted = jitted

    def __call__(self, *args, **kwargs):
        if enabled():
            return self.jitted(*args, **kwargs)
        with scope():
            return self.jitted(*args, **kwargs)

    def lower(self, *args, **kwargs):
        """`jitted.lower(...)` under `scope()`; the executable its `compile()` gives runs anywhere on i64 arrays."""
        with scope():
            return self.jitted.lower(*args, **kwargs)

    def __getattr__(self, name: str):
        if name == "jitted":  # not set yet (a copy made without __init__): no recursion
            raise AttributeError(name)
        return getattr(self.jitted, name)
