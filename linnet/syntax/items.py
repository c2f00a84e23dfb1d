"""Splitting a source into top-level items, and the item-level reuse behind incremental parsing.

An item starts at a line that begins, in column 0, with `config`, `preset`, `module`,
`model`, `fn` or `from` (an import); the `##`/`#` comment and `@attribute` lines directly
above it belong to it (an attribute may continue over indented lines up to a `)` line).
Items partition the text exactly: an item runs to the start of the next one. The rule needs
no parse, so one malformed item cannot swallow its neighbours, and an edit touches only the
items whose text it changes.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field

from . import ast as A
from .ast import Span
from .parser import ParsedItem, SyntaxProblem, parse_item
from .positions import LineIndex, Position, lexable, split_lines

ITEM_KEYWORDS = ("config", "preset", "module", "model", "fn", "from", "import")
_HEADER = re.compile(r"^(config|preset|module|model|fn|from|import)\b[ \t]*([A-Za-z_]\w*)?", re.M)


class Source:
    """One source text (a file or an editor buffer) and its line index. Mutable: a document
    updates it in place, and items point at it to resolve their positions."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.set_text(text)

    def set_text(self, text: str, index: LineIndex | None = None) -> None:
        """Replace the text; `index`: its line index, when the caller has it (`LineIndex.edited`)."""
        self.text = text
        self.index = index if index is not None else LineIndex(text)

    def __repr__(self) -> str:
        return f"Source({self.path!r})"


@dataclass(slots=True)
class Location:
    """A span resolved in its source: absolute character offsets and both positions."""

    path: str
    start: Position
    end: Position

    @property
    def line(self) -> int:
        return self.start.line

    @property
    def column(self) -> int:
        return self.start.column


@dataclass(eq=False)
class Item:
    """A top-level item of a source: its text, where it starts, and what parsing found.

    `ast` is None when nothing could be recovered; `kind` and `name` then still come from the
    header line so that references to the item are not reported as unknown. An import
    (`kind` "import") has no name: the names it binds are in its `ImportDef`.
    """

    source: Source
    offset: int
    text: str
    kind: str | None
    name: str | None
    ast: A.ItemDef | None
    problems: list[SyntaxProblem]
    is_std: bool = False
    interface: str = field(default="")
    # what analyses derive from the item's text alone, computed once (semantics.program)
    _refs: list | None = field(default=None, repr=False)
    _attribute_findings: list | None = field(default=None, repr=False)
    _config_names: frozenset | None = field(default=None, repr=False)  # `config_names(ast)`, kept by a body splice

    def resolve(self, span: Span) -> Location:
        index = self.source.index
        return Location(
            self.source.path, index.position(self.offset + span.start), index.position(self.offset + span.end)
        )

    def absolute(self, span: Span) -> tuple[int, int]:
        return self.offset + span.start, self.offset + span.end

    @property
    def name_span(self) -> Span:
        if isinstance(self.ast, A.ImportDef):
            return self.ast.source.span
        if self.ast is not None:
            return self.ast.name.span
        m = _HEADER.search(self.text)
        if m and m.group(2):
            return Span(m.start(2), m.end(2))
        return Span(0, 0)

    def __repr__(self) -> str:
        return f"Item({self.kind} {self.name} @{self.offset})"


def split_items(text: str) -> list[tuple[int, str]]:
    """Split `text` into `(offset, item_text)` chunks that partition it exactly. A leading
    chunk with no item header (comments, or stray text) is included when non-empty. Lines end
    at `\n`, `\r\n` or a lone `\r` (`positions.LINE_BREAK`)."""
    whole, text = text, lexable(text)
    starts = []
    for m in _HEADER.finditer(text):
        s = m.start()
        while s > 0:
            prev = text.rfind("\n", 0, s - 1) + 1
            if text.startswith(("#", "@"), prev):
                s = prev
            elif text.startswith((" ", "\t", ")"), prev) and _attribute_above(text, prev) is not None:
                s = _attribute_above(text, prev)  # the continuation lines of a multi-line `@inert(...)`
            else:
                break
        if starts and s <= starts[-1]:
            s = m.start()
        starts.append(s)
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    bounds = starts + [len(text)]
    return [
        (bounds[i], whole[bounds[i] : bounds[i + 1]])
        for i in range(len(starts))
        if bounds[i + 1] > bounds[i] or len(starts) == 1
    ]


