"""Backends from Core IR (`linnet.compiler`): `torch` (the interpreter, generated PyTorch, torch.compile, CUDA
graphs), `jax` (generated JAX, StableHLO export) and `onnx` (one ONNX graph per entry). A backend turns a prepared
`Program` into something runnable and knows nothing of checkpoints (`linnet.runtimes` binds the weights). Nothing
here is imported by `linnet check`."""
