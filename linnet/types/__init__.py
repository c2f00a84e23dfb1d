"""Types of Linnet values, the leaf of the front end: the dim algebra (`dims`: symbolic
polynomials over named sizes) and value types (`core`: dtypes, shapes, tensor, scalar, config
and module types). Imports nothing else of Linnet, so syntax, ops, semantics and the IR can
all build on it (ARCHITECTURE.md: the front end's layers form a line)."""

from .core import DTYPES, DType, Shape, TensorT, Type, format_shape, format_type
from .dims import Dim, DivisionError, dim_variables, divide, evaluate, format_dim

__all__ = [
    "DTYPES", "DType", "Shape", "TensorT", "Type", "format_shape", "format_type",
    "Dim", "DivisionError", "dim_variables", "divide", "evaluate", "format_dim",
]  # fmt: skip
