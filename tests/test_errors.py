"""Each error class is defined once: `linnet.errors` holds the hierarchy, and a module that needs one
of its classes imports it rather than defining a namesake (the PyTorch and JAX code generators each
had their own `CodegenError`, the IR and the ONNX backend each a `LoweringError`)."""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict

import pytest

from linnet import errors
from tests.conftest import ROOT


def error_classes() -> dict[str, list[str]]:
    """Class name -> where each class of that name is defined, for every class under linnet/ whose name
    ends in `Error`."""
    found = defaultdict(list)
    for path in sorted((ROOT / "linnet").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                found[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_each_error_class_is_defined_once():
    twice = {name: places for name, places in error_classes().items() if len(places) > 1}
    assert not twice, f"define each error once (linnet/errors.py) and import it: {twice}"


@pytest.mark.parametrize(
    "module",
    ["linnet.ir.render", "linnet.compiler.torch.codegen", "linnet.compiler.jax.codegen", "linnet.compiler.onnx.lower"],
)
def test_code_generators_raise_the_hierarchys_codegen_error(module):
    if module.endswith("onnx.lower"):
        pytest.importorskip("onnx_ir")
    assert importlib.import_module(module).CodegenError is errors.CodegenError
