"""A size budget, as tinygrad keeps one: every module under linnet/ at most MAX_MODULE_LINES lines,
every function or method at most MAX_FUNCTION_LINES (from its `def` to the end of its body, docstring
included; decorators not counted). A file or function over budget is split into phases with names, not
excepted; only tables (a module or function that is mostly data) may be listed in EXCEPTIONS, each with
its reason. `pytest -s tests/test_size.py` (or `-rP`) prints the lines of each package."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from tests.conftest import ROOT

MAX_MODULE_LINES = 1500
MAX_FUNCTION_LINES = 150

# Over budget on purpose, each with its reason: `path` for a module, `path::Class.method` for a function
# (`path::outer.inner` for a nested one). Only tables, a module or function that is mostly data (none is over
# budget today, not even linnet/ops/catalog.py, the op catalogue), or a split pending in another branch. Keep it
# short and honest: an entry that is back within budget, or gone, fails `test_exceptions_are_still_needed`.
EXCEPTIONS: dict[str, str] = {}


def sources() -> list[Path]:
    return sorted((ROOT / "linnet").rglob("*.py"))


def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function and method in `tree`, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node.end_lineno - node.lineno + 1
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def sizes() -> dict[str, tuple[int, int]]:
    """Every module (`linnet/ir/core.py`) and function (`linnet/ir/core.py::Graph.name_values`) by key:
    (its lines, its budget)."""
    out = {}
    for path in sources():
        text = path.read_text(encoding="utf-8")
        key = path.relative_to(ROOT).as_posix()
        out[key] = (len(text.splitlines()), MAX_MODULE_LINES)
        for name, lines in functions(ast.parse(text)):
            out[f"{key}::{name}"] = (lines, MAX_FUNCTION_LINES)
    return out


def package(path: Path) -> str:
    """The package a module counts under: `linnet.ir` for linnet/ir/lower.py, `linnet` for linnet/torch.py."""
    parts = path.relative_to(ROOT).parts
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def test_modules_and_functions_are_within_budget():
    over = [
        f"{key}: {lines} lines (budget {budget})"
        for key, (lines, budget) in sizes().items()
        if lines > budget and key not in EXCEPTIONS
    ]
    assert not over, "over the size budget (split it into named phases):\n" + "\n".join(over)


def test_exceptions_are_still_needed():
    """An exception whose module or function is gone or back within budget is removed from the list."""
    found = sizes()
    stale = [key for key in EXCEPTIONS if key not in found or found[key][0] <= found[key][1]]
    assert not stale, "no longer over budget (remove from EXCEPTIONS): " + ", ".join(stale)


def test_report_lines_per_package():
    """Prints the lines and modules of each package (shown with `-s` or `-rP`)."""
    lines, modules = Counter(), Counter()
    for path in sources():
        lines[package(path)] += len(path.read_text(encoding="utf-8").splitlines())
        modules[package(path)] += 1
    print(f"\n{'package':<20} {'modules':>7} {'lines':>7}")
    for name in sorted(lines, key=lambda n: -lines[n]):
        print(f"{name:<20} {modules[name]:>7} {lines[name]:>7}")
    print(f"{'total':<20} {sum(modules.values()):>7} {sum(lines.values()):>7}")
    assert lines


def test_functions_are_measured_from_def_to_the_end_of_their_body():
    tree = ast.parse(
        '@decorator\ndef f():\n    """doc"""\n\n    def g():\n        pass\n    return g\n\n\n'
        "class C:\n    def m(self):\n        return 1\n"
    )
    assert list(functions(tree)) == [("f", 6), ("f.g", 2), ("C.m", 2)]
