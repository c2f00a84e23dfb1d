"""Imports and name lookup across files.

`from "llama.linnet" import LlamaMLP, LlamaAttention as Attention` binds names of this file to
items defined in another file, found relative to the importing file;
`from std.nn import Linear` does the same for a standard-library module. A file exports the
modules (`model`s included), functions and configs it defines; its presets are not
importable (a preset is a way to load the file that declares it, and the presets a file is
checked under are its own), and neither are the names it imports itself (no re-exports: where
a name comes from is always one import away).

Each file has its own namespace (`Globals`): its items, the names it imports, then the
standard library. An imported item is checked and lowered in its own file's namespace:
`Globals(name, site)` resolves a name written in item `site`, so `LlamaDecoderLayer`, used
inside an imported `LlamaModel`, resolves in llama.linnet whether or not the importer imports
it. `Namespaces` holds the namespaces of every file an analysis reaches.

Problems are located errors on the import: a file that cannot be read (L120), a name the
file does not define (L121), an import cycle (L122), a name already taken in the importer
(L123), a preset (L124).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..syntax import ast as A
from ..syntax.ast import Span
from ..syntax.items import Item, Source
from .diagnostics import Finding, Fix, Label, LocalAnchor, SymbolAnchor, symbol
from .suggest import NameIndex, closest

if TYPE_CHECKING:
    from .program import Document, StdLib
    from .workspace import Workspace

IMPORTABLE = ("module", "fn", "config")
STD_PACKAGE = "std"


# ----------------------------------------------------------------------------- namespaces


class Globals:
    """The top-level names of one file: its own items, the names it imports, then the standard
    library (the file's own and imported names shadow the standard library's).

    Called as `globals_(name)`, it looks `name` up here; as `globals_(name, site)` it looks the
    name up in the namespace of the file that defines item `site` (an imported item's own
    names resolve in its own file)."""

    def __init__(
        self,
        items: list[Item],
        std_items: list[Item],
        imported: dict[str, Item] | None = None,
        failed: set[str] | frozenset[str] = frozenset(),
        namespaces: "Namespaces | None" = None,
    ):
        self.by_name: dict[str, Item] = {}
        self.defined: dict[str, Item] = {}  # the file's own items: what other files import
        self.duplicates: list[tuple[Item, Item]] = []
        self.imported = dict(imported or {})
        self.failed = set(failed)  # names of imports that failed: their uses are not news
        self.namespaces = namespaces
        self._names_key: str | None = None
        self._name_index: NameIndex | None = None
        # the file's items as this namespace saw them (a document's list is replaced, not changed, by an edit): an
        # item not among them was replaced since (`Analysis.resolved` checks again what names one)
        self.items = items
        for item in items:
            if item.name is None:
                continue
            if item.name in self.by_name:
                self.duplicates.append((self.by_name[item.name], item))
                continue
            self.by_name[item.name] = item
        self.defined = dict(self.by_name)
        for name, item in self.imported.items():
            self.by_name.setdefault(name, item)
        for item in std_items:
            if item.name is not None and item.name not in self.by_name and item.name not in self.failed:
                self.by_name[item.name] = item

    def at(self, site: Item | None) -> "Globals":
        """The namespace of the file that defines `site` (this one when `site` is None or here)."""
        if site is None or self.namespaces is None:
            return self
        return self.namespaces.by_source.get(site.source, self)

    def __call__(self, name: str, site: Item | None = None) -> Item | None:
        return self.at(site).by_name.get(name)

    def names(self, site: Item | None = None):
        return self.at(site).by_name.keys()

    def name_index(self, site: Item | None = None) -> NameIndex:
        """`names(site)` indexed for suggestions (made once per namespace, on its first unknown name)."""
        g = self.at(site)
        if g._name_index is None:
            g._name_index = NameIndex(g.by_name)
        return g._name_index

    def names_key(self, site: Item | None = None) -> str:
        g = self.at(site)
        if g._names_key is None:
            g._names_key = "\n".join(sorted(g.by_name))
        return g._names_key

    def is_failed(self, name: str, site: Item | None = None) -> bool:
        """Whether `name` was to be imported by an import that failed (reported there)."""
        return name in self.at(site).failed

    def configs(self) -> list[Item]:
        return [i for i in self.by_name.values() if i.kind == "config"]

    def config_names(self) -> list[str]:
        """The names this file gives the configs it sees (an imported config by its alias)."""
        return [n for n, i in self.by_name.items() if i.kind == "config"]

    def anchor_item(self, anchor: SymbolAnchor) -> Item | None:
        """The top-level item an anchor's path starts at."""
        if anchor.file and self.namespaces is not None:
            g = self.namespaces.by_path.get(anchor.file)
            return g.defined.get(anchor.path[0]) if g is not None else None
        return self.by_name.get(anchor.path[0])

    def interfaces(self) -> tuple:
        """Everything other items can see of this namespace: each name with its item's file
        and interface (`Item.interface`)."""
        return tuple(sorted((n, i.source.path, i.interface) for n, i in self.by_name.items()))


