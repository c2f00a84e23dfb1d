"""An edit inside one function body of a module, applied to the module's item in place.

Item-level reuse (`items.py`) keeps the parse of every item whose text is unchanged; an edited item gets a new
parse. For a module whose edit stays inside the braces of one function's body, `splice_body` keeps the item and
its nodes instead: the text is parsed again (and must give the same tree outside that body), the function's
`body` is replaced by the new one, and the spans of the nodes after it move by the change in length. The
module's other functions keep their nodes, so what a check derived for them (keyed by node) stays valid and only
the edited function needs checking again (`semantics.fn_reuse`). Spans in what was derived before the edit move
as the nodes did: `BodyEdit` says how.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ast as A
from .ast import Span
from .items import Item, body_config_uses, config_names, make_item, shows_body
from .positions import changed_range, lexable

__all__ = ["BodyEdit", "Splice", "moved", "plan_splice", "splice_body"]


@dataclass(frozen=True, slots=True)
class BodyEdit:
    """An edit inside the body of `fn` (a method of the item's module). Spans (item-relative) from before the edit
    that start at or after `cut` (where the body ended) moved by `delta` characters; those that start before it
    and end at or after it (the function, the module, an `if` around the function) grew by `delta`."""

    fn: A.FnDef
    cut: int
    delta: int


def moved(span: Span, cut: int, delta: int) -> Span:
    """`span` (from before an edit ending before `cut`) as it is after the edit: see `BodyEdit`."""
    if span.end < cut or not delta:
        return span
    if span.start >= cut:
        return Span(span.start + delta, span.end + delta)
    return Span(span.start, span.end + delta)


def splice_body(item: Item, text: str, only: A.FnDef | None = None) -> BodyEdit | None:
    """Apply the edit that turns `item`'s text into `text` in place, when it changes the text inside the braces of
    one function body of a `module` (not a `model`: its check is not made in parts) and the new text parses to
    the same tree outside that body, with the same interface (`Item.interface`); `only`: and that function is
    `only`. Returns the edit, or None (the item is left as it was) otherwise. The item's `text`, `problems` and
    nodes are updated; its `offset` is the caller's to set."""
    plan = plan_splice(item, text, only)
    return plan.apply() if plan is not None else None


@dataclass(frozen=True, slots=True)
class Splice:
    """A body edit found and parsed (`plan_splice`), not yet applied: `apply` changes the item. Apart, so that the
    parse is done before the edit is made where others read the item (semantics.program: `Document.update`)."""

    item: Item
    text: str
    fn: A.FnDef
    body: A.Block
    problems: list
    cut: int
    delta: int
    same_lets: bool = False  # the body binds the same `let x = name` as before: `Item._config_names` holds

    def apply(self) -> BodyEdit:
        """Make the edit in place: the function's body replaced, the nodes after it moved, the item's text set."""
        item = self.item
        _move(item.ast, self.fn, self.cut, self.delta)
        self.fn.body = self.body
        item.text = self.text
        item.problems = self.problems
        item._refs = None
        item._attribute_findings = None
        if not self.same_lets:
            item._config_names = None
        return BodyEdit(self.fn, self.cut, self.delta)


def plan_splice(item: Item, text: str, only: A.FnDef | None = None) -> Splice | None:
    """The edit `splice_body` would make, parsed and checked, without changing `item`; None where it makes none."""
    tree = item.ast
    if item.kind != "module" or not isinstance(tree, A.ModuleDef) or tree.is_model:
        return None
    old = item.text
    start, old_end, _ = changed_range(old, text)
    fn = next(
        (
            m
            for m in A.flat_members(tree.members)
            if isinstance(m, A.FnDef) and m.body.span.start < start and old_end < m.body.span.end
        ),
        None,
    )
    if fn is None or (only is not None and fn is not only) or shows_body(fn):
        return None  # (a body `shows_body` keeps is part of the interface: the item is replaced whole)
    delta = len(text) - len(old)
    cut = fn.body.span.end
    body = _parse_body(item, text, fn.body.span.start, cut + delta)
    if body is not None and not _same_config_uses(item, fn.body, body):
        body = None  # what the body reads of a config is part of the interface (`items._config_uses`)
    problems: list = []
    same_lets = body is not None
    if body is None:
        new = make_item(item.source, item.offset, text)
        if new.kind != item.kind or new.name != item.name or new.interface != item.interface:
            return None
        body = _same_tree(tree, new.ast, fn, cut, delta)
        if body is None:
            return None
        problems = new.problems
    return Splice(item, text, fn, body, problems, cut, delta, same_lets)


def _same_config_uses(item: Item, old: A.Block, new: A.Block) -> bool:
    """Whether the item's interface (`Item.interface`) is the same with `new` in place of the body `old`: what its
    bodies read of a config (`items._config_uses`) is part of it (a body edit reading a new `c.scale` changes what
    importers must declare: semantics.sharing). The same when the two bodies bind the same locals to names in the
    same order (so the names that may hold a config, `config_names`, are the same) and read the same of those:
    an edit of `q_proj(x)` into `v_proj(x)` keeps it, `c.hidden_size` into `c.scale` does not."""
    if item._config_names is None:
        item._config_names = config_names(item.ast)
    if not item._config_names:
        return True
    return _name_lets(old) == _name_lets(new) and body_config_uses(old, item._config_names) == body_config_uses(
        new, item._config_names
    )


def _name_lets(body: A.Block) -> list[tuple[tuple[str, ...], str]]:
    """The `let x = name` of `body`, in order: what `config_names` reads of it."""
    return [
        (tuple(t.id for t in n.targets), n.value.id)
        for n in A.walk(body)
        if isinstance(n, A.Let) and isinstance(n.value, A.Name)
    ]


def _parse_body(item: Item, text: str, start: int, end: int) -> A.Block | None:
    """The function body that is `text[start:end]` parsed alone (`descent.parse_block`), when that is the parse the
    whole of `text` gets: the item parsed with no problem, so the rest of its text, unchanged, parses as before
    (what the fast parser accepts, lark's route builds alike); None otherwise (the whole item is then parsed
    again and compared). Parsing a 60-line module and comparing the trees was ~1.8 of the 5 ms a keystroke's
    first stage took on the 3,000-line file (bench/lsp_latency.py --burst-pause)."""
    from .descent import parse_block  # (as `parser._parse` does: a start that parses nothing never loads it)

    if item.problems:
        return None
    return parse_block(lexable(text), start, end)


def _span_fields(node: A.Node) -> tuple[str, ...]:
    return tuple(n for n in type(node).__slots__ if n.endswith("_span"))


def _same_tree(old: A.Node, new: A.Node, fn: A.FnDef, cut: int, delta: int) -> A.Block | None:
    """The body in `new` of the function that is `fn` in `old`, when the two trees are the same apart from that
    body: node for node of the same class, with the same values, at the spans `moved` gives; else None."""
    body = None
    stack = [(old, new)]
    while stack:
        a, b = stack.pop()
        if type(a) is not type(b):
            return None
        if a is fn.body:
            if b.span != (a.span.start, a.span.end + delta):
                return None
            body = b
            continue
        if moved(a.span, cut, delta) != b.span:
            return None
        for name in A.child_fields(type(a)):
            x, y = getattr(a, name), getattr(b, name)
            if isinstance(x, A.Node) or isinstance(y, A.Node):
                if not (isinstance(x, A.Node) and isinstance(y, A.Node)):
                    return None
                stack.append((x, y))
            elif isinstance(x, list) and isinstance(y, list):
                if len(x) != len(y):
                    return None
                for u, v in zip(x, y):
                    if isinstance(u, A.Node) and isinstance(v, A.Node):
                        stack.append((u, v))
                    elif isinstance(u, A.Node) or isinstance(v, A.Node) or u != v:
                        return None
            elif x != y:
                return None
        for name in _span_fields(a):
            if moved(getattr(a, name), cut, delta) != getattr(b, name):
                return None
    return body


def _move(tree: A.Node, fn: A.FnDef, cut: int, delta: int) -> None:
    """Move the spans of `tree`'s nodes, but for `fn`'s body (replaced), as the edit did (`moved`)."""
    if not delta:
        return
    stack = [tree]
    while stack:
        node = stack.pop()
        if node is fn.body:
            continue
        node.span = moved(node.span, cut, delta)
        for name in _span_fields(node):
            setattr(node, name, moved(getattr(node, name), cut, delta))
        stack += A.children(node)
