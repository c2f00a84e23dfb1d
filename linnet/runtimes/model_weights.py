"""A loaded model's parameters as numpy arrays by checkpoint name, whatever backend holds them.

What exports read (`linnet.runtimes.export`), so that a model changed in memory (fine-tuned) leaves with its
current values, not the file it was loaded from. Each backend keeps its parameters its own way: PyTorch in the
module tree (`state_dict()` keys are the parameter paths), ONNX Runtime as numpy arrays by path, JAX as device
arrays by path except the weights fused for one dot, held concatenated under `prefix{a,b,c}suffix`
(`linnet.ir.fusion`), and the layers of a list it scans, held stacked under `list.*.member`
(`linnet.compiler.jax.scan`). Each backend's model says how (`LoadedModel.held_weights`); this module checks and orders
what it gives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from linnet.errors import ExportError

__all__ = ["model_weights", "params_weights"]


def model_weights(model: Any) -> dict[str, np.ndarray]:
    """`{parameter path: array}` of `model` (a `LoadedModel`), in the program's parameter order, each in the dtype
    the model holds it (its working dtype; bf16 as `ml_dtypes.bfloat16`), copied to the host. The paths are the
    source's member paths, which the zoo names as the Hugging Face class does (`model.layers.0.self_attn.q_proj
    .weight`). Non-parameter state (the KV cache) is not included.

    Raises ExportError for a model without a program (a JAX artifact loaded without its source) or a backend
    whose parameters this cannot read."""
    program = model.program
    if program is None:
        raise ExportError(f"the {model.backend} model has no program (an artifact loaded without its source)")
    held = model.held_weights()
    missing = [s.path for s in program.params if s.path not in held]
    if missing:
        raise ExportError(f"the {model.backend} model holds no value for {', '.join(missing[:4])}")
    return {s.path: held[s.path] for s in program.params}


def params_weights(model: Any) -> dict[str, np.ndarray]:
    """`{parameter path: array}` of a model that holds its parameters as a dict of arrays by path (`model.params`:
    JAX's device arrays, ONNX Runtime's numpy arrays), fused weights split back into their members, copied to the
    host. Raises ExportError when the model holds no such dict."""
    params = getattr(model, "params", None)
    if not isinstance(params, dict):
        raise ExportError(f"cannot read the parameters of a {type(model).__name__} ({model.backend})")
    from linnet.compiler.jax.scan import unstacked

    # a list of layers the JAX backend scans is held stacked, `list.*.member` (`linnet.compiler.jax.scan`); a stacked
    # quantized pair is dequantized whole first (`_on_host`), then split like any stacked array
    held = unstacked({path: _on_host(a) for path, a in params.items()})
    _split_fused(held, {s.path: s.shape for s in model.program.params})
    return held


def _on_host(a: Any) -> np.ndarray:
    """A held parameter as a host array: a matrix JAX holds quantized (`--dtype stored`: the pair codes i8[..., N, K],
    scales f16[..., N, K / G], or for the TPU's kernel scales_t f32[..., K / G, N], `q8_kernel.KMajorQ8`; the leading
    dims a stacked list's items; `jax_quantized`) dequantized in f32, exactly."""
    if not isinstance(a, tuple):
        return np.asarray(a)
    codes, scales = (np.asarray(x) for x in a)
    if hasattr(a, "scales_t"):
        scales = np.swapaxes(scales, -1, -2)
    *lead, n, k = codes.shape
    w = codes.reshape(*lead, n, scales.shape[-1], -1).astype(np.float32) * scales.astype(np.float32)[..., None]
    return w.reshape(*lead, n, k)


def _split_fused(held: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]]) -> None:
    """Replace, in place, each fused weight `prefix{a,b,c}suffix` by its members, cut along axis 0 at the members'
    declared sizes (`linnet.ir.ParamTransform` concatenates along axis 0)."""
    from linnet.ir.fusion import split_fused_key

    for key in [k for k in held if k not in shapes]:
        parts = split_fused_key(key)
        if parts is None:
            continue
        prefix, middles, suffix = parts
        names = [f"{prefix}{m}{suffix}" for m in middles]
        if not all(n in shapes for n in names):
            continue
        fused = held.pop(key)
        cuts = np.cumsum([shapes[n][0] for n in names])[:-1]
        for name, part in zip(names, np.split(fused, cuts, axis=0)):
            held[name] = part
