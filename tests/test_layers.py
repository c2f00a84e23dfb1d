"""The layering of ARCHITECTURE.md, checked on the sources' imports: the front end imports no
framework, backends import neither each other nor `runtimes`, code generators import no
framework at module level."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

FRAMEWORKS = {"torch", "jax", "jaxlib", "onnx", "onnx_ir", "onnxruntime", "pygls", "lsprotocol"}
FRONT_END = ["linnet/syntax", "linnet/types", "linnet/semantics", "linnet/ir", "linnet/ops"]
BACKENDS = {"torch": "compiler/torch", "jax": "compiler/jax", "onnx": "compiler/onnx"}


def imports(path, top_level_only: bool = False) -> set[str]:
    """Absolute module names a file imports (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(ROOT).with_suffix("")
    package = ["linnet", *rel.parts[:-1]] if rel.parts[0] != "linnet" else list(rel.parts[:-1])
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                out.add(".".join(base + ([node.module] if node.module else [])))
            else:
                out.add(node.module)
    return out


def files(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("folder", FRONT_END)
def test_front_end_imports_no_framework(folder):
    for f in files(folder):
        bad = {m for m in imports(f) if m.split(".")[0] in FRAMEWORKS}
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_backends_import_neither_each_other_nor_runtimes(name):
    others = {f"linnet.compiler.{o}" for o in BACKENDS if o != name} | {"linnet.runtimes"}
    for f in files(BACKENDS[name]):
        bad = {m for m in imports(f) if any(m == o or m.startswith(o + ".") for o in others)}
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_code_generators_import_no_framework_at_module_level(name):
    f = ROOT / BACKENDS[name] / "codegen.py"
    bad = {m for m in imports(f, top_level_only=True) if m.split(".")[0] in FRAMEWORKS}
    assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)} at module level"
