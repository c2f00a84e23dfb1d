"""The Linnet syntax tree.

Every node carries a `Span`: character offsets relative to the start of its top-level item
(see `items.py`). Relative spans are what make item-level reuse cheap: when an edit above an
item moves it, the item's nodes stay valid and only `Item.offset` changes. `Item.resolve(span)`
turns a span into absolute offsets, byte offsets, 1-based line/column and LSP (UTF-16)
positions.

A node's span runs from its first token to its last. A parenthesised expression is its contents' node, spanning
its contents; its parentheses are in the spans of the nodes around it, as in Python's ast: `(H - 1) // 2` spans
all of itself and its left operand `H - 1`, and a name inside parentheses spans the name alone.

Nodes compare by identity (`eq=False`) so checker results can be keyed by node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Union


class Span(NamedTuple):
    """Half-open range `[start, end)` of character offsets, relative to an item's text."""

    start: int
    end: int

    def contains(self, offset: int) -> bool:
        return self.start <= offset <= self.end


@dataclass(eq=False, slots=True)
class Node:
    span: Span


# ----------------------------------------------------------------------------- expressions


@dataclass(eq=False, slots=True)
class Name(Node):
    id: str


@dataclass(eq=False, slots=True)
class IntLit(Node):
    value: int


@dataclass(eq=False, slots=True)
class FloatLit(Node):
    value: float
    text: str


@dataclass(eq=False, slots=True)
class StrLit(Node):
    value: str


@dataclass(eq=False, slots=True)
class BoolLit(Node):
    value: bool


@dataclass(eq=False, slots=True)
class NoneLit(Node):
    pass


@dataclass(eq=False, slots=True)
class Neg(Node):
    operand: Expr


@dataclass(eq=False, slots=True)
class Not(Node):
    operand: Expr


@dataclass(eq=False, slots=True)
class BinOp(Node):
    """`left op right` for op in + - * / % @ ** and or."""

    op: str
    left: Expr
    right: Expr
    op_span: Span


@dataclass(eq=False, slots=True)
class Compare(Node):
    op: str
    left: Expr
    right: Expr
    op_span: Span


@dataclass(eq=False, slots=True)
class Arg(Node):
    """A call argument; `name` is set for keyword arguments (`dim=-1`)."""

    name: Name | None
    value: Expr


@dataclass(eq=False, slots=True)
class Call(Node):
    func: Expr
    args: list[Arg]


@dataclass(eq=False, slots=True)
class Attr(Node):
    value: Expr
    name: Name


@dataclass(eq=False, slots=True)
class Slice(Node):
    start: Expr | None
    stop: Expr | None


@dataclass(eq=False, slots=True)
class EllipsisLit(Node):
    pass


@dataclass(eq=False, slots=True)
class Index(Node):
    value: Expr
    items: list[Expr | Slice | EllipsisLit]


@dataclass(eq=False, slots=True)
class TupleLit(Node):
    items: list[Expr]


@dataclass(eq=False, slots=True)
class ListLit(Node):
    items: list[Expr]


@dataclass(eq=False, slots=True)
class Block(Node):
    stmts: list[Stmt]


@dataclass(eq=False, slots=True)
class IfExpr(Node):
    """Compile-time `if`: the condition must be known when the model is loaded."""

    cond: Expr
    then: Block
    orelse: Block | IfExpr | None


@dataclass(eq=False, slots=True)
class RecordLit(Node):
    """`Llama { hidden_size = 576, ... }`: a config value (presets and config defaults)."""

    type_name: Name
    fields: list[FieldInit]


@dataclass(eq=False, slots=True)
class FieldInit(Node):
    name: Name
    value: Expr | RecordLit


Expr = Union[
    Name,
    IntLit,
    FloatLit,
    StrLit,
    BoolLit,
    NoneLit,
    Neg,
    Not,
    BinOp,
    Compare,
    Call,
    Attr,
    Index,
    TupleLit,
    ListLit,
    IfExpr,
]

# ----------------------------------------------------------------------------- statements


@dataclass(eq=False, slots=True)
class Let(Node):
    targets: list[Name]
    annotation: Type | None
    value: Expr
    is_tuple: bool = False


