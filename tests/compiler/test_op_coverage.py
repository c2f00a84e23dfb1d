"""Every registry op has a lowering in every backend, or an explicit `UNSUPPORTED` reason there:
adding an op to linnet/ops/catalog.py without one fails here, naming the backend. The backends'
op tests (test_torch_ops.py, test_jax_ops.py, test_onnx_ops.py) then run each lowered op against
its numpy reference."""

from __future__ import annotations

import importlib

import pytest

from linnet.ops import REGISTRY, OpDef

# backend → (the module holding its tables, the name of its op → lowering table). PyTorch's
# interpreter and generated code share one table, as do generated JAX and its StableHLO export.
BACKENDS = {
    "torch": ("linnet.compiler.torch.codegen", "EMITTERS"),
    "jax": ("linnet.compiler.jax.codegen", "EMITTERS"),
    "onnx": ("linnet.compiler.onnx.lower", "LOWERINGS"),
}
NEEDS = {"onnx": "onnx_ir"}  # what importing the backend's lowering needs beyond the front end


def tables(backend: str) -> tuple[dict, dict[str, str]]:
    """(the backend's lowering table, its UNSUPPORTED table: op → reason)."""
    if backend in NEEDS:
        pytest.importorskip(NEEDS[backend])
    module_name, table = BACKENDS[backend]
    module = importlib.import_module(module_name)
    return getattr(module, table), module.UNSUPPORTED


def uncovered(ops: dict[str, OpDef], lowerings: dict, unsupported: dict[str, str]) -> list[str]:
    """What is wrong with a backend's coverage of `ops`, one line each."""
    covered = set(lowerings) | set(unsupported)
    problems = [f"`{n}` has neither a lowering nor an UNSUPPORTED reason" for n in ops if n not in covered]
    problems += [f"`{n}` is both lowered and UNSUPPORTED" for n in set(lowerings) & set(unsupported)]
    problems += [f"`{n}` is UNSUPPORTED without a reason" for n, why in unsupported.items() if not why.strip()]
    problems += [f"`{n}` is UNSUPPORTED but no registry op" for n in unsupported if n not in ops]
    return problems


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_op_has_a_lowering_or_a_reason(backend):
    lowerings, unsupported = tables(backend)
    problems = uncovered(REGISTRY, lowerings, unsupported)
    assert not problems, f"{backend}:\n" + "\n".join(problems)


def test_an_op_without_a_lowering_is_caught():
    new = OpDef("frobnicate", [], "A new op nobody lowered yet.", lambda a: None, lambda a: None)
    ops = {**REGISTRY, "frobnicate": new}
    lowerings, unsupported = tables("torch")
    assert uncovered(ops, lowerings, unsupported) == ["`frobnicate` has neither a lowering nor an UNSUPPORTED reason"]
    assert uncovered(ops, lowerings, {**unsupported, "frobnicate": "no kernel yet"}) == []
    blank = {**unsupported, "frobnicate": " "}
    assert uncovered(ops, lowerings, blank) == ["`frobnicate` is UNSUPPORTED without a reason"]
