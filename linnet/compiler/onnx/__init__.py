"""The ONNX backend (`linnet.compiler.onnx`): Core IR to an ONNX model, built with onnx-ir.

- `lower.lower_entry(program, name, params=...)`: one entry as an `onnx_ir.Model` (named
  inputs and outputs, symbolic batch and sequence dims, parameters as initializers named by
  checkpoint name, the KV cache as `past_key_values.i.key/value` in and `present.i.key/value`
  out); `lower.save(...)` writes it, checked and shape-inferred.
- `kernels`: which op types an ONNX Runtime provider runs in a dtype (measured: the CPU provider
  computes nothing in bf16); `upcast.upcast(model, dtype, provider, numerics)`: the ops without
  kernels are refused under `equivalent` and computed in f32 under `fast`, with a note.

Imports onnx/onnx-ir only (never onnxruntime): running the model, and binding checkpoints to
it, is `linnet.runtimes`' job.
"""
