"""Function-level reuse inside a module: an edit inside one function body re-checks that function only.

A module's check (`ItemChecker.check_module`) is made in parts (`Segment`s): its parameters and members, then
each function, then what follows; each part's findings, references, calls, types, resolved names and calls are
contiguous in the `ItemResult`. When an edit changed one function's body and nothing else
(`syntax.splice.splice_body`: the item and its other nodes kept, spans moved), `recheck_body` makes the module's
result under one binding from the result before the edit: the edited function checked again, and each function
whose check read its body at a call (`Segment.reads`: a method given known values, `specialize.same_item_call`; a
size it returns, `fn_values`), every other part taken as it was, its spans moved as the edit moved the text. That
is what a full check gives: a function's check reads and writes only its own part (the parts of one check never
share a node), and the parameters, members and the other functions do not depend on the edited body (the
interface, which holds what the bodies read of the configs, is unchanged).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..syntax import ast as A
from ..syntax.items import Item
from ..syntax.recursion import deep_recursion
from ..syntax.splice import BodyEdit, moved
from .diagnostics import Finding, Fix, Label, LocalAnchor
from .scope import Instance, Scope

if TYPE_CHECKING:
    from .checker import CheckContext, ItemChecker, ItemResult

__all__ = ["Parts", "Segment", "prune_moved", "recheck_body"]

_LISTS = ("findings", "refs", "calls")
_DICTS = ("types", "names", "call_info")


@dataclass(slots=True)
class Segment:
    """One part of a module's check: `fn` (None for the parameters and members) and how many entries it added to
    each list and dict of the result (`_LISTS`, `_DICTS`, in that order), with the dependencies it recorded."""

    fn: A.FnDef | None
    counts: tuple[int, ...]
    deps: dict
    reads: frozenset = frozenset()  # the other functions of the module whose bodies it read (`bodies_read`)


class Parts:
    """Records a module's check in parts (`ItemResult.segments`). Made after the parameters and members are
    checked (the first part); `segment(checker, fn)` around each function's check; `close()` at the end."""

    def __init__(self, result: ItemResult):
        self.result = result
        self.segments = [Segment(None, _counts(result), dict(result.deps))]
        self.ok = True

    @contextlib.contextmanager
    def segment(self, checker: ItemChecker, fn: A.FnDef):
        """Check `fn` into a part of its own, then add that part to the result."""
        main = self.result
        part = type(main)()
        checker.result = part
        outer, checker.bodies_read = checker.bodies_read, set()
        try:
            yield
        finally:
            checker.result = main
            reads = frozenset(checker.bodies_read - {fn})
            checker.bodies_read = outer | reads
        self.segments.append(Segment(fn, _counts(part), part.deps, reads))
        self.ok = _append(main, part) and self.ok

    def close(self) -> None:
        self.result.segments = self.segments if self.ok else None


def _counts(result: ItemResult) -> tuple[int, ...]:
    return tuple(len(getattr(result, name)) for name in _LISTS + _DICTS)


def _append(main: ItemResult, part: ItemResult) -> bool:
    """Add `part` to the end of `main`; False when a dict key of `part` was in `main` already (the parts then
    overlap, and cannot be taken apart again)."""
    for name in _LISTS:
        getattr(main, name).extend(getattr(part, name))
    ok = True
    for name in _DICTS:
        into, added = getattr(main, name), getattr(part, name)
        size = len(into)
        into.update(added)
        ok = ok and len(into) == size + len(added)
    main.deps.update(part.deps)
    return ok


def recheck_body(
    ctx: CheckContext, item: Item, binding: dict, old: ItemResult, edit: BodyEdit, checker: type[ItemChecker]
) -> ItemResult | None:
    """`item`'s result under `binding` after `edit`, made from `old` (its result before the edit, in parts) by
    checking only the edited function again; None when `old` is not in parts or the parts cannot be matched
    (the caller then checks the whole item). A bug in the checker gives None too: the whole check reports it."""
    if old.segments is None or not isinstance(item.ast, A.ModuleDef):
        return None
    try:
        with deep_recursion():
            return _recheck(ctx, item, binding, old, edit, checker)
    except Exception:  # noqa: BLE001 - the full check that follows reports it (L000)
        return None