def split_items_edited(chunks: list[tuple[int, str]], text: str, start: int, old_end: int, new_end: int):
    """`split_items(text)`, where `text` is the text split into `chunks` with characters `start:old_end` replaced by
    `text[start:new_end]` (`positions.changed_range`): the old chunks, the edited one's text replaced and those after
    it moved, when the edit is inside one item, after its header line and before its last line, adds no header
    line, and that last line is one the next item's header never takes in (it starts with none of `#`, `@`, a space,
    a tab or `)`): then every header and every line a header takes in above it are as they were. Else
    `split_items(text)`. Splitting a 3,000-line file anew took ~0.9 ms of each keystroke's first stage."""
    found = _edited_chunks(chunks, text, start, old_end, new_end)
    return found if found is not None else split_items(text)


def _edited_chunks(
    chunks: list[tuple[int, str]], text: str, start: int, old_end: int, new_end: int
) -> list[tuple[int, str]] | None:
    if "\r" in text:  # (lexable: a lone `\r` would count as a line break)
        return None
    k = bisect_right(chunks, start, key=lambda chunk: chunk[0]) - 1
    if k < 0:
        return None
    offset, chunk = chunks[k]
    end = offset + len(chunk)
    header = _HEADER.search(chunk)
    if header is None or old_end > end:
        return None
    first_end = chunk.find("\n", header.start())  # the header line's break
    last = chunk.rfind("\n", 0, len(chunk) - 1) + 1  # the last line's start
    if first_end < 0 or not offset + first_end < start or not old_end < offset + last:
        return None
    if chunk.startswith(("#", "@", " ", "\t", ")"), last):
        return None
    delta = new_end - old_end
    if _HEADER.search(text, offset + first_end + 1, offset + last + delta) is not None:
        return None
    edited = (offset, text[offset : end + delta])
    return chunks[:k] + [edited] + [(o + delta, c) for o, c in chunks[k + 1 :]]


def names_after(text: str, start: int) -> set[str]:
    """The names of the items whose header lines start at or after `start` (a line start), read from the headers
    alone: no parse."""
    return {m.group(2) for m in _HEADER.finditer(lexable(text), start) if m.group(2) and m.group(1) != "from"}


def _attribute_above(text: str, line_start: int) -> int | None:
    """The start of the `@name(` line that an indented or `)` line at `line_start` continues (the
    lines between are indented too), or None."""
    s = line_start
    while s > 0:
        s = text.rfind("\n", 0, s - 1) + 1
        if text.startswith("@", s):
            return s if "(" in text[s : text.find("\n", s)] else None
        if not text.startswith((" ", "\t"), s):
            return None
    return None


def header_name(text: str) -> str | None:
    """The name an item's header line gives (None for an import or text without a header): no parse."""
    return _header(lexable(text))[1]


def _header(text: str) -> tuple[str | None, str | None]:
    m = _HEADER.search(text)
    if not m:
        return None, None
    if m.group(1) in ("from", "import"):
        return m.group(1), None
    return m.group(1), m.group(2)


def make_item(source: Source, offset: int, text: str, parsed: ParsedItem | None = None) -> Item:
    """Parse `text` (unless `parsed` is given) into an Item of `source` at `offset`."""
    kind, name = _header(lexable(text))
    if kind is None:
        pos = 0
        for line in split_lines(text, keepends=True):
            code = line.strip()
            if code and not code.startswith("#"):
                start = pos + len(line) - len(line.lstrip())
                problem = SyntaxProblem(
                    "L004",
                    "expected an item: `config`, `preset`, `module`, `model`, `fn` or `from` at the start of a line",
                    Span(start, start + len(code.split()[0])),
                    [],
                    ["items start in column 0; indented lines belong to the item above"],
                )
                return Item(source, offset, text, None, None, None, [problem])
            pos += len(line)
        return Item(source, offset, text, None, None, None, [])
    if kind == "import":
        return _bare_import(source, offset, text)
    if parsed is None:
        parsed = parse_item(text)
    if kind == "model":
        kind = "module"
    elif kind == "from":
        kind = "import"
    ast = parsed.ast
    if ast is not None and _AST_KIND.get(type(ast)) != kind:
        ast = None  # recovery skipped the header and found another item's shape: keep only the errors
    item = Item(source, offset, text, kind, name, ast, parsed.problems)
    if ast is not None and not isinstance(ast, A.ImportDef):
        item.name = ast.name.id
    item.interface = interface_key(item)
    return item


_AST_KIND = {A.ConfigDef: "config", A.PresetDef: "preset", A.ModuleDef: "module", A.FnDef: "fn", A.ImportDef: "import"}