class Namespaces:
    """The namespace of every file an analysis reaches: the analysed file, every file it
    imports (transitively) and the standard library, by source and by path."""

    def __init__(self) -> None:
        self.by_source: dict[Source, Globals] = {}
        self.by_path: dict[str, Globals] = {}
        self.files: list[Document] = []  # the analysed file and every file it reaches, not std

    def add(self, source: Source, globals_: Globals) -> None:
        self.by_source[source] = globals_
        self.by_path[source.path] = globals_

    def absent(self) -> list[str]:
        """The paths the file imports of these files name (and the `.linnet` one its hint looks at) where no file
        was read: what the analysis found there (L120 "no such file") changes when a file appears."""
        read = {d.source.path for d in self.files}
        out: list[str] = []
        for doc in self.files:
            for item in doc.items:
                node = item.ast
                if item.kind != "import" or not isinstance(node, A.ImportDef) or not isinstance(node.source, A.StrLit):
                    continue
                path = import_path(doc, node)
                if path is not None and path not in read:
                    out += [p for p in (path, path + ".linnet") if p not in out and not p.endswith(".linnet.linnet")]
        return out

    def world(self) -> tuple:
        """What the analysis of the first file can depend on outside its own item texts: the
        namespaces of every file it reaches (the standard library does not change)."""
        return tuple((d.source.path, self.by_source[d.source].interfaces()) for d in self.files)


def namespaces(root: Document) -> tuple[Namespaces, FileImports]:
    """The namespaces of `root` and of every file it imports, transitively, and what `root`'s
    own imports found (with findings)."""
    std = root.std
    ns = Namespaces()
    std_items = std.items if std is not None else []
    if std is not None:
        std_globals = Globals(std_items, [], namespaces=ns)
        for doc in std.documents:
            ns.add(doc.source, std_globals)
    root_imports = None
    queue = [root]
    seen = {root.source}
    while queue:
        doc = queue.pop(0)
        found = file_imports(doc, report=doc is root)
        if doc is root:
            root_imports = found
        own_std = [i for i in std_items if i.source is not doc.source]
        ns.add(doc.source, Globals(doc.items, own_std, found.bindings, found.failed, ns))
        ns.files.append(doc)
        for target in found.files:
            if target.source not in seen and target.source not in ns.by_source:
                seen.add(target.source)
                queue.append(target)
    assert root_imports is not None
    return ns, root_imports


# ----------------------------------------------------------------------------- resolving imports


@dataclass
class ResolvedImport:
    """One import item of a file and the document it names."""

    item: Item
    node: A.ImportDef
    target: Document


@dataclass
class FileImports:
    """What the imports of one file bind.

    bindings: local name -> the imported item.
    failed: local names of imports that failed (their uses are not reported again).
    resolved: the imports whose file was found; `files` the documents they name.
    findings: the problems (only when asked to report).
    refs: per import item, the names in it with the definitions they name (navigation).
    """

    bindings: dict[str, Item] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    resolved: list[ResolvedImport] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    refs: dict[Item, list[tuple[Span, Any]]] = field(default_factory=dict)

    @property
    def files(self) -> list[Document]:
        out: list[Document] = []
        for r in self.resolved:
            if r.target not in out:
                out.append(r.target)
        return out