def _recheck(
    ctx: CheckContext, item: Item, binding: dict, old: ItemResult, edit: BodyEdit, checker: type[ItemChecker]
) -> ItemResult | None:
    c = checker(ctx, item, binding, type(old)())  # the parameters' and members' findings are `old`'s
    scope = Scope(c.global_scope(), "module")
    inst = Instance(item, {p.name.id: c.param_value(p, scope) for p in item.ast.params}, generic=True)
    c.instance = inst
    members = c.members(inst, report=False)
    infos = {m.node: m for m in members.order if m.kind == "fn"}
    new = type(old)()
    parts = Parts(new)
    parts.segments = []
    offsets = [0] * (len(_LISTS) + len(_DICTS))
    sources = [getattr(old, name) for name in _LISTS] + [list(getattr(old, name).items()) for name in _DICTS]
    for seg in old.segments:
        taken = [src[at : at + n] for src, at, n in zip(sources, offsets, seg.counts)]
        offsets = [at + n for at, n in zip(offsets, seg.counts)]
        if seg.fn is not None and (seg.fn is edit.fn or edit.fn in seg.reads):
            # the edited function, or one that read its body at a call (a method given known values, a size it
            # returns): checked again
            info = infos.get(seg.fn)
            if info is None or info.present is False:
                return None
            with parts.segment(c, seg.fn):
                c.check_method(info, inst)
            continue
        _add(new, taken, edit, item)
        parts.segments.append(seg)  # the same part: what was derived from it stays valid (unread.py's summaries)
        new.deps.update(seg.deps)
    _add(new, [src[at:] for src, at in zip(sources, offsets)], edit, item)  # what follows the functions
    parts.close()
    return new if parts.ok else None


def _add(result: ItemResult, taken: list, edit: BodyEdit, item: Item) -> None:
    """Append the lists and dict entries `taken` from a result before `edit` to `result`, their spans moved."""
    findings, refs, calls, types, names, call_info = taken
    cut, delta = edit.cut, edit.delta
    result.findings.extend(_moved_finding(f, item, cut, delta) for f in findings)
    result.refs.extend((moved(s, cut, delta), _moved_anchor(t, item, cut, delta)) for s, t in refs)
    result.calls.extend((caller, callee, moved(s, cut, delta)) for caller, callee, s in calls)
    result.types.update(types)
    result.names.update(names)
    result.call_info.update(call_info)


def _moved_anchor(anchor: Any, item: Item, cut: int, delta: int) -> Any:
    if isinstance(anchor, LocalAnchor) and anchor.item is item:
        span = moved(anchor.span, cut, delta)
        return anchor if span is anchor.span else LocalAnchor(item, span)
    return anchor


def _moved_finding(f: Finding, item: Item, cut: int, delta: int) -> Finding:
    anchor = _moved_anchor(f.anchor, item, cut, delta)
    labels = [Label(_moved_anchor(lb.anchor, item, cut, delta), lb.message) for lb in f.labels]
    fixes = [Fix(x.message, [(_moved_anchor(a, item, cut, delta), t) for a, t in x.edits]) for x in f.fixes]
    if anchor is f.anchor and all(a.anchor is b.anchor for a, b in zip(labels, f.labels)) and not f.fixes:
        return f
    return replace(f, anchor=anchor, labels=labels, fixes=fixes)


def prune_moved(ctx: CheckContext, edits: dict[Item, BodyEdit]) -> None:
    """Drop the cached members and signatures (`CheckContext` caches) of the items `edits` just changed whose
    findings point after an edit (their spans moved): the rest stay valid, since the items' nodes are kept (every
    document's context that may hold them is pruned at the edit: an importer's too). Copied, not changed in place,
    as `program._prune_caches` does."""
    stale = []
    for item, edit in edits.items():
        for cache, key in ctx.cache_keys.get(item, ()):
            value = (ctx.members_cache if cache == "members" else ctx.signatures).get(key)
            found = getattr(value, "findings", None) if cache == "members" else getattr(value, "errors", None)
            if any(_points_after(f, item, edit.cut) for f in found or ()):
                stale.append((item, cache, key))
    if not stale:
        return
    members, signatures = dict(ctx.members_cache), dict(ctx.signatures)
    keys = {item: list(entries) for item, entries in ctx.cache_keys.items()}
    for item, cache, key in stale:
        (members if cache == "members" else signatures).pop(key, None)
        keys[item] = [e for e in keys[item] if e != (cache, key)]
    ctx.members_cache, ctx.signatures, ctx.cache_keys = members, signatures, keys


def _points_after(f: Finding, item: Item, cut: int) -> bool:
    anchors = [f.anchor] + [lb.anchor for lb in f.labels] + [a for x in f.fixes for a, _ in x.edits]
    return any(isinstance(a, LocalAnchor) and a.item is item and a.span.end >= cut for a in anchors)