@dataclass(eq=False, slots=True)
class Assign(Node):
    """`h = layer(h)` (a local declared by `let`) or `k_cache = ...` (module state)."""

    target: Name
    value: Expr


@dataclass(eq=False, slots=True)
class For(Node):
    var: Name
    iter: Expr
    body: Block


@dataclass(eq=False, slots=True)
class ExprStmt(Node):
    expr: Expr


@dataclass(eq=False, slots=True)
class ErrorStmt(Node):
    """Text that did not parse and was skipped by error recovery.

    `bound` holds the names a `let` in the skipped text would have bound, so that their uses
    are not reported again as unknown names; `used` every name the skipped text spells, so
    that a name only it uses is not reported as never used (an unclosed `exp(y` is the error,
    not `y`).
    """

    bound: list[str]
    used: list[str] = field(default_factory=list)


Stmt = Union[Let, Assign, For, ExprStmt, ErrorStmt]

# ----------------------------------------------------------------------------- types


@dataclass(eq=False, slots=True)
class EllipsisDim(Node):
    pass


@dataclass(eq=False, slots=True)
class TensorType(Node):
    """`f32[B, S]`, or `[B, S, c.hidden_size]` in the working dtype (`dtype is None`)."""

    dtype: Name | None
    dims: list[Expr | EllipsisDim]


@dataclass(eq=False, slots=True)
class NamedType(Node):
    """`int`, `float`, `bool`, `str`, a config name; `optional` for `RopeScaling?`."""

    name: Name
    optional: bool = False


@dataclass(eq=False, slots=True)
class LiteralType(Node):
    """`"default" | "linear" | "llama3"`, or a one-value bool type (`false`): a config field
    whose other values the source does not support (`is_decoder: false`); `optional` for
    `false?` (that value or `none`)."""

    values: list[StrLit | BoolLit]
    optional: bool = False

    @property
    def kind(self) -> str:
        """ "bool" for `true` or `false`, else "str"."""
        return "bool" if any(isinstance(v, BoolLit) for v in self.values) else "str"


@dataclass(eq=False, slots=True)
class TupleType(Node):
    items: list[Type]


@dataclass(eq=False, slots=True)
class ListType(Node):
    """`list[float]`: a config field holding a list of compile-time values (longrope's
    `short_factor`, `layer_types`)."""

    item: Type


Type = Union[TensorType, NamedType, LiteralType, TupleType, ListType]

# ----------------------------------------------------------------------------- items


@dataclass(eq=False, slots=True)
class Attribute(Node):
    """`@name("LayerNorm")`, `@weights("smollm2-135m-instruct")`."""

    name: Name
    args: list[Arg]


@dataclass(eq=False, slots=True)
class Param(Node):
    name: Name
    type: Type
    default: Expr | None


@dataclass(eq=False, slots=True)
class Generic(Node):
    """A dtype variable of a function: `<T>` or `<T: float>`."""

    name: Name
    kind: Name | None


@dataclass(eq=False, slots=True)
class FnDef(Node):
    name: Name
    params: list[Param]
    ret: Type | None
    body: Block
    entry: bool = False
    generics: list[Generic] = field(default_factory=list)
    attributes: list[Attribute] = field(default_factory=list)
    doc: str | None = None


@dataclass(eq=False, slots=True)
class FieldDecl(Node):
    """A module member: a parameter (`weight: [out, in]`), a submodule (`q_proj: Linear(...)`)
    or a list of submodules (`layers: [Block(c); c.num_hidden_layers]`, or with each element's
    index `index`: `layers: [Block(c, layer_idx) for layer_idx in range(c.num_hidden_layers)]`)."""

    name: Name
    kind: str  # "param" | "submodule" | "list"
    type: TensorType | None = None
    ctor: Call | None = None
    index: Name | None = None  # before `count`: children are yielded in source order
    count: Expr | None = None
    attributes: list[Attribute] = field(default_factory=list)
    doc: str | None = None


@dataclass(eq=False, slots=True)
class StateDecl(Node):
    """Module state (a KV cache): a buffer whose dims may use the load-time dims."""

    name: Name
    type: TensorType
    attributes: list[Attribute] = field(default_factory=list)
    doc: str | None = None


