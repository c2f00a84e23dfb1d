"""The primitive op registry (`REGISTRY`, op name → `OpDef`) and the infix operators that
lower to ops (`OPERATORS`). See `registry.py` for the contract, `catalog.py` and `spatial.py` for the ops."""

from . import catalog, resample, spatial  # noqa: F401  (each registers its ops, in this order)
from .catalog import OPERATORS
from .registry import REGISTRY, REQUIRED, OpDef, OpError, OpParam

__all__ = ["OPERATORS", "REGISTRY", "REQUIRED", "OpDef", "OpError", "OpParam"]
