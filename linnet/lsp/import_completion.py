"""Completion inside an import being typed: paths in `from "|`, standard-library modules in
`from std.|`, and the names a file can import in `from "llama.linnet" import |`.

It reads the text from the start of the line (or of the parenthesised name list) to the
cursor, so it works while the import does not parse yet. What a file can import is read from
its items' headers (a parse, no check): the modules, functions and configs it defines.
"""

from __future__ import annotations

import os
import re
from typing import Callable

from linnet.semantics.imports import IMPORTABLE, STD_PACKAGE, std_modules
from linnet.semantics.program import Analysis
from linnet.syntax import ast as A

from .completion import Completion
from .lookup import doc_of, header
from .symbols import file_items

_PATH = re.compile(r'(?:^|\n)from[ \t]+"([^"\n]*)\Z')
_MODULE = re.compile(r"(?:^|\n)from[ \t]+([A-Za-z_][\w.]*)?\Z")
_NAMES = re.compile(r'(?:^|\n)from[ \t]+(?:"([^"\n]*)"|([A-Za-z_][\w.]*))[ \t]+import\b([^"#]*)\Z')
_KINDS = {"module": "Class", "fn": "Function", "config": "Struct"}


def import_completions(analysis: Analysis, offset: int, read: Callable[[str], str | None]) -> list[Completion] | None:
    """Completions at character `offset` when it is inside an import (None when it is not).
    `read(path)` gives a file's text (an open editor's buffer, else the file), None if none."""
    item = analysis.item_at(offset)
    if item is None or item.kind != "import":
        return None
    before = analysis.document.text[item.offset : offset]
    if (m := _PATH.search(before)) is not None:
        return _paths(analysis, m.group(1), offset)
    if (m := _MODULE.search(before)) is not None:
        typed = m.group(1) or ""
        modules = std_modules(analysis.document.std)
        where = (offset - len(typed), offset)
        return [
            Completion(name, "Module", f"standard library: {os.path.basename(d.source.path)}", replace=where)
            for name, d in sorted(modules.items())
        ]
    if (m := _NAMES.search(before)) is not None:
        listed = m.group(3)
        if re.search(r"\bas[ \t]+\w*\Z", listed):
            return []  # an alias is a new name
        return _names(analysis, m.group(1), m.group(2), set(re.findall(r"[A-Za-z_]\w*", listed)) - {"as"}, read)
    return None


def _paths(analysis: Analysis, typed: str, offset: int) -> list[Completion]:
    """`.linnet` files and folders in the folder `typed` names, relative to this file."""
    here = analysis.document.source.path
    folder, _, partial = typed.rpartition("/")
    base = os.path.join(os.path.dirname(here), folder)
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except OSError:
        return []
    out = []
    replace = (offset - len(partial), offset)
    for e in entries:
        if e.name.startswith("."):
            continue
        if e.is_dir():
            out.append(Completion(e.name + "/", "Folder", replace=replace, sort="1"))
        elif e.name.endswith(".linnet") and os.path.abspath(e.path) != os.path.abspath(here):
            out.append(Completion(e.name, "File", replace=replace, sort="0"))
    return out


def _names(
    analysis: Analysis, path: str | None, module: str | None, listed: set[str], read: Callable[[str], str | None]
) -> list[Completion]:
    """What the file (or standard-library module) an import names can import, but what the
    import lists already."""
    if module is not None:
        if not module.startswith(STD_PACKAGE + "."):
            return []
        doc = std_modules(analysis.document.std).get(module)
        items = doc.items if doc is not None else []
    else:
        target = os.path.normpath(os.path.join(os.path.dirname(analysis.document.source.path), path))
        text = read(target)
        items = file_items(target, text) if text is not None else []
    out = []
    for item in items:
        if item.kind in IMPORTABLE and item.name and item.name not in listed and item.ast is not None:
            node = item.ast
            kind = _KINDS[item.kind]
            detail = header(item, node) if not isinstance(node, A.ImportDef) else ""
            out.append(Completion(item.name, kind, detail, doc_of(node), sort="0"))
    return out
