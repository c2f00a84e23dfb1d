"""The primitive op registry (`REGISTRY`, op name → `OpDef`) and the infix operators that
lower to ops (`OPERATORS`). See `registry.py` for the contract and `catalog.py` for the ops."""

from .catalog import OPERATORS
from .registry import REGISTRY, REQUIRED, OpDef, OpError, OpParam

__all__ = ["OPERATORS", "REGISTRY", "REQUIRED", "OpDef", "OpError", "OpParam"]
