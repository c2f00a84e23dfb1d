"""Files generated from the registries, so that the docs and the editors cannot drift from the
code:

- `docs/diagnostics.md`, the whole page, from the diagnostic codes (`linnet.semantics.codes`);
- `docs/language.md`, the op table of section 9 (between its two markers), from the op
  registry (`linnet.ops`);
- `vscode-extension/syntaxes/linnet.tmLanguage.json`, the builtin-function and standard-type
  patterns, and `editors/nvim/syntax/linnet.vim`, its `linnetBuiltin` and `linnetStdType`
  lines: from the registry's `keyword` ops and the standard library's functions, modules and
  configs;
- `docs/zoo.md`, the whole page, from the examples (their presets and parameter counts) and the parity tests'
  and the zoo benchmark's recorded results (`linnet.zoo_page`).

`python -m linnet.docgen` (`make docs`) rewrites them in place under the current directory,
the repository root; `--check` writes nothing and exits 1 naming the files that are stale.
tests/test_docs.py holds the checked-in files to what this module generates. Generating reads
the registries, the standard library's and the examples' sources and the recorded results only: no compiler, no
runtime.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from .ops import REGISTRY
from .semantics.codes import docs_markdown
from .semantics.program import std_library
from .zoo_page import zoo_page

OP_TABLE_START = (
    "<!-- generated from the op registry by `make docs` (python -m linnet.docgen): "
    "edit the entries in linnet/ops/catalog.py, not this table -->"
)
OP_TABLE_END = "<!-- end of the generated op table -->"
GENERATED_BY = "generated from the op registry and the standard library by `make docs` (python -m linnet.docgen)"
TEXTMATE_BUILTIN = "support.function.builtin.linnet"
TEXTMATE_STD_TYPE = "support.class.linnet"
VIM_BUILTIN = "syn match linnetBuiltin "
VIM_STD_TYPE = "syn keyword linnetStdType "


class StaleInput(Exception):
    """A file to regenerate lacks the place the generated text goes (a marker, a pattern)."""


# ----------------------------------------------------------------------------- what is generated


def op_table() -> str:
    """The op table of docs/language.md: one row per registry op, in registry order."""
    return "\n".join(["| op | meaning |", "|---|---|", *(op.docs_row() for op in REGISTRY.values())])


def builtin_names() -> tuple[list[str], list[str], list[str]]:
    """What the editors highlight as built in: the ops whose entry says `keyword`, the standard
    library's functions, and its modules and configs (types); each list sorted."""
    items = [i for i in std_library().items if i.name]
    ops = sorted(name for name, op in REGISTRY.items() if op.keyword)
    functions = sorted(i.name for i in items if i.kind == "fn")
    types = sorted(i.name for i in items if i.kind in ("module", "config"))
    return ops, functions, types


def _longest_first(names: list[str]) -> list[str]:
    """Alternatives of one regex, longest first (so no name stops at a shorter one's end)."""
    return sorted(names, key=lambda n: (-len(n), n))


# ----------------------------------------------------------------------------- the files


def diagnostics_page(_current: str) -> str:
    return docs_markdown()


def language_doc(current: str) -> str:
    """docs/language.md with the op table between its markers regenerated."""
    start, end = current.find(OP_TABLE_START), current.find(OP_TABLE_END)
    if start < 0 or end < start:
        raise StaleInput(f"the op table's markers are missing: `{OP_TABLE_START}` ... `{OP_TABLE_END}`")
    return current[: start + len(OP_TABLE_START)] + "\n" + op_table() + "\n" + current[end:]


def textmate_grammar(current: str) -> str:
    """The TextMate grammar with its builtin-function and standard-type patterns regenerated."""
    grammar = json.loads(current)
    ops, functions, types = builtin_names()
    for name, words in ((TEXTMATE_BUILTIN, ops + functions), (TEXTMATE_STD_TYPE, types)):
        patterns = [p for p in grammar_rules(grammar) if p.get("name") == name and "match" in p]
        if len(patterns) != 1:
            raise StaleInput(f"expected one `match` pattern named {name}, found {len(patterns)}")
        patterns[0]["comment"] = GENERATED_BY
        patterns[0]["match"] = r"\b(?:" + "|".join(_longest_first(words)) + r")\b"
    return json.dumps(grammar, indent=2, ensure_ascii=False) + "\n"


def grammar_rules(node):
    """Every JSON object of a TextMate grammar (`json.loads`'d), depth first: its rules and
    patterns among them."""
    if isinstance(node, dict):
        yield node
        children = node.values()
    elif isinstance(node, list):
        children = node
    else:
        return
    for child in children:
        yield from grammar_rules(child)


def vim_syntax(current: str) -> str:
    """The Vim syntax file with its `linnetBuiltin` (ops, then std functions) and `linnetStdType`
    lines regenerated, where they stand."""
    ops, functions, types = builtin_names()
    builtins = [VIM_BUILTIN + '"\\<\\%(' + "\\|".join(words) + '\\)\\ze\\s*("' for words in (ops, functions)]
    lines = current.split("\n")
    lines = _replace_run(lines, VIM_BUILTIN, builtins)
    lines = _replace_run(lines, VIM_STD_TYPE, [VIM_STD_TYPE + " ".join(types)])
    return "\n".join(lines)


def _replace_run(lines: list[str], prefix: str, new: list[str]) -> list[str]:
    """`lines` with its one run of consecutive lines starting with `prefix` replaced by `new`."""
    at = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    if not at or at != list(range(at[0], at[0] + len(at))):
        raise StaleInput(f"expected one run of lines starting with `{prefix.strip()}`, found lines {at}")
    return lines[: at[0]] + new + lines[at[-1] + 1 :]


GENERATED: dict[str, Callable[[str], str]] = {
    "docs/diagnostics.md": diagnostics_page,
    "docs/language.md": language_doc,
    "vscode-extension/syntaxes/linnet.tmLanguage.json": textmate_grammar,
    "editors/nvim/syntax/linnet.vim": vim_syntax,
    "docs/zoo.md": zoo_page,
}


def generate(root: Path) -> dict[Path, tuple[str, str]]:
    """Each generated file under `root`: (its text now, its text regenerated). Raises OSError
    when a file cannot be read, `StaleInput` when one lacks its markers, ValueError when an example does
    not check clean or a results file is not JSON."""
    out = {}
    for name, make in GENERATED.items():
        path = root / name
        current = path.read_text(encoding="utf-8")
        out[path] = (current, make(current))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m linnet.docgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: .)")
    args = parser.parse_args(argv)
    try:
        files = generate(args.root)
    except (OSError, ValueError, StaleInput) as err:  # ValueError: an example that does not check, bad JSON
        print(f"python -m linnet.docgen: {err} (run it from the repository root)", file=sys.stderr)
        return 2
    stale = [path for path, (current, new) in files.items() if current != new]
    for path in stale:
        if args.check:
            print(f"{path}: stale; regenerate with `make docs`", file=sys.stderr)
        else:
            path.write_text(files[path][1], encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