@dataclass(eq=False, slots=True)
class MemberIf(Node):
    """Members present only under a compile-time condition (`if c.attention_bias { ... }`)."""

    cond: Expr
    then: list[Member]
    orelse: list[Member]


Member = Union[FieldDecl, StateDecl, FnDef, MemberIf]


@dataclass(eq=False, slots=True)
class ModuleDef(Node):
    """`module Name(params) { members }`; `is_model` for the loadable root `model`."""

    name: Name
    params: list[Param]
    members: list[Member]
    is_model: bool = False
    attributes: list[Attribute] = field(default_factory=list)
    doc: str | None = None


@dataclass(eq=False, slots=True)
class ConfigField(Node):
    name: Name
    type: Type
    default: Expr | RecordLit | None
    attributes: list[Attribute] = field(default_factory=list)
    doc: str | None = None


@dataclass(eq=False, slots=True)
class ConfigDef(Node):
    name: Name
    fields: list[ConfigField]
    attributes: list[Attribute] = field(default_factory=list)
    doc: str | None = None


@dataclass(eq=False, slots=True)
class PresetDef(Node):
    name: Name
    value: RecordLit
    attributes: list[Attribute] = field(default_factory=list)
    doc: str | None = None


@dataclass(eq=False, slots=True)
class ModulePath(Node):
    """`std.nn`: a standard-library module named by dotted names."""

    parts: list[Name]

    @property
    def dotted(self) -> str:
        return ".".join(p.id for p in self.parts)


@dataclass(eq=False, slots=True)
class ImportedName(Node):
    """`LlamaAttention as Attention` in an import: the item's name in the imported file, and
    the name it is bound to here (`alias`, else the same name)."""

    name: Name
    alias: Name | None = None

    @property
    def local(self) -> Name:
        return self.alias if self.alias is not None else self.name


@dataclass(eq=False, slots=True)
class ImportDef(Node):
    """`from "llama.linnet" import LlamaMLP, LlamaAttention as Attention` (a file, relative to
    the importing file) or `from std.nn import Linear` (a standard-library module)."""

    source: StrLit | ModulePath
    names: list[ImportedName]


ItemDef = Union[ConfigDef, PresetDef, ModuleDef, FnDef, ImportDef]


_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}  # per node class: its fields that may hold nodes, in order


def _child_fields(cls: type) -> tuple[str, ...]:
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:  # a class's own slots: `span` is Node's
        fields = _CHILD_FIELDS[cls] = tuple(n for n in cls.__slots__ if n != "span" and not n.endswith("_span"))
    return fields


def _child_list(node: Node) -> list[Node]:
    kids: list[Node] = []
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        if isinstance(value, Node):
            kids.append(value)
        elif isinstance(value, list):
            kids += [v for v in value if isinstance(v, Node)]
    return kids


def child_fields(cls: type) -> tuple[str, ...]:
    """The fields of node class `cls` that may hold nodes (or lists of them), in source order; spans aside."""
    return _child_fields(cls)


def children(node: Node):
    """Yield the direct child nodes of `node`, in source order."""
    yield from _child_list(node)


def walk(node: Node):
    """Yield `node` and all its descendants, parents before children."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        kids = _child_list(n)
        kids.reverse()
        stack += kids


def flat_members(members: list) -> "Iterator[Member]":
    """A module's members with the `if` blocks around them flattened away."""
    for m in members:
        if isinstance(m, MemberIf):
            yield from flat_members(m.then)
            yield from flat_members(m.orelse)
        else:
            yield m


def definitions(item: Node):
    """The item and the definitions inside it (members, functions, config fields), without
    descending into expressions: what docs and interfaces are made of."""
    yield item
    if isinstance(item, ModuleDef):
        yield from flat_members(item.members)
    elif isinstance(item, ConfigDef):
        yield from item.fields


def node_at(root: Node, offset: int) -> list[Node]:
    """The chain of nodes containing the item-relative `offset`, outermost first."""
    chain = []
    node = root
    while node is not None and node.span.contains(offset):
        chain.append(node)
        nxt = None
        for child in children(node):
            if child.span.contains(offset):
                nxt = child
                # prefer the last child that starts at or before offset (adjacent spans)
        node = nxt
    return chain
