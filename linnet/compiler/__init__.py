"""Backends from Core IR (`linnet.compiler`): torch, jax, onnx. None has landed yet; see
ARCHITECTURE.md for the contract each will follow. Nothing here is imported by `linnet check`."""
