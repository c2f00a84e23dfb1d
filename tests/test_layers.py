"""The layering of docs/architecture.md, checked on the import statements of every source file
(module level and lazy, inside functions): the front end's layers form a line (syntax → types
→ ops → semantics → ir, each importing only layers before it) and import no framework;
linnet's packages import each other without cycles; no module imports a private name of
another package; backends import neither each other nor `runtimes`; code generators import no
framework at module level."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import ROOT

FRAMEWORKS = {"torch", "jax", "jaxlib", "onnx", "onnx_ir", "onnxruntime", "pygls", "lsprotocol"}
# The source folder: every package lives under linnet/ as it imports (linnet/compiler/ is linnet.compiler).
SOURCES = {"linnet": "linnet"}
# The front end's layers, in order, and what each may import of Linnet besides itself: the
# layers before it, except that `types` is the leaf (it needs no syntax).
FRONT_END = ["linnet.syntax", "linnet.types", "linnet.ops", "linnet.semantics", "linnet.ir"]
# `linnet.errors`, the one error hierarchy, imports nothing (test below), so every layer may use it.
LEAVES = {"linnet.errors"}
MAY_IMPORT = {
    "linnet.syntax": LEAVES,
    "linnet.types": LEAVES,
    "linnet.ops": {"linnet.syntax", "linnet.types"} | LEAVES,
    "linnet.semantics": {"linnet.syntax", "linnet.types", "linnet.ops"} | LEAVES,
    "linnet.ir": {"linnet.syntax", "linnet.types", "linnet.ops", "linnet.semantics"} | LEAVES,
}
BACKENDS = {"torch": "linnet/compiler/torch", "jax": "linnet/compiler/jax", "onnx": "linnet/compiler/onnx"}


@dataclass(frozen=True)
class Import:
    """One imported module (`target`), and the names taken from it (`from target import name`);
    `lazy`: the statement is inside a function or class, not at module level."""

    source: Path
    target: str
    names: tuple[str, ...]
    lazy: bool
    line: int

    def __str__(self) -> str:
        what = f"from {self.target} import {', '.join(self.names)}" if self.names else f"import {self.target}"
        return f"{self.source.relative_to(ROOT)}:{self.line}: {what}"


def module_name(path: Path) -> str:
    """The import name of a source file (`linnet/compiler/torch/codegen.py` → `linnet.compiler.torch.codegen`)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [SOURCES[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def all_modules() -> dict[str, Path]:
    """Every module of linnet by import name."""
    return {module_name(p): p for folder in SOURCES for p in sorted((ROOT / folder).rglob("*.py"))}


def imports(path: Path) -> list[Import]:
    """Every import statement of a file, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    top_level = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        lazy = id(node) not in top_level
        if isinstance(node, ast.Import):
            out += [Import(path, a.name, (), lazy, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            out.append(Import(path, target, tuple(a.name for a in node.names), lazy, node.lineno))
    return out


def files(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


def package_of(module: str) -> str:
    """The package a module belongs to: its own for a package's `__init__`; each top-level
    module of `linnet` (the CLI, the facades, `linnet` itself) stands alone."""
    path = all_modules().get(module)
    if path is None or path.name == "__init__.py" or module.count(".") == 1:
        return module
    return module.rsplit(".", 1)[0]


def linnet_targets(imp: Import) -> list[str]:
    """The Linnet modules an import reaches: `from pkg import submodule` reaches the submodule."""
    if imp.target != "linnet" and not imp.target.startswith("linnet."):
        return []
    subs = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in all_modules()]
    return subs or [imp.target]


def package_graph() -> dict[str, dict[str, Import]]:
    """package → {package it imports: one import statement that does}."""
    graph: dict[str, dict[str, Import]] = {}
    for module, path in all_modules().items():
        edges = graph.setdefault(package_of(module), {})
        for imp in imports(path):
            for target in linnet_targets(imp):
                to = package_of(_known_prefix(target))
                if to != package_of(module):
                    edges.setdefault(to, imp)
    return graph


def _known_prefix(name: str) -> str:
    while name not in all_modules() and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def find_cycle(graph: dict[str, dict[str, object]]) -> list[str] | None:
    """A cycle of `graph` as the list of its nodes (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


# ----------------------------------------------------------------------------- the front end


@pytest.mark.parametrize("layer", FRONT_END)
def test_front_end_imports_no_framework(layer):
    for f in files(layer.replace(".", "/")):
        bad = [str(i) for i in imports(f) if i.target.split(".")[0] in FRAMEWORKS]
        assert not bad, "\n".join(bad)


def test_errors_import_nothing():
    found = imports(ROOT / "linnet" / "errors.py")
    assert not [str(i) for i in found if i.target.startswith("linnet") or i.target.split(".")[0] in FRAMEWORKS]


@pytest.mark.parametrize("layer", FRONT_END)
def test_front_end_layers_form_a_line(layer):
    """Each layer imports only the layers before it: syntax → types → ops → semantics → ir
    (`types`, the leaf, imports nothing else of Linnet)."""
    allowed = MAY_IMPORT[layer] | {layer}
    bad = [
        f"{imp}  ({package_of(_known_prefix(t))} is not before {layer})"
        for f in files(layer.replace(".", "/"))
        for imp in imports(f)
        for t in linnet_targets(imp)
        if package_of(_known_prefix(t)) not in allowed
    ]
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- all of linnet


def test_no_import_cycles_between_packages():
    cycle = find_cycle(package_graph())
    assert cycle is None, (
        "import cycle: "
        + " → ".join(cycle)
        + "\n"
        + "\n".join(str(package_graph()[a][b]) for a, b in zip(cycle, cycle[1:]))
    )


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "d": {"a": 1, "c": 1}}) is None


def test_no_module_imports_a_private_name_of_another_package():
    """`from linnet.x import _helper` (or a `_private` module) across packages: make the
    helper public where it belongs, or move it."""
    bad = []
    for module, path in all_modules().items():
        for imp in imports(path):
            for target in linnet_targets(imp):
                if package_of(_known_prefix(target)) == package_of(module):
                    continue
                private = [p for p in target.split(".") if p.startswith("_") and not p.startswith("__")]
                private += [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
                if private:
                    bad.append(f"{imp}  (private: {', '.join(private)})")
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- backends


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_backends_import_neither_each_other_nor_runtimes(name):
    others = {f"linnet.compiler.{o}" for o in BACKENDS if o != name} | {"linnet.runtimes"}
    for f in files(BACKENDS[name]):
        bad = [str(i) for i in imports(f) if any(i.target == o or i.target.startswith(o + ".") for o in others)]
        assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_code_generators_import_no_framework_at_module_level(name):
    f = ROOT / BACKENDS[name] / "codegen.py"
    bad = [str(i) for i in imports(f) if not i.lazy and i.target.split(".")[0] in FRAMEWORKS]
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- the backend interface

# What names a backend or its framework: the registry's names and families, and its runtime modules.
BACKEND_WORDS = {"torch", "jax", "onnx", "xla", "onnxruntime", "torch_backend", "jax_backend", "onnx_backend"}
# What holds a backend's name or family outside the registry (`model.backend`, `backend.family`, a `family` local).
BACKEND_HOLDERS = {"backend", "family", "runtime"}


def _holds_backend(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return name in BACKEND_HOLDERS


def _backend_words(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in BACKEND_WORDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_backend_words(e) for e in node.elts)
    return False


def family_tests(path: Path) -> list[str]:
    """The places of `path` that ask which backend or framework something runs on: `model.backend == "jax"`,
    `backend.family in ("torch", ...)`, `model.backend.startswith("torch")`."""
    return family_tests_in(path, ROOT)


def family_tests_in(path: Path, root: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_holds_backend(s) for s in sides) and any(_backend_words(s) for s in sides):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
            if _holds_backend(node.func.value) and any(_backend_words(a) for a in node.args):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_backends_asks_which_backend_it_runs_on():
    """What differs between backends is a hook of the registry record (`setup_process`, `trainer`,
    `tensor_parallel`, `runtime_module().load_prepared`) or of the loaded model (`held_weights`): the CLI, serving,
    training, parallelism and exports never branch on a backend's name or family."""
    backends = ROOT / "linnet" / "runtimes" / "backends"
    bad = [hit for path in files("linnet") if backends not in path.parents for hit in family_tests(path)]
    assert not bad, "\n".join(bad)


def test_a_family_test_is_found(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "if model.backend == 'jax': pass\n"
        "if backend.family in ('torch', 'onnx'): pass\n"
        "if model.backend.startswith('torch'): pass\n"
        "if target == 'torch': pass\n"  # a code view, not a backend
    )
    found = [hit.split(": ", 1)[1] for hit in family_tests_in(probe, tmp_path)]
    assert found == [
        "model.backend == 'jax'",
        "backend.family in ('torch', 'onnx')",
        "model.backend.startswith('torch')",
    ]