def import_path(importer: Document, node: A.ImportDef) -> str | None:
    """The path a file import names, relative to the importing file's folder (None for a
    standard-library import)."""
    if not isinstance(node.source, A.StrLit):
        return None
    base = os.path.dirname(importer.source.path)
    return os.path.normpath(os.path.join(base, node.source.value))


def std_modules(std: StdLib | None) -> dict[str, Document]:
    """The standard library's modules by dotted name: `std.nn` is `linnet/std/nn.linnet`."""
    if std is None:
        return {}
    return {f"{STD_PACKAGE}.{os.path.basename(d.source.path).removesuffix('.linnet')}": d for d in std.documents}


def _target(importer: Document, node: A.ImportDef, ws: Workspace) -> tuple[Document | None, str]:
    """The document an import names, or None and the reason."""
    if isinstance(node.source, A.ModulePath):
        modules = std_modules(importer.std)
        name = node.source.dotted
        if name in modules:
            return modules[name], ""
        known = ", ".join(f"`{m}`" for m in sorted(modules)) or "none"
        if not name.startswith(STD_PACKAGE + ".") and name != STD_PACKAGE:
            return (
                None,
                f"`{name}` is not a standard-library module (those are {known}); import a file by its path in quotes",
            )
        return None, f"no standard-library module `{name}` (there are {known})"
    path = import_path(importer, node)
    assert path is not None
    doc = ws.get(path)
    if doc is not None:
        return doc, ""
    problem = ws.problem(path) or "cannot read it"
    shown = node.source.value
    hint = ""
    if not shown.endswith(".linnet") and ws.get(path + ".linnet") is not None:
        hint = f'; did you mean "{shown}.linnet"?'
    return None, f'cannot import "{shown}": {problem} ({path}){hint}'


def file_imports(doc: Document, report: bool) -> FileImports:
    """Resolve the imports of `doc`. With `report`, collect findings for each problem (cycles
    included); otherwise only the bindings (the file is reached through another)."""
    out = FileImports()
    ws = doc.workspace
    own = {i.name: i for i in doc.items if i.name is not None}
    first_import: dict[str, A.Name] = {}
    import_items: dict[str, Item] = {}
    for item in doc.items:
        node = item.ast
        if item.kind != "import" or not isinstance(node, A.ImportDef):
            continue
        refs = out.refs.setdefault(item, [])
        target, problem = _target(doc, node, ws)
        if target is None:
            out.failed.update(n.local.id for n in node.names)
            if report:
                out.findings.append(Finding("L120", problem, LocalAnchor(item, node.source.span), label="not found"))
            continue
        out.resolved.append(ResolvedImport(item, node, target))
        if target is doc:
            out.failed.update(n.local.id for n in node.names)
            if report:
                out.findings.append(Finding("L122", "a file cannot import itself", LocalAnchor(item, node.source.span)))
            continue
        for imported in node.names:
            local = imported.local
            found = _defined(target, imported.name.id)
            problem_finding = None
            if found is None or found.kind not in IMPORTABLE:
                problem_finding = _not_importable(item, imported, target, found)
            elif local.id in own:
                problem_finding = Finding(
                    "L123",
                    f"`{local.id}` is already defined in this file",
                    LocalAnchor(item, local.span),
                    labels=[Label(LocalAnchor(own[local.id], own[local.id].name_span), "defined here")],
                    notes=[f"consider importing it under another name: `{imported.name.id} as Other{local.id}`"],
                )
            elif local.id in first_import:
                earlier = first_import[local.id]
                problem_finding = Finding(
                    "L123",
                    f"`{local.id}` is already imported",
                    LocalAnchor(item, local.span),
                    labels=[Label(LocalAnchor(import_items[local.id], earlier.span), "first imported here")],
                    notes=["consider `as` to give one of them another name"],
                )
            if found is not None:
                anchor = symbol(found)
                refs.append((imported.name.span, anchor))
                if imported.alias is not None:
                    refs.append((imported.alias.span, anchor))
            if problem_finding is not None:
                if report:
                    out.findings.append(problem_finding)
                if problem_finding.code != "L123":
                    out.failed.add(local.id)
                continue
            out.bindings[local.id] = found
            first_import[local.id] = local
            import_items[local.id] = item
    if report:
        out.findings.extend(_cycles(doc, out))
    return out


