"""`linnet.torch`: load a Linnet source for PyTorch (imports torch lazily, on first use).

`load(source, weights=None, preset=None, config=None, dtype="f32", numerics="equivalent",
device="cpu", max_batch=1, max_positions=768, mode="generated")` returns a `TorchModel` (a
`LoadedModel`): `run(entry, *arrays)` and the entries as attributes (`forward`, `step`) take
and return numpy arrays; `native.forward(...)` takes and returns torch tensors; the
`module.state_dict()` keys are the checkpoint names. See `linnet.runtimes.backends.torch_backend.load`
(and `linnet.load(..., backend=...)` for any backend of the registry).
"""

from __future__ import annotations


def load(source, weights=None, mode="generated", **kwargs):
    from linnet.runtimes.backends import backend_for

    return backend_for("torch_backend", mode).load(source, weights, **kwargs)


def generate_source(source, preset=None, config=None, dtype="f32", numerics="equivalent", **kwargs) -> str:
    """The generated PyTorch module for `source` as text (what `linnet torch` writes)."""
    from linnet.compiler.torch.codegen import generate
    from linnet.ir import build

    return generate(build(source, preset=preset, config=config, dtype=dtype, **kwargs), numerics, standalone=True)