def _bare_import(source: Source, offset: int, text: str) -> Item:
    """`import "llama.linnet"` (Python's and TypeScript's whole-module form), which Linnet does
    not have: an error that shows the form it has."""
    start = len(text) - len(text.lstrip())
    start += text[start:].find("import")
    line = split_lines(text[start:])[0]
    quoted = re.search(r'"[^"\n]*"', line)
    path = quoted.group(0) if quoted else '"file.linnet"'
    problem = SyntaxProblem(
        "L001",
        "a file's items are imported by name",
        Span(start, start + len("import")),
        [],
        [f"consider `from {path} import Name, Other as Alias`"],
    )
    return Item(source, offset, text, "import", None, None, [problem])


# The return types whose value a caller takes from the function's body (semantics/fn_values.py), alone or in a
# tuple (`-> (int, int)`, tuples of tuples too: `returns_value`); a `str` also as a union of literals.
VALUE_RETURNS = frozenset({"int", "bool", "float", "str"})


def returns_value(ret: A.Node | None) -> bool:
    """Whether a declared return type is one whose value a caller takes from the function's body: an `int`, a
    `bool`, a `float`, a `str` (`-> "wide" | "narrow"` too), or a tuple of them (`-> (int, int)`, `-> ((int,
    bool), float)`)."""
    if isinstance(ret, A.NamedType):
        return ret.name.id in VALUE_RETURNS
    if isinstance(ret, A.LiteralType):
        return ret.kind in VALUE_RETURNS
    return isinstance(ret, A.TupleType) and bool(ret.items) and all(returns_value(t) for t in ret.items)


def shows_body(fn: A.FnDef) -> bool:
    """Whether `fn`'s body is part of its item's interface: a function that returns an `int`, a `bool`, a `float`,
    a `str` or a tuple of them, whose value its callers take (semantics/fn_values.py: `reshape(x, [B, width(), 8,
    8])` is what `width()`'s body computes, `if is_sliding(c, i)` runs the branch its body chooses, `let (w, h) =
    sizes()` takes both sizes)."""
    return returns_value(fn.ret)


def interface_key(item: Item) -> str:
    """What other items can see of `item`: its text without function bodies (but those `shows_body` keeps). Two
    versions of an item with equal keys look the same from outside, so an edit inside a function body leaves
    every other item's analysis valid."""
    if item.ast is None:
        return f"<unparsed {item.kind} {item.name}>"
    text = item.text
    cut = [node.body.span for node in A.definitions(item.ast) if isinstance(node, A.FnDef) and not shows_body(node)]
    if not cut:
        return " ".join(text.split())
    parts, pos = [], 0
    for span in sorted(cut):
        if span.start < pos:
            continue
        parts.append(text[pos : span.start])
        pos = span.end
    parts.append(text[pos:])
    return " ".join(" ".join(parts).split()) + _config_uses(item.ast)


def _config_uses(ast: A.Node) -> str:
    """The config fields function bodies read (`c.hidden_size`) and the calls they pass a
    config parameter to (`rotary(c)`): part of what others see, since a module taking one
    config accepts another that declares the fields it reads (semantics.sharing)."""
    names = config_names(ast)
    if not names:
        return ""
    uses = set()
    for node in A.definitions(ast):
        if isinstance(node, A.FnDef):
            uses |= body_config_uses(node.body, names)
    return " reads " + " ".join(sorted(uses)) if uses else ""


def config_names(ast: A.Node) -> frozenset[str]:
    """The names that may hold a config in `ast`'s function bodies: the parameters of its modules and functions
    typed by a name other than `int`, `float`, `bool`, `str`, and the locals bound to one of them (`let d = c`,
    in the bodies' order)."""
    names = {
        p.name.id
        for node in A.definitions(ast)
        if isinstance(node, (A.ModuleDef, A.FnDef))
        for p in node.params
        if isinstance(p.type, A.NamedType) and p.type.name.id not in ("int", "float", "bool", "str")
    }
    if names:
        for node in A.definitions(ast):
            if isinstance(node, A.FnDef):
                for n in A.walk(node.body):
                    if isinstance(n, A.Let) and isinstance(n.value, A.Name) and n.value.id in names:
                        names.update(t.id for t in n.targets)
    return frozenset(names)


def body_config_uses(body: A.Node, names: frozenset[str]) -> set[str]:
    """What `body` reads of the configs `names` hold (`config_names`): each `c.field`, and each call passing one
    (`rotary(c)`), as `_config_uses` writes them."""
    uses = set()
    for n in A.walk(body):
        if isinstance(n, A.Attr) and isinstance(n.value, A.Name) and n.value.id in names:
            uses.add(f"{n.value.id}.{n.name.id}")
        elif isinstance(n, A.Call) and isinstance(n.func, A.Name):
            passed = [a.value.id for a in n.args if isinstance(a.value, A.Name) and a.value.id in names]
            if passed:
                uses.add(f"{n.func.id}({','.join(passed)})")
    return uses