def _defined(doc: Document, name: str) -> Item | None:
    """The item `doc` defines under `name` (its first, if it defines it twice)."""
    for item in doc.items:
        if item.name == name:
            return item
    return None


def _not_importable(item: Item, imported: A.ImportedName, target: Document, found: Item | None) -> Finding:
    name = imported.name.id
    where = _shown(item, target)
    if found is not None:  # a preset
        return Finding(
            "L124",
            f"`{name}` is a preset of {where}: presets are not importable",
            LocalAnchor(item, imported.name.span),
            labels=[Label(symbol(found), "declared here")],
            notes=[
                "a file is checked and loaded under its own presets; declare one here: "
                f"`preset {name} = {_preset_config(found)} {{ ... }}`"
            ],
        )
    notes = []
    for other in target.items:
        if isinstance(other.ast, A.ImportDef) and any(n.local.id == name for n in other.ast.names):
            source = other.ast.source
            shown = f'"{source.value}"' if isinstance(source, A.StrLit) else source.dotted
            notes.append(f"{where} imports `{name}` from {shown}; import it from there (imports are not re-exported)")
    importable = [i.name for i in target.items if i.name is not None and i.kind in IMPORTABLE]
    hint = closest(name, importable)
    return Finding(
        "L121",
        f"{where} defines no `{name}`" + (f"; did you mean `{hint}`?" if hint else ""),
        LocalAnchor(item, imported.name.span),
        label="not found",
        notes=notes,
        fixes=[Fix(f"replace with `{hint}`", [(LocalAnchor(item, imported.name.span), hint)])] if hint else [],
    )


def _preset_config(preset: Item) -> str:
    node = preset.ast
    return node.value.type_name.id if isinstance(node, A.PresetDef) else "Config"


def _shown(item: Item, target: Document) -> str:
    node = item.ast
    if isinstance(node, A.ImportDef) and isinstance(node.source, A.ModulePath):
        return f"`{node.source.dotted}`"
    return f"`{os.path.basename(target.source.path)}`"


def _cycles(doc: Document, found: FileImports) -> list[Finding]:
    """An L122 on each import of `doc` from which `doc` imports itself again, naming the chain."""
    out = []
    for resolved in found.resolved:
        if resolved.target is doc:
            continue  # reported as a self-import
        chain = _path_back(resolved.target, doc)
        if chain is None:
            continue
        names = " -> ".join(os.path.basename(d.source.path) for d in [doc, *chain])
        out.append(
            Finding(
                "L122",
                f"import cycle: {names}",
                LocalAnchor(resolved.item, resolved.node.source.span),
                notes=["files import each other in a line: move what both need into a third file both import"],
            )
        )
    return out


def _path_back(start: Document, goal: Document) -> list[Document] | None:
    """The files from `start` to `goal` along imports (both included), or None (breadth first,
    so the shortest chain)."""
    previous: dict[Source, Document | None] = {start.source: None}
    docs = {start.source: start}
    queue = [start]
    while queue:
        doc = queue.pop(0)
        for target in file_imports(doc, report=False).files:
            if target.source in previous:
                continue
            previous[target.source] = doc
            docs[target.source] = target
            if target is goal:
                chain = [target]
                back = doc
                while back is not None:
                    chain.append(back)
                    back = previous[back.source]
                return list(reversed(chain))
            queue.append(target)
    return None


def canonical(anchor: Any, globals_: Globals | None) -> Any:
    """An anchor that names a definition by the analysed file's name for it (`file` empty),
    made to name it by its defining file (what `symbol` makes); others unchanged."""
    if not isinstance(anchor, SymbolAnchor) or anchor.file or globals_ is None or not anchor.path:
        return anchor
    item = globals_.by_name.get(anchor.path[0])
    if item is None or item.name is None:
        return anchor
    return SymbolAnchor((item.name,) + anchor.path[1:], item.source.path)
