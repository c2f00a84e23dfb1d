"""Documents and their analysis: the incremental front end shared by `linnet check`, the
language server and the compiler.

A `Document` holds a source's items. `update(text)` re-splits the text (a line scan) and
reparses only items whose text changed; `analyze()` rechecks only items whose own text, or
the interface of something they use (`Item.interface`: an item without its function
bodies), changed, under each config binding. Everything else is reused, which is what keeps
an edit inside one function body to one item's work; inside a module, to one function's: the
item keeps its nodes but for the edited body (`syntax.splice`), and its checks are made from
the ones before with that function checked again (`fn_reuse`).

Documents live in a `Workspace` (the files a session can reach, by path): what a document
imports is found there, so an importer's analysis sees the imported file's current text, and
an edit inside an imported function body rechecks nothing in the importer.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from ..syntax import ast as A
from ..syntax.ast import Span
from ..syntax.items import Item, Location, Source, header_name, make_item, split_items_edited
from ..syntax.positions import LineIndex, changed_range
from ..syntax.recursion import RECURSION_LIMIT, deep_recursion
from ..syntax.splice import BodyEdit, Splice, plan_splice
from ..types.core import NONE, ConfigT, NoneT, Type, format_type
from . import fn_reuse, parallel
from .attributes import check_attributes
from .checker import NAMES_DEP, CheckContext, ItemChecker, ItemResult
from .codes import CODES
from .configs import ConfigEvaluator, ConfigValue, Scenario, values_by_type
from .diagnostics import Diagnostic, Finding, Label, LocalAnchor, SymbolAnchor, locate
from .imported import imported_findings
from .imported import item_findings as imported_item_findings
from .imports import FileImports, Globals, Namespaces, canonical, namespaces
from .instances import instance_findings
from .model import ModelTree, check_model
from .pausing import pause_point
from .resolved import Resolved
from .unread import unread_findings
from .workspace import Workspace

__all__ = ["Analysis", "Document", "Globals", "PartialAnalysis", "StdLib", "TypeInfo", "Workspace", "std_library"]

STD_FILES = ("nn.linnet", "functional.linnet", "rope.linnet", "attention.linnet")


# ----------------------------------------------------------------------------- standard library


class StdLib:
    """The standard library: Linnet sources shipped in `linnet/std`, parsed once per process."""

    def __init__(self, files: dict[str, str]):
        self.documents = [Document(path, text, std=None, is_std=True) for path, text in files.items()]
        self._analyses: dict[Document, Analysis] = {}
        for doc in self.documents:
            doc._std = self  # std files see each other (a document skips its own path)

    @property
    def items(self) -> list[Item]:
        return [i for d in self.documents for i in d.items]

    def paths(self) -> list[str]:
        return [d.source.path for d in self.documents]

    def analysis(self, item: Item) -> "Analysis | None":
        """The analysis of the std file holding `item` (each checked once per process: its
        functions and modules are generic, checked without a user's config)."""
        for doc in self.documents:
            if item in doc.items:
                if self._analyses.get(doc) is None:
                    self._analyses[doc] = doc.analyze()
                return self._analyses[doc]
        return None


@lru_cache(maxsize=1)
def std_library() -> StdLib:
    base = Path(__file__).resolve().parent.parent / "std"
    return StdLib({str(base / name): (base / name).read_text(encoding="utf-8") for name in STD_FILES})


# ----------------------------------------------------------------------------- results


@dataclass
class TypeInfo:
    """What hover shows for a position: the node's span, its type as written and with the
    preset's values, and the config it was computed under."""

    location: Location
    symbolic: str
    concrete: str
    scenario: str | None
    type: Type


@dataclass
class ItemAnalysis:
    """An item's check results, one per config binding (scenario names, result); `bindings`
    holds each result's binding (config parameter name -> ConfigT or NONE), in that order."""

    item: Item
    results: list[tuple[list[str] | None, ItemResult]] = field(default_factory=list)
    bindings: list[dict[str, Type]] = field(default_factory=list)


@dataclass
class Stats:
    items_parsed: int = 0
    items_checked: int = 0
    checks_run: int = 0
    checked_names: list[str] = field(default_factory=list)


class PartialAnalysis(Exception):
    """A query's answer from a staged analysis (`Analysis.partial`) could differ from the full analysis's: ask
    the full one."""


class Analysis:
    """The analysis of one document version."""

    def __init__(self, document: "Document"):
        self.document = document
        # the document's version this analysis is of: the items it reads are the document's, which a later update
        # moves in place (`holds_text`)
        self.version = document.version
        self.diagnostics: list[Diagnostic] = []
        self.items: dict[Item, ItemAnalysis] = {}
        self.scenarios: list[Scenario] = []
        self.stats = Stats()
        self.model: Item | None = None
        self.trees: dict[str, ModelTree] = {}
        self.globals: Globals | None = None
        self.namespaces: Namespaces | None = None  # every file the analysis reached, by path
        self.imports: FileImports | None = None  # what the document's imports bound
        self.item_refs: dict[Item, list[tuple[Span, Any]]] = {}
        self.context: CheckContext | None = None  # what its item checks shared (for checks on demand)
        # `resolved`'s checks under bindings made on demand: the result and its resolved form
        self._checked_now: dict[Any, tuple[ItemResult, Resolved]] = {}
        self._live: set[Item] | None = None  # the items of every file this analysis saw (`_names_replaced`)
        self._replaced_in: dict[int, tuple[ItemResult, bool]] = {}  # by check: whether it names a replaced item
        # What forked workers checked (`Document.analyze(jobs=...)`): each item's merged findings and calls; those
        # items are not in `items` (`resolved` checks them again on demand)
        self.remote: dict[Item, _Checked] = {}
        # Items checked under one binding only, the one `results_for` puts first (`Document.analyze_first`): their
        # other results are missing, and the analysis's diagnostics are an earlier analysis's; a query those results
        # could change raises PartialAnalysis
        self.partial: set[Item] = set()
        self.staged_for: str | None = None  # the scenario whose binding `partial` items were checked under

    def staged_copy(self) -> "Analysis":
        """A copy to stage a body edit in (`Document.analyze_first`): what it holds is this analysis's, but for its
        items' checks (a dict of its own) and what queries compute on demand (nothing yet)."""
        view = Analysis(self.document)
        view.diagnostics = self.diagnostics
        view.items = dict(self.items)
        view.scenarios = self.scenarios
        view.model = self.model
        view.trees = dict(self.trees)
        view.globals, view.namespaces, view.imports = self.globals, self.namespaces, self.imports
        view.item_refs = dict(self.item_refs)
        view.context = self.context
        return view

    @property
    def files(self) -> list[str]:
        """The paths of the files this analysis read: the document's and every file it
        imports, transitively (not the standard library)."""
        return [d.source.path for d in self.namespaces.files] if self.namespaces is not None else []

    @property
    def absent_files(self) -> list[str]:
        """The paths the file imports of `files` name where no file could be read (their appearing changes what
        this analysis found)."""
        return self.namespaces.absent() if self.namespaces is not None else []

    @property
    def presets(self) -> list[str]:
        """The presets checked under (those whose config evaluated without errors)."""
        return [s.name for s in self.scenarios if s.preset is not None]

    @property
    def declared_presets(self) -> list[str]:
        """Every preset the document declares, checked or not."""
        return [i.name for i in self.document.items if i.kind == "preset" and i.name]

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    # ----- position queries (used by hover, go-to-definition, references)
    def item_at(self, offset: int) -> Item | None:
        for item in self.document.items:
            if item.offset <= offset <= item.offset + len(item.text):
                return item
        return None

    def results_for(self, item: Item, preset: str | None):
        """The item's (scenario names, result) pairs, those under `preset` (else the first
        preset) first."""
        ia = self.items.get(item)
        if ia is None or not ia.results:
            return []
        if item in self.partial:
            if self.wanted_scenario(preset) != self.staged_for:
                raise PartialAnalysis(f"{item.name} is checked under {self.staged_for} only")
            return _only_check(ia.results[0], item)
        return self._results_of(ia, preset)

    def _results_of(self, ia: ItemAnalysis, preset: str | None):
        wanted = self.wanted_scenario(preset)
        ordered = sorted(ia.results, key=lambda r: 0 if (r[0] is None or wanted in r[0]) else 1)
        return ordered

    def holds_text(self) -> bool:
        """Whether the document still holds the text this analysis is of (its items, offsets and line index are read
        in place): another update of the same document made it stale (a second editor buffer of the file, open
        under another URI; a closed buffer's check reads a document of its own: `Workspace.open`'s `since`)."""
        return self.document.version == self.version

    def wanted_scenario(self, preset: str | None) -> str:
        """The scenario whose results queries read first: `preset`, else the first preset checked, else the
        config defaults."""
        return preset or (self.presets[0] if self.presets else "defaults")

    def resolved(
        self, item: Item | str, preset: str | None = None, config: dict | None = None, *, current: bool = True
    ) -> Resolved | None:
        """The resolved, typed form of a checked module or function: what each name use refers
        to, how each call binds (arguments to parameters, defaults filled, values converted,
        dims solved) and each expression's type with folded compile-time values
        (`resolved.Resolved`). `item` is an Item or a top-level name (the file's, then the
        standard library's). None for an item that is not a module or function.

        A module or function taking configs is checked once per distinct config value:
        `config` (config parameter name -> ConfigValue, or None for `none`, as the `args` of a
        "module" CallInfo carry them in `ConfigT`s) picks the check whose config parameters
        hold exactly these values (a method's config parameters may be among them: they are
        then bound in the check of its module). Without `config`, the check under `preset`
        (else the first preset, else the defaults). When no check of this analysis has those
        values (an item imported under the importer's config, a standard-library function
        under an argument no preset gives, a method's config argument), the item is checked
        under them now, once per analysis, in its own file's namespace; that check's errors, and the
        item's syntax errors, are in `Resolved.errors` (the analysis's diagnostics do not have them).

        A check this analysis reused from an earlier one (`Document._check_one`: what it looked up kept its
        interface) may name items an edit has replaced since: a function whose body changed, an imported module
        parsed again. Its findings and types hold, but its names and calls lead to the old bodies, which lowering
        would compile. Such a check is made again now, once per analysis, as above (`_names_replaced`);
        `current=False` returns it as it is (unread.py, which maps those items by name itself, on every edit)."""
        if self.partial:  # (its checks on demand would share the context with the full analysis running meanwhile)
            raise PartialAnalysis("a staged analysis resolves nothing")
        if isinstance(item, str):
            item = self.globals(item) if self.globals is not None else None
        if item is None or item.kind not in ("module", "fn") or item.ast is None:
            return None
        ia = self.items.get(item)
        if ia is None and item.is_std and self.document.std is not None:
            std = self.document.std.analysis(item)  # the standard library's own check of it
            ia = std.items.get(item) if std is not None else None
        if config is None:
            if ia is not None and ia.results:
                result = self._results_of(ia, preset)[0][1]
                binding = ia.bindings[next(n for n, r in enumerate(ia.results) if r[1] is result)]
                return self._current(item, binding, result) if current else result.resolved
            config = {}  # an imported item: under its config defaults
        for binding, (_, result) in zip(ia.bindings, ia.results) if ia is not None else ():
            if binding.keys() == config.keys() and all(
                _config_key(binding[k]) == _config_key(v) for k, v in config.items()
            ):
                return self._current(item, binding, result) if current else result.resolved
        return self._check_under(item, config)

    def _current(self, item: Item, binding: dict, result: ItemResult) -> Resolved:
        """`item`'s check `result` under `binding` in resolved form, or that check made again now when it names an
        item an edit has replaced since it was made (see `resolved`)."""
        if item.is_std or not self._names_replaced(result):
            return result.resolved
        fresh, resolved = self._check_now(item, binding)
        self.document._keep_fresh(self.context, item, binding, result, fresh)
        return resolved

    def _names_replaced(self, result: ItemResult) -> bool:
        """Whether a name or call of `result` leads to an item that is not among the items of its file this
        analysis saw (what lowering follows: `Ref.item`, `CallInfo.item`). Judged once per check and analysis."""
        found = self._replaced_in.get(id(result))
        if found is not None and found[0] is result:
            return found[1]
        if self.namespaces is None:
            return False
        if self._live is None:
            files = {id(g): g for g in self.namespaces.by_path.values()}  # the standard library's once
            self._live = {i for g in files.values() for i in g.items}
        live = self._live
        named = itertools.chain((r.item for r in result.names.values()), (c.item for c in result.call_info.values()))
        replaced = any(i is not None and not i.is_std and i not in live for i in named)
        self._replaced_in[id(result)] = (result, replaced)
        return replaced

    def _check_under(self, item: Item, config: dict) -> Resolved:
        """`item` checked now under the config values `config` (see `resolved`)."""
        binding: dict[str, Type] = {
            k: v if isinstance(v, (ConfigT, NoneT)) else ConfigT(v) if isinstance(v, ConfigValue) else NONE
            for k, v in config.items()
        }
        return self._check_now(item, binding)[1]

    def _check_now(self, item: Item, binding: dict[str, Type]) -> tuple[ItemResult, Resolved]:
        """`item` checked now under `binding`, once per analysis: the result and its resolved form."""
        key = (item, tuple(sorted((k, _config_key(v)) for k, v in binding.items())))
        found = self._checked_now.get(key)
        if found is None:
            result = _check_item(self.context, item, binding)
            # with its syntax errors: an imported item's are not the importer's diagnostics, and lowering a body
            # that did not parse whole would meet the holes error recovery left in it
            findings = _syntax_findings(item) + result.findings
            errors = [d for f in findings if (d := locate(f, self.resolve)) is not None and d.is_error]
            found = self._checked_now[key] = (result, replace(result.resolved, errors=errors))
        return found

    def type_at(self, offset: int, preset: str | None = None) -> TypeInfo | None:
        """The type of the innermost expression or name at `offset` (character offset)."""
        item = self.item_at(offset)
        if item is None or item.ast is None:
            return None
        rel = offset - item.offset
        chain = A.node_at(item.ast, rel)
        # the innermost node that has a type of its own: an expression, a name, a type
        # annotation; statements and blocks are passed over, an expression is not (a branch
        # not taken under this config has no types, and shows none rather than its `if`'s)
        wanted = self.wanted_scenario(preset)
        for names, result in self.results_for(item, preset):
            for node in reversed(chain):
                t = result.types.get(node)
                if t is not None:
                    return TypeInfo(
                        item.resolve(node.span),
                        format_type(t),
                        format_type(t, concrete=True),
                        # the scenario asked for when it shares this check with others (the defaults among them)
                        (wanted if wanted in names else names[0]) if names else None,
                        t,
                    )
                if isinstance(node, _TYPED_NODES):
                    break
        return None

    def definition_at(self, offset: int) -> Location | None:
        target = self.symbol_at(offset)
        return self.resolve(target) if target is not None else None

    def symbol_at(self, offset: int):
        """The definition anchor of the name at `offset` (a use or the definition itself)."""
        item = self.item_at(offset)
        if item is None:
            return None
        rel = offset - item.offset
        best = None
        for span, target in self.refs_of(item, at=rel):
            if span.start <= rel <= span.end and (best is None or span.end - span.start < best[0].end - best[0].start):
                best = (span, target)
        return best[1] if best is not None else None

    def refs_of(self, item: Item, at: int | None = None):
        """(span, anchor) of every name in `item` that names a definition; anchors of
        top-level definitions name their defining file (`canonical`). `at`: only those around item-relative
        offset `at` are wanted (of a `partial` item, those are known outside compile-time branches)."""
        for span, target in self.item_refs.get(item, ()):
            yield span, self.canonical(target)
        ia = self.items.get(item)
        if ia is not None:
            if item in self.partial and _in_branch(item.ast, at):
                # a compile-time branch is checked only under the bindings that take it: their checks name more
                raise PartialAnalysis(f"{item.name} is checked under {self.staged_for} only")
            for _, result in ia.results:
                for span, target in result.refs:
                    yield span, self.canonical(target)

    def canonical(self, anchor):
        """`anchor`, naming its definition by the file that defines it (imports.canonical)."""
        return canonical(anchor, self.globals)

    def source_of(self, path: str) -> Source | None:
        """The source of a file this analysis read (the document, a file it imports, the
        standard library), by path; None for any other."""
        docs = list(self.namespaces.files) if self.namespaces is not None else [self.document]
        docs += self.document.std.documents if self.document.std is not None else []
        return next((d.source for d in docs if d.source.path == path), None)

    def references(self, offset: int, include_definition: bool = True) -> list[Location]:
        """Every place in this document naming the symbol at `offset` (its definition first
        when it is in this document), for find-references, rename and highlights."""
        target = self.symbol_at(offset)
        if target is None:
            return []
        return self.references_to(target, include_definition)

    def references_to(self, target, include_definition: bool = True) -> list[Location]:
        """Every place in this document naming definition `target` (an anchor from
        `symbol_at`, possibly of another document's analysis), its definition first when it
        is in this document."""
        target = self.canonical(target)
        out: list[Location] = []
        seen = set()
        definition = self.resolve(target)
        if include_definition and definition is not None and definition.path == self.document.source.path:
            out.append(definition)
            seen.add((definition.start.offset, definition.end.offset))
        for item in self.document.items:
            for span, t in self.refs_of(item):
                if t == target:
                    loc = item.resolve(span)
                    key = (loc.start.offset, loc.end.offset)
                    if key not in seen and (include_definition or loc != definition):
                        seen.add(key)
                        out.append(loc)
        return out

    def resolve(self, anchor) -> Location | None:
        return self.document.resolve(anchor, self.globals)


def _syntax_findings(item: Item) -> list[Finding]:
    """The item's syntax problems as findings."""
    return [
        Finding(
            p.code,
            p.message,
            LocalAnchor(item, p.span),
            labels=[Label(LocalAnchor(item, s), t) for s, t in p.labels],
            notes=list(p.notes),
        )
        for p in item.problems
    ]


def _has_errors(items: list[Item], findings: list[Finding]) -> bool:
    """Whether a syntax problem or an error finding is among these (L904 then says nothing: reads
    after an error are not all known)."""
    return any(i.problems for i in items) or any((f.severity or CODES[f.code].severity) == "error" for f in findings)


def _config_key(v):
    """A config argument's identity: its values (ConfigT, ConfigValue), or None for `none`."""
    v = getattr(v, "value", v)
    return v.key() if isinstance(v, ConfigValue) else None


_TYPED_NODES = (
    A.Name,
    A.IntLit,
    A.FloatLit,
    A.StrLit,
    A.BoolLit,
    A.NoneLit,
    A.Neg,
    A.Not,
    A.BinOp,
    A.Compare,
    A.Call,
    A.Attr,
    A.Index,
    A.TupleLit,
    A.ListLit,
    A.IfExpr,
    A.TensorType,
)

# ----------------------------------------------------------------------------- documents


class Document:
    """A `.linnet` source being checked or edited. Keeps items and check results across
    versions; see the module docstring."""

    def __init__(
        self,
        path: str,
        text: str = "",
        std: "StdLib | None | bool" = True,
        is_std: bool = False,
        workspace: Workspace | None = None,
        given: bool = True,
    ):
        """`workspace` is where imports are found (None: a workspace of this document alone,
        reading what it imports from disk); `given` registers the text as the one the
        workspace uses for `path` (False for a file the workspace read from disk)."""
        self.source = Source(path, text)
        self._workspace = workspace
        if workspace is not None and given:
            workspace.add(self)
        self.items: list[Item] = []
        self.is_std = is_std
        self._std = std
        self._results: dict[tuple[Item, Any], ItemResult] = {}
        self._context = None  # (world key, CheckContext) of the last analysis
        self._binding_cache: dict[Item, tuple] = {}
        # modules edited inside one function body since their last check, kept with their nodes (syntax.splice)
        self._body_edits: dict[Item, BodyEdit] = {}
        # item -> (world, preset, ItemAnalysis, _Checked) of its last check, taken as it is while the world is the
        # same object and the item has no body edit (`_check_one`)
        self._checked: dict[Item, tuple] = {}
        # (item, binding key) -> its result for the current text, checked by `analyze_first` ahead of the others
        self._staged: dict[tuple[Item, Any], ItemResult] = {}
        self._last: tuple | None = None  # (analysis, config values by type, items) of the last full `analyze`
        self._replaced: list[Item] = []  # items dropped since the last analysis (cache pruning)
        self._field_atoms = weakref.WeakValueDictionary()  # config fields' dim atoms (ConfigValue.atom)
        self._unread_cache: dict = {}  # what each function reads under each check of the last analysis (unread.py)
        self.last_parsed = 0
        self.version = 0  # counts changes of the text
        self.update(text)

    @property
    def std(self) -> StdLib | None:
        if self._std is True:
            self._std = std_library()
        return self._std or None

    @property
    def text(self) -> str:
        return self.source.text

    @property
    def workspace(self) -> Workspace:
        if self._workspace is None:
            self._workspace = Workspace()
            self._workspace.add(self)
        return self._workspace

    def update(self, text: str) -> None:
        """Replace the text; items whose text is unchanged keep their parse, and a module edited inside one
        function body keeps its other functions' nodes (`_plan_splice`). The new items are parsed first and the change
        made after, under the workspace's `editing` lock: a reader holding it sees this document's text, items and
        their offsets all of one version (the language server's requests, while an analysis runs in a worker)."""
        if self.items and text == self.source.text:
            return
        by_text: dict[str, list[Item]] = {}
        for item in self.items:
            by_text.setdefault(item.text, []).append(item)
        # an editor's keystroke changes a few characters: the line index and the split into items are made from the
        # last ones where they can be (`LineIndex.edited`, `split_items_edited`)
        start, old_end, new_end = changed_range(self.source.text, text)
        chunks = [(item.offset, item.text) for item in self.items]
        entries: list[tuple[int, Item | str]] = []
        for offset, chunk in split_items_edited(chunks, text, start, old_end, new_end):
            reuse = by_text.get(chunk)
            entries.append((offset, reuse.pop(0) if reuse else chunk))
        left = [i for reusable in by_text.values() for i in reusable]  # not reused as they were
        made: list[Item | Splice] = []  # for each chunk not reused: an item parsed now, or an edit of one of `left`
        for offset, entry in entries:
            if isinstance(entry, str):
                # nothing is changed until `_commit`: a check stopped here (its buffer closed: the 5 MB document's
                # parse took 2.5 s, which every other document's check waited for) leaves the document as it was
                pause_point()
                new = self._plan_splice(left, entry)
                if new is None:
                    new = make_item(self.source, offset, entry)
                    new.is_std = self.is_std
                made.append(new)
        index = self.source.index.edited(text, start, old_end, new_end)  # (made before readers wait)
        with self._workspace.editing if self._workspace is not None else contextlib.nullcontext():
            self._commit(text, index, entries, made, left)
        if left:
            # the caches hold entries of the items of the last text only, so what they lose is what this text
            # dropped (rebuilding them on every keystroke was half of a 3,000-line file's update: 2.5 of 5 ms; a
            # fifth of a second of the 5 MB document's, which readers need not wait for: these are this document's)
            dead = set(left)
            self._results = {k: v for k, v in self._results.items() if k[0] not in dead}
            self._binding_cache = {k: v for k, v in self._binding_cache.items() if k not in dead}
            self._body_edits = {k: v for k, v in self._body_edits.items() if k not in dead}
            self._checked = {k: v for k, v in self._checked.items() if k not in dead}

    def _commit(self, text: str, index: LineIndex, entries: list, made: list, left: list[Item]) -> None:
        """`update`'s change, its items parsed: the text, the items at their offsets, the body edits applied."""
        self.version += 1
        self._staged.clear()  # checked for the text before
        self.source.set_text(text, index)
        fresh = iter(made)
        items: list[Item] = []
        for offset, entry in entries:
            if isinstance(entry, str):
                entry = next(fresh)
                entry = self._apply_splice(entry) if isinstance(entry, Splice) else entry
            entry.offset = offset
            items.append(entry)
        self._replaced.extend(left)
        self.items = items
        self.last_parsed = len(made)

    def _plan_splice(self, left: list[Item], chunk: str) -> Splice | None:
        """The edit inside one function body of a module of `left` (not reused; removed from it here) that makes it
        `chunk` (`syntax.splice.plan_splice`: parsed, not applied); None when there is none. Edits of one item made
        between two analyses combine when they are in the same function."""
        name = header_name(chunk)
        for n, old in enumerate(left):
            if old.kind != "module" or old.name != name or name is None:
                continue
            pending = self._body_edits.get(old)
            plan = plan_splice(old, chunk, pending.fn if pending is not None else None)
            if plan is not None:
                del left[n]
            return plan
        return None

    def _apply_splice(self, plan: Splice) -> Item:
        """Make a planned body edit (`_plan_splice`) in place, and move what checks cached of the item's nodes."""
        old = plan.item
        edit = plan.apply()
        for doc in dict.fromkeys([self, *self.workspace.documents()]):  # whose checks may have cached its members
            if doc._context is not None:
                fn_reuse.prune_moved(doc._context[1], {old: edit})
        pending = self._body_edits.get(old)
        if pending is not None:
            edit = BodyEdit(edit.fn, pending.cut, pending.delta + edit.delta)
        self._body_edits[old] = edit
        return old

    def edit(self, start: int, end: int, new_text: str) -> None:
        """Replace characters `start:end` with `new_text`. Raises ValueError for a range
        outside the text."""
        text = self.source.text
        if not 0 <= start <= end <= len(text):
            raise ValueError(f"edit range {start}:{end} is outside the text (0:{len(text)})")
        self.update(text[:start] + new_text + text[end:])

    # ----- analysis
    def analyze_first(self, preset: str | None = None) -> Analysis | None:
        """The first stage of a staged analysis, for the queries that read the selected preset's check of what
        the cursor is in (completion, hover): when the only change since this document's last analysis is an
        edit inside one function body of one module (`_splice`), that module is checked again under the binding
        its queries read first (`preset`'s, else the first preset's, else the defaults'; `Analysis.wanted_scenario`)
        and everything else is taken from the last analysis (what a body edit leaves as it was: the names, the
        configs' values, the other items' checks, the model trees). The next `analyze` of the same text takes
        that result and checks the other bindings. The module is in the analysis's `partial`: a query that would
        read its other checks raises PartialAnalysis. Its diagnostics are the last analysis's: never publish
        them. None when the change since the last analysis is anything else (`analyze` then does it all)."""
        last = self._last
        if last is None or len(self._body_edits) != 1 or self._context is None:
            return None
        previous, values, items = last
        if len(items) != len(self.items) or any(a is not b for a, b in zip(items, self.items)):
            return None  # an item was parsed anew (or dropped): names and values may have changed
        (item,) = self._body_edits
        world, ctx = self._context
        if previous.context is not ctx or previous.partial or item not in previous.items:
            return None
        view = previous.staged_copy()
        view.staged_for = view.wanted_scenario(preset)
        self._check_staged(view, ctx, world, values, view.staged_for, item)
        if item._refs is None:
            item._refs = _item_refs(item)
        view.item_refs[item] = item._refs
        return view

    def analyze(self, preset: str | None = None, only: Callable[[Item], bool] | None = None, jobs: int = 1) -> Analysis:
        """Analyse the current text. `preset` (else the first preset) is the config whose
        numbers a diagnostic quotes when it occurs under several.

        `only(item)` limits the checks to the items it accepts (the language server's first,
        quick pass over a big file: the items an editor shows on opening it). The others are
        not checked, so their findings, types and model tree are missing, never wrong; syntax
        errors, duplicate names and config errors are reported for every item. Their results
        are cached as usual: the full analysis that follows checks only the rest.

        `jobs` > 1: a big file's items are checked in that many processes (`parallel.py`, `linnet check`): the
        same diagnostics, in the same order; the items the workers checked have no results in the analysis (a
        query about one checks it again) and are not cached for the next analysis."""
        analysis = Analysis(self)
        analysis.stats.items_parsed = self.last_parsed
        self.last_parsed = 0
        ns, own_imports = namespaces(self)
        globals_ = ns.by_source[self.source]
        analysis.globals = globals_
        analysis.namespaces = ns
        analysis.imports = own_imports
        evaluator = ConfigEvaluator(globals_, self._field_atoms)
        presets = [i for i in self.items if i.kind == "preset" and i.ast is not None]
        scenarios = evaluator.scenarios(presets, globals_.config_names())
        # every other config a check can name (an imported file's, the standard library's) at its defaults now, not
        # on first use: the values' atoms are then made in one order, whatever is checked first (`--jobs`' shares)
        for item in self._reachable_items(analysis):
            if item.kind == "config" and item.ast is not None and item.source is not self.source:
                evaluator.defaults(item)
        analysis.scenarios = scenarios
        values = values_by_type(scenarios, globals_)
        world, ctx = self._check_context(ns, values, globals_, evaluator)
        analysis.context = ctx
        findings: list[Finding] = list(own_imports.findings)
        for first, dup in globals_.duplicates:
            findings.append(
                Finding(
                    "L105",
                    f"`{dup.name}` is defined twice",
                    LocalAnchor(dup, dup.name_span),
                    labels=[Label(LocalAnchor(first, first.name_span), "first defined here")],
                )
            )
        default_preset = preset or (presets[0].name if presets else None)
        findings.extend(self._check_items(analysis, ctx, world, values, only, default_preset, jobs))
        for item, found in evaluator.findings.items():
            if item.source is self.source:
                findings.extend(found)
        findings.extend(_recursion(analysis))
        pause_point()
        for item in self.items:
            if item.kind == "import":
                analysis.item_refs[item] = own_imports.refs.get(item, [])
                continue
            if item._refs is None:
                item._refs = _item_refs(item)
            analysis.item_refs[item] = item._refs
        findings.extend(self._model_findings(analysis))
        pause_point()
        for item in self.items:
            if item._attribute_findings is None:
                item._attribute_findings = check_attributes(item)
            findings.extend(item._attribute_findings)
        if only is None and not self.is_std and not _has_errors(self.items, findings):
            findings.extend(imported_findings(analysis))
            pause_point()
        if only is None and not self.is_std and not _has_errors(self.items, findings):
            findings.extend(instance_findings(analysis))
            pause_point()
        if only is None and not self.is_std and not _has_errors(self.items, findings):
            findings.extend(unread_findings(analysis, self._unread_cache))
            pause_point()
        analysis.diagnostics = self._diagnostics(findings, globals_)
        # what `analyze_first` starts from: an analysis whose every item is checked here, under every binding
        self._last = (analysis, values, list(self.items)) if only is None and not analysis.remote else None
        return analysis

    def _check_context(
        self, ns: Namespaces, values: dict, globals_: Globals, evaluator: ConfigEvaluator
    ) -> tuple[Any, CheckContext]:
        """The world an analysis checks in and its `CheckContext`: the previous analysis's when the world is
        unchanged (its caches pruned of the items an edit replaced), else a new one."""
        values_key = tuple(
            sorted(
                ((t.source.path, t.name), tuple(v.key() if v is not None else None for v, *_ in vs))
                for t, vs in values.items()
            )
        )
        # Everything an item's check can depend on besides its own text (the interfaces of
        # every file it reaches): when this is unchanged, cached results are valid without
        # looking at their dependencies one by one.
        world = (ns.world(), values_key)
        previous = self._context if self._context is not None and self._context[0] == world else None
        if previous is not None:
            world = previous[0]  # the same object: every cached result then compares by identity
        ctx = CheckContext(globals_, evaluator, previous[1] if previous else None)
        if previous is not None and self._replaced:
            _prune_caches(ctx, self._replaced)
        if previous is not None and (self._replaced or self._body_edits):
            # an item edited in place (`_splice`) is the same object: its followed entries go by it too
            _prune_followed(ctx, [*self._replaced, *self._body_edits])
        self._replaced = []
        self._context = (world, ctx)
        return world, ctx

    def _check_items(
        self,
        analysis: Analysis,
        ctx: CheckContext,
        world: Any,
        values: dict,
        only: Callable[[Item], bool] | None,
        preset: str | None,
        jobs: int = 1,
    ) -> list[Finding]:
        """Check each module and function (those `only` accepts) once per binding of its config parameters,
        reusing a cached result where it is still valid; record them in `analysis` (items, model trees,
        stats) and return their findings, merged across bindings (quoting `preset`'s numbers). With `jobs` > 1,
        a big file's items are shared among forked workers (`parallel.py`); what a worker checked is in
        `analysis.remote` (its findings and calls), not in `analysis.items`, and is not cached."""
        remote: dict[Item, _Checked] = {}  # the items checked ahead, in parallel
        if jobs > 1 and parallel.can_fork() and only is None:
            todo = [item for item in self.items if item.ast is not None and item.kind in ("module", "fn")]
            remote = self._check_remote(analysis, ctx, world, values, preset, todo, jobs)
        findings: list[Finding] = []
        previous_unclosed = False
        for item in self.items:
            unclosed = any(p.code == "L003" and p.message == "unclosed `{`" for p in item.problems)
            if item.ast is None or item.kind not in ("module", "fn") or (only is not None and not only(item)):
                previous_unclosed = unclosed
                continue
            done = remote.get(item)
            if done is None:
                done = self._check_one(analysis, ctx, world, values, preset, item, record=True)
            elif item in analysis.remote and _is_model(item):
                # its model tree and full results (the unread-parameters walk) are wanted here; the worker's
                # findings stand (checked in the file's order, with the cache entries one process would have)
                done = replace(
                    done,
                    checks_run=done.checks_run
                    + self._check_one(analysis, ctx, world, values, preset, item, record=True).checks_run,
                )
            analysis.stats.checks_run += done.checks_run
            if done.checks_run:
                analysis.stats.items_checked += 1
                analysis.stats.checked_names.append(item.name)
            merged = done.findings
            if previous_unclosed:
                # This item likely belongs inside the one above, whose `{` never closed (a
                # column-0 `fn` inside a module): names from there are not news.
                merged = [f for f in merged if f.code not in ("L101", "L102")]
            findings.extend(merged)
            previous_unclosed = unclosed
        return findings

    def _check_one(
        self,
        analysis: Analysis,
        ctx: CheckContext,
        world: Any,
        values: dict,
        preset: str | None,
        item: Item,
        record: bool,
        results: dict | None = None,
    ) -> "_Checked":
        """Check `item` under each of its bindings (a cached result where still valid); `record`: keep what was
        found in `analysis` (items, model trees) and in this document's cache (a worker keeps nothing); `results`:
        where to put its (scenario names, result) pairs (a worker's, for `imported.item_findings`)."""
        ns, globals_ = analysis.namespaces, analysis.globals
        edit = self._body_edits.get(item)
        memo = self._checked.get(item) if record and edit is None else None
        if memo is not None and memo[0] is world and memo[1] == preset:
            # nothing it depends on changed since its last check (the same world object: the interfaces and config
            # values it reads; the same item, unedited), so every binding's cached result stands, and so do their
            # merged findings: a 3,000-line file's untouched items took 4.5 ms of each keystroke's check to
            # validate one by one
            ia, done = memo[2], memo[3]
            analysis.items[item] = ia
            self._record_trees(analysis, ia)
            return _Checked(done.findings, done.calls, 0)
        ia = ItemAnalysis(item)
        checks_run = 0
        checked = set()  # the binding keys checked now
        for binding, key, names in self._bindings(item, values, world, globals_):
            pause_point()
            checked.add(key)
            cached = self._results.get((item, key))
            staged = self._staged.pop((item, key), None) if edit is not None else None
            if staged is not None and staged.world is world:  # checked for this text by `analyze_first`
                result = staged
                if record:
                    self._results[(item, key)] = result
                checks_run += 1
            elif cached is not None and (cached.world == world or self._valid(cached, ns)):
                result = cached
                if edit is not None:  # its nodes are kept but for one function's body: that one is checked again
                    result = fn_reuse.recheck_body(ctx, item, binding, cached, edit, ItemChecker)
                    result = result if result is not None else _check_item(ctx, item, binding)
                    if record:
                        self._results[(item, key)] = result
                    checks_run += 1
                result.world = world
            else:
                result = _check_item(ctx, item, binding)
                result.world = world
                if record:
                    self._results[(item, key)] = result
                checks_run += 1
            ia.results.append((names, result))
            ia.bindings.append(binding)
        calls = ia.results[0][1].calls if ia.results else []
        done = _Checked(_merge(ia, preset), calls, checks_run)
        if results is not None:
            results[item] = ia.results
        if record:
            self._record_trees(analysis, ia)
            analysis.items[item] = ia
            if self._body_edits.pop(item, None) is not None:  # results under bindings not checked now are stale
                for stale in [k for k in self._results if k[0] is item and k[1] not in checked]:
                    del self._results[stale]
            self._checked[item] = (world, preset, ia, done)
        return done

    def _keep_fresh(self, ctx: CheckContext, item: Item, binding: dict, stale: ItemResult, fresh: ItemResult) -> None:
        """Keep `fresh`, `item`'s check under `binding` made again by an analysis because the check it reused
        (`stale`) names items an edit has replaced since (`Analysis._current`), for the next analyses in place of
        `stale`: kept, `stale` would be reused by each of them, and each lowering would check it again, until an
        edit of `item` itself. Only from this document's latest analysis (`ctx`), whose caches these are. Entries
        are replaced, none added: a lowering on the language server's event loop may run while a worker thread
        analyses the document (a big file's first items); the analysis that made `fresh` keeps its own results."""
        if self._context is None or self._context[1] is not ctx:
            return
        key = (item, _binding_key(binding))
        if self._results.get(key) is not stale:
            return
        fresh.world = stale.world
        self._results[key] = fresh
        memo = self._checked.get(item)
        if memo is not None and any(r is stale for _, r in memo[2].results):
            ia = memo[2]
            results = [(names, fresh if r is stale else r) for names, r in ia.results]
            self._checked[item] = (*memo[:2], ItemAnalysis(item, results, ia.bindings), *memo[3:])

    def _check_staged(
        self, analysis: Analysis, ctx: CheckContext, world: Any, values: dict, wanted: str, item: Item
    ) -> "_Checked":
        """`item`, edited inside one function body, checked under the one binding that queries of `wanted` read
        first (`Analysis._results_of`: the first whose scenarios hold `wanted`, else the first), kept for the next
        `analyze` (`_staged`); the edit stays pending for the other bindings. The item goes in `analysis.partial`."""
        ns, globals_ = analysis.namespaces, analysis.globals
        bindings = self._bindings(item, values, world, globals_)
        binding, key, names = next((b for b in bindings if b[2] is None or wanted in b[2]), bindings[0])
        result = self._staged.get((item, key))
        if result is None or result.world is not world:
            cached = self._results.get((item, key))
            result = None
            if cached is not None and (cached.world == world or self._valid(cached, ns)):
                result = fn_reuse.recheck_body(ctx, item, binding, cached, self._body_edits[item], ItemChecker)
            result = result if result is not None else _check_item(ctx, item, binding)
            result.world = world
            self._staged[(item, key)] = result
        ia = ItemAnalysis(item, [(names, result)], [binding])
        analysis.items[item] = ia
        analysis.partial.add(item)
        self._record_trees(analysis, ia)
        return _Checked(list(result.findings), result.calls, 1)

    @staticmethod
    def _record_trees(analysis: Analysis, ia: ItemAnalysis) -> None:
        """The model trees of `ia`'s checks, by the scenario names each was checked under (the first wins)."""
        for names, result in ia.results:
            tree = getattr(result, "tree", None)
            if tree is not None:
                for n in names or ["defaults"]:
                    analysis.trees.setdefault(n, tree)

    def _check_remote(
        self,
        analysis: Analysis,
        ctx: CheckContext,
        world: Any,
        values: dict,
        preset: str | None,
        todo: list[Item],
        jobs: int,
    ) -> "dict[Item, _Checked]":
        """`todo`'s items checked ahead: a head of them here, then the rest in shares, the first share here and
        the others in forked workers (`parallel.py`); what each check found, by item. A check's findings do not
        depend on what was checked before it in the process (the caches' entries are the same whichever check
        made them: see `parallel.py`), so each share's are those one process finds. When a worker failed, no
        worker's items are returned (nor where a worker's checks reported a config finding: see `work`):
        `_check_items` then checks them here, in order, as one process does."""
        own = {name: i for name, i in analysis.globals.by_name.items() if i.source is self.source}
        cuts = parallel.independent_cuts(todo, own)
        head = int(len(todo) * parallel.WARM_SHARE)  # then on to where a share may start (a whole first part)
        head = next((p for p in range(max(head, 1), len(todo)) if cuts[p]), len(todo)) if head else 0
        warm = todo[:head]
        runs = parallel.shares(todo[head:], jobs, cuts[head:])
        if len(runs) < 2:
            return {}
        out = {item: self._check_one(analysis, ctx, world, values, preset, item, record=True) for item in warm}

        def work(share: list[Item]):
            reported = ctx.evaluator._count()
            results: dict[Item, list] = {}
            checked = {i: self._check_one(analysis, ctx, world, values, preset, i, False, results) for i in share}
            # what the imported modules these checks build find (their results stay here); after the share's own
            # checks, as one process finds them after all of its own
            verdicts: dict = {}
            for item, done in checked.items():
                done.imported = imported_item_findings(analysis, item, results[item], verdicts)
            # every config a check reads was evaluated before the fork (`analyze`), so a check reports nothing
            # through the evaluator; a finding one did report would stay in this worker: the parent checks instead
            return checked if ctx.evaluator._count() == reported else None

        with parallel.Forked(runs[1:], work, list(dict.fromkeys(self._reachable_items(analysis)))) as workers:
            out.update(
                {item: self._check_one(analysis, ctx, world, values, preset, item, record=True) for item in runs[0]}
            )
            results = workers.collect()
        if any(value is None for value in results):
            return out  # every worker's share is checked here, in order
        for checked in results:
            out.update(checked)
            analysis.remote.update(checked)
        return out

    def _reachable_items(self, analysis: Analysis):
        """Every item a finding can anchor in: this file's, every file's it reaches, the standard library's."""
        yield from self.items
        for doc in analysis.namespaces.files if analysis.namespaces is not None else ():
            yield from doc.items
        if self.std is not None:
            yield from self.std.items

    def _model_findings(self, analysis: Analysis) -> list[Finding]:
        """Set `analysis.model` to the file's root `model`, the first one; the others are findings (L110)."""
        models = [i for i in self.items if i.kind == "module" and isinstance(i.ast, A.ModuleDef) and i.ast.is_model]
        if not models:
            return []
        analysis.model = models[0]
        return [
            Finding(
                "L110",
                "a file declares at most one root `model`",
                LocalAnchor(extra, extra.name_span),
                labels=[Label(LocalAnchor(models[0], models[0].name_span), "the first one")],
                notes=["make the others `module`s"],
            )
            for extra in models[1:]
        ]

    def _diagnostics(self, findings: list[Finding], globals_: Globals) -> list[Diagnostic]:
        """The items' syntax problems and `findings` located in their files, duplicates dropped, in the
        order of their positions (this file's first)."""
        diagnostics = []
        for item in self.items:
            for f in _syntax_findings(item):
                d = locate(f, lambda a: self.resolve(a, globals_))
                if d is not None:
                    diagnostics.append(d)
        seen = set()
        for f in findings:
            d = locate(f, lambda a: self.resolve(a, globals_))
            if d is None:
                continue
            key = (d.code, d.location.start.offset, d.location.end.offset, d.message)
            if key in seen:
                continue
            seen.add(key)
            diagnostics.append(d)
        diagnostics.sort(key=lambda d: (d.location.path != self.source.path, d.location.start.offset, d.code))
        return diagnostics

    def _valid(self, result: ItemResult, ns: Namespaces) -> bool:
        """Whether every name the result looked up (in its file's namespace) still names an
        item with the same interface."""
        for (path, name), iface in result.deps.items():
            globals_ = ns.by_path.get(path)
            if globals_ is None:
                return False
            if name == NAMES_DEP:
                if iface != globals_.names_key():
                    return False
                continue
            item = globals_.by_name.get(name)
            if (item.interface if item is not None else None) != iface:
                return False
        return True

    def _bindings(
        self, item: Item, values: dict, key, globals_: Globals
    ) -> list[tuple[dict[str, Type], Any, list[str] | None]]:
        """The config bindings to check `item` under: one per distinct value of its config
        parameters across the scenarios (plain items: one, with no config). `key` stands for
        the values and the names that find the configs."""
        cached = self._binding_cache.get(item)
        if cached is not None and cached[0] == key:
            return cached[1]
        out = self._compute_bindings(item, values, globals_)
        self._binding_cache[item] = (key, out)
        return out

    def _compute_bindings(self, item: Item, values: dict, globals_: Globals):
        ast = item.ast
        params = ast.params
        slots = []
        for p in params:
            t = p.type
            if not isinstance(t, A.NamedType) or t.name.id in ("int", "float", "bool", "str"):
                continue
            config = globals_(t.name.id)
            options = values.get(config, []) if config is not None else []
            if not t.optional:
                options = [o for o in options if o[0] is not None]
            if not options:
                continue
            slots.append((p.name.id, options))
        if not slots:
            return [({}, (), None)]
        out = []
        for combo in itertools.product(*[options for _, options in slots]):
            binding: dict[str, Type] = {}
            names: list[str] = []
            owned: set[str] = set()
            for (pname, _), (value, scen, own) in zip(slots, combo):
                binding[pname] = ConfigT(value) if isinstance(value, ConfigValue) else NONE
                if names:
                    in_scen = set(scen)
                    names = [n for n in names if n in in_scen] or names + scen
                else:
                    names = scen
                owned |= own
            # the scenarios that give the item these values: not a preset that holds them only as other configs'
            # defaults (a module taking `VisionConfig`, under `VisionConfig`'s defaults, and presets of a config
            # whose `vision` field is another `VisionConfig`: its findings there are not the presets')
            names = _among(names, owned) or names
            out.append((binding, _binding_key(binding), names))
        return out

    # ----- anchors
    def resolve(self, anchor, globals_: Globals | None) -> Location | None:
        if isinstance(anchor, LocalAnchor):
            return anchor.item.resolve(anchor.span)
        if isinstance(anchor, SymbolAnchor) and globals_ is not None:
            found = find_symbol(anchor, globals_, self.workspace)
            if found is not None:
                item, span = found
                return item.resolve(span)
        return None


def _among(names: list[str], kept: set[str]) -> list[str]:
    """The scenario names of `names` (distinct) that are in `kept`, in `names`' order. The config defaults' binding
    of a file of many configs runs under thousands of scenarios and keeps one or two: those are looked up in `names`
    (the 5 MB document: a filter over 2,280 names for each of its 2,850 items' default bindings, 5 % of the check)."""
    if len(kept) * 16 > len(names):
        return [n for n in names if n in kept]
    return sorted((n for n in kept if n in names), key=names.index)


def _binding_key(binding: dict[str, Type]) -> tuple:
    """The key of an item's check under `binding` in `Document._results`: each config parameter's value, and where
    its values came from too (a result's labels point there: `the value 8 of d` at the preset that sets it, not at
    an equal default that an earlier version's shared binding took)."""
    return tuple(
        (name, (t.value.key(), t.value.origins_key()) if isinstance(t, ConfigT) else None)
        for name, t in binding.items()
    )


@dataclass
class _Checked:
    """What the rest of an analysis needs of one item's checks: its findings merged across bindings, the calls
    of its first binding's check (`_recursion`), and how many checks ran (not cached)."""

    findings: list[Finding]
    calls: list
    checks_run: int
    imported: list[Finding] | None = None  # a worker's: what the modules it builds of other files find (imported.py)


def _is_model(item: Item) -> bool:
    return isinstance(item.ast, A.ModuleDef) and item.ast.is_model


def _prune_caches(ctx: CheckContext, replaced: list[Item]) -> None:
    """Drop cached members and signatures of items an edit replaced. Their keys hold the old
    `Item` (or its function nodes), so they are never hit again; kept, they would grow the
    server's memory with every edit. The entries are found through `ctx.cache_keys`: filtering
    every entry took a tenth of an edit's analysis of a 3,000-line file. The caches are copied,
    not changed in place: an earlier analysis (a hover on the version before) keeps its own."""
    keys = dict(ctx.cache_keys)
    caches = {"members": dict(ctx.members_cache), "signatures": dict(ctx.signatures)}
    for item in dict.fromkeys(replaced):
        for cache, key in keys.pop(item, ()):
            caches[cache].pop(key, None)
    ctx.cache_keys, ctx.members_cache, ctx.signatures = keys, caches["members"], caches["signatures"]


def _prune_followed(ctx: CheckContext, gone: list[Item]) -> None:
    """Drop the entries of the model's `follow` check (instances.py) that read an item an edit replaced or
    changed in place. Each holds the set of items it read: filtered by it (a few hundred entries), rather than
    indexed under each; copied, as `_prune_caches` does."""
    gone_items = set(gone)
    ctx.followed = {key: entry for key, entry in ctx.followed.items() if not (entry[1] & gone_items)}


def _check_item(ctx: CheckContext, item: Item, binding: dict[str, Type]) -> ItemResult:
    """Check one item under one binding. A bug in the checker becomes a diagnostic on the
    item (L000), never an exception: a malformed source must not take a client down."""
    result = ItemResult()
    try:
        with deep_recursion():
            ItemChecker(ctx, item, binding, result).run()
            if isinstance(item.ast, A.ModuleDef) and item.ast.is_model:
                result.tree = check_model(ItemChecker(ctx, item, binding, result), item)  # type: ignore[attr-defined]
                result.segments = None  # the model's checks come after its parts (never re-checked in parts)
    except RecursionError:
        result = ItemResult(
            findings=[
                Finding(
                    "L000",
                    "this item nests too deeply to check",
                    LocalAnchor(item, item.name_span),
                    notes=[f"more than about {RECURSION_LIMIT // 20} levels of nested expressions or modules"],
                )
            ]
        )
    except Exception as err:  # noqa: BLE001 - the checker must not raise on any input
        result = ItemResult(
            findings=[
                Finding(
                    "L000",
                    f"internal error while checking `{item.name}`: {type(err).__name__}: {err}",
                    LocalAnchor(item, item.name_span),
                    notes=["this is a bug in Linnet; please report it with this file"],
                )
            ]
        )
    return result


def _recursion(analysis: "Analysis") -> list[Finding]:
    """Functions that call themselves, directly or through others. The compiler inlines
    every call into straight-line code, so a call cycle has no meaning. One finding per cycle
    (strongly connected component of the call graph, Tarjan's algorithm, iterative)."""
    edges: dict[tuple, list[tuple[tuple, Item, Span]]] = {}
    for item in analysis.document.items:  # the items' order, whichever process checked them
        ia = analysis.items.get(item)
        calls = ia.results[0][1].calls if ia is not None and ia.results else ()
        if item in analysis.remote:
            calls = analysis.remote[item].calls
        for caller, callee, span in calls:
            edges.setdefault(caller, []).append((callee, item, span))
    # only functions checked here can close a cycle (the standard library calls no user code)
    edges = {k: [e for e in v if e[0] in edges] for k, v in edges.items()}
    edges = {k: v for k, v in edges.items() if v}
    if not edges:
        return []
    index: dict[tuple, int] = {}
    low: dict[tuple, int] = {}
    on_stack: set[tuple] = set()
    stack: list[tuple] = []
    components: list[list[tuple]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            succ = edges.get(node, ())
            if i < len(succ):
                work.append((node, i + 1))
                nxt = succ[i][0]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                components.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    out = []
    for component in components:
        first = min(component)
        if len(component) == 1 and not any(callee == first for callee, _, _ in edges.get(first, ())):
            continue  # a single function that does not call itself
        members = set(component)
        calls = [(callee, item, span) for callee, item, span in edges.get(first, ()) if callee in members]
        order = [first]
        while calls and calls[0][0] != first and len(order) < len(members):
            order.append(calls[0][0])
            calls = [c for c in edges.get(order[-1], ()) if c[0] in members] or calls
        names = " -> ".join(".".join(p for p in part[1:] if p != "fn") for part in order + [first])
        _, item, span = next(c for c in edges[first] if c[0] in members)
        out.append(
            Finding(
                "L111",
                f"recursive call: {names}",
                LocalAnchor(item, span),
                notes=["calls are inlined when compiling: they cannot cycle"],
            )
        )
    return out


def _merge(ia: ItemAnalysis, preferred: str | None) -> list[Finding]:
    """Findings of all bindings of one item, each once, naming the configs it occurs under
    when that is not all of them. A finding's message is taken from the `preferred` config
    (the first preset, as hover does) when it occurs there; where the message differs under
    another config it occurs under (the sizes a shape error quotes), a note says whose values
    it shows, so that one config's numbers are not read as every config's."""
    if len(ia.results) == 1:
        return list(ia.results[0][1].findings)
    # Which bindings each finding occurs under, as indices: the scenario names are gathered only for the findings
    # that do not occur under all of them (a binding of a file's config defaults runs under every other config's
    # presets too: thousands of names, which each finding copied once per binding).
    occurrences: dict[Any, tuple[Finding, list[int]]] = {}
    differs: set[Any] = set()  # keys whose message is not the same under every binding it occurs under
    results = sorted(ia.results, key=lambda r: 0 if preferred and r[0] and preferred in r[0] else 1)
    for index, (_, result) in enumerate(results):
        for f in result.findings:
            key = (f.code, f.key()[1])
            found = occurrences.get(key)
            if found is None:
                occurrences[key] = (f, [index])
            elif found[1][-1] != index:
                found[1].append(index)
                if f.message != found[0].message:
                    differs.add(key)
    total = len(ia.results)
    out = []
    for key, (f, where) in occurrences.items():
        scen = (
            tuple(dict.fromkeys(n for index in where for n in (results[index][0] or [])))
            if len(where) < total
            else f.scenarios
        )
        notes = f.notes
        if key in differs:
            whose = _scenarios_text(results[where[0]][0])
            notes = [*f.notes, f"the values in this message are those under {whose}; they differ under the others"]
        if scen is not f.scenarios or notes is not f.notes:
            f = Finding(f.code, f.message, f.anchor, f.label, f.labels, notes, f.fixes, f.severity, scen)
        out.append(f)
    return out


def _scenarios_text(names: list[str] | None, shown: int = 2) -> str:
    """`names` (a binding's scenarios: presets, `defaults` for the config defaults) as a note names them: the
    first `shown`, then how many more."""
    names = names or ["defaults"]
    # only the names shown are formatted: the config defaults' binding of a file of many presets runs under every
    # preset of the other configs (2,851 names in the 5 MB document of issue 45, for each of its 1,140 notes)
    named = [("the config defaults" if n == "defaults" else f"`{n}`") for n in names[: shown + 1]]
    if len(names) <= shown + 1:
        return ", ".join(named)
    return f"{', '.join(named[:shown])} and {len(names) - shown} more with the same values"


def _only_check(pair: tuple, item: Item):
    """The one check of a `partial` item, then PartialAnalysis: a query that would go on to the item's next check
    (the full analysis's `results_for`) cannot be answered from a staged analysis."""
    yield pair
    raise PartialAnalysis(f"{item.name} is checked under one binding only")


def _in_branch(tree: A.Node | None, at: int | None) -> bool:
    """Whether item-relative offset `at` is inside a compile-time `if` of `tree` (an expression, or members
    declared under one; None: anywhere in `tree`), which a check walks only where its config takes it."""
    if tree is None:
        return False
    nodes = A.walk(tree) if at is None else A.node_at(tree, at)
    return any(isinstance(n, (A.IfExpr, A.MemberIf)) for n in nodes)


def _item_refs(item: Item) -> list[tuple[Span, Any]]:
    """Names that need no checking to resolve: item names, config fields, preset field inits."""
    ast = item.ast
    if ast is None or isinstance(ast, A.ImportDef):
        return []
    refs: list[tuple[Span, Any]] = [(ast.name.span, SymbolAnchor((ast.name.id,)))]
    if isinstance(ast, A.ConfigDef):
        for f in ast.fields:
            if isinstance(f, A.ConfigField):
                refs.append((f.name.span, SymbolAnchor((ast.name.id, f.name.id))))
                if isinstance(f.type, A.NamedType):
                    refs.append((f.type.name.span, SymbolAnchor((f.type.name.id,))))

    def record(rec: A.RecordLit):
        refs.append((rec.type_name.span, SymbolAnchor((rec.type_name.id,))))
        for init in rec.fields:
            if isinstance(init, A.FieldInit):
                refs.append((init.name.span, SymbolAnchor((rec.type_name.id, init.name.id))))
                if isinstance(init.value, A.RecordLit):
                    record(init.value)

    if isinstance(ast, A.PresetDef):
        record(ast.value)
    if isinstance(ast, A.ConfigDef):
        for f in ast.fields:
            if isinstance(f, A.ConfigField) and isinstance(f.default, A.RecordLit):
                record(f.default)
    return refs


def find_symbol(
    anchor: SymbolAnchor, globals_: Globals, workspace: Workspace | None = None
) -> tuple[Item, Span] | None:
    """The definition a `SymbolAnchor` names: (its item, the span of its name, item-relative), or
    None when no such definition exists (any more). Found by the analysed file's names
    (`globals_`), or, for an anchor that names its file, in that file (among the files the
    analysis reached, else the workspace's). Paths: `(item,)`, `(config, field)`,
    `(preset, field, ...)`, `(module, "param", name)`, `(module, "member" | "fn", name)`,
    `(module, "fn", name, "param", name)`, `(fn, "param", name)`."""
    path = anchor.path
    item = globals_.anchor_item(anchor)
    if item is None and anchor.file and workspace is not None:
        doc = workspace.loaded(anchor.file)  # (read nothing: a request's reader may be on another thread than analyses)
        item = next((i for i in doc.items if i.name == path[0]), None) if doc is not None else None
    if item is None or item.ast is None:
        return None
    node = item.ast
    if len(path) == 1:
        return item, node.name.span
    rest = path[1:]
    if isinstance(node, A.ConfigDef):
        for f in node.fields:
            if isinstance(f, A.ConfigField) and f.name.id == rest[0]:
                return item, f.name.span
        return None
    if isinstance(node, A.PresetDef):
        record = node.value
        target = None
        for name in rest:
            found = None
            for init in record.fields if record is not None else []:
                if isinstance(init, A.FieldInit) and init.name.id == name:
                    found = init
            if found is None:
                return (item, target.span) if target is not None else (item, node.name.span)
            target = found
            record = found.value if isinstance(found.value, A.RecordLit) else None
        return item, target.span
    if isinstance(node, A.ModuleDef):
        kind = rest[0]
        if kind == "param" and len(rest) == 2:
            for p in node.params:
                if p.name.id == rest[1]:
                    return item, p.name.span
            return None
        members = list(A.flat_members(node.members))
        if kind in ("member", "fn"):
            for m in members:
                if getattr(m, "name", None) is not None and m.name.id == rest[1]:
                    if len(rest) == 4 and rest[2] == "param" and isinstance(m, A.FnDef):
                        for p in m.params:
                            if p.name.id == rest[3]:
                                return item, p.span
                        return None
                    return item, m.name.span
        return None
    if isinstance(node, A.FnDef):
        if rest[0] == "param":
            for p in node.params:
                if p.name.id == rest[1]:
                    return item, p.span
        return None
    return None
