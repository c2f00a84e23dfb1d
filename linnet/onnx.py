"""`linnet.onnx`: load a Linnet source for ONNX Runtime, or write it as an .onnx file
(imports onnx/onnxruntime lazily, on first use).

`load(source, weights=None, preset=None, config=None, dtype="f32", numerics="equivalent",
device="cpu", max_batch=1, max_positions=768, providers=None)` returns an `OnnxModel` (a
`LoadedModel`): `run(entry, *arrays)` and the entries as attributes (`forward`, `step`) take and
return numpy arrays, the KV cache kept on the device between steps (I/O binding).
`export(source, entry, output, weights=...)` writes one entry as an .onnx file. See
`linnet.runtimes.backends.onnx_backend`.
"""

from __future__ import annotations


def load(source, weights=None, **kwargs):
    from linnet.runtimes.backends import backend_for

    return backend_for("onnx_backend", None).load(source, weights, **kwargs)


def export(source, entry, output, weights=None, **kwargs):
    from linnet.runtimes.backends.onnx_backend import export as _export

    return _export(source, entry, output, weights, **kwargs)


def lower_source(source, entry=None, preset=None, config=None, dtype="f32", numerics="equivalent", **kwargs):
    """The ONNX model (an `onnx_ir.Model`, parameters as graph inputs) of one entry of `source`."""
    from linnet.compiler.onnx.lower import lower_entry
    from linnet.ir import build

    program = build(source, preset=preset, config=config, dtype=dtype, **kwargs)
    return lower_entry(program, entry or next(iter(program.entries)), "inputs", numerics)
