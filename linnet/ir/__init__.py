"""Core IR (`linnet.ir`): typed SSA over the primitive registry, lowered from the checked AST
under a concrete config; a text form, a verifier and simple passes. Imports neither torch,
jax nor onnx.

`build(source, preset=..., config=..., dtype=...)` checks, configures and lowers a source;
`format_program(program)` is its text form (`linnet ir`)."""

from .build import ProgramError, build
from .core import Graph, Op, Program, TensorSpec, Value, format_program

__all__ = ["build", "ProgramError", "Program", "Graph", "Op", "Value", "TensorSpec", "format_program"]
