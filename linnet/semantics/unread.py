"""Parameters and state that no entry reads (warning L904).

A parameter is loaded from the checkpoint because it is declared; one that no entry of the
root model reads is a porting mistake more often than not (a norm left out of the layer, a
projection called under the wrong name, a KV cache written but attended past). The rule,
per config (scenario): starting from every `entry fn` of the root model, follow the calls
into methods and submodules (`self_attn(x)`, `layer.step(...)`, `project(x)`, elements of a
`for` over a list) and collect the members each reached function reads, by path from the
root (a list's elements as one: what one element's code reads, every element reads). A
read is a use of the member's value anywhere in a reached function, in any branch the
config takes (both, where the condition is not known): `h @ transpose(model.embed_tokens.weight)`
reads the embedding (a tied head). State is read when it is used other than to compute its
own next value (`k_cache = cache_write(k_cache, ...)` writes, `take(k_cache, rows, dim=0)`
reads); a cache written by one entry and read by another (an encoder-decoder's cross-attention
cache) is read. Every parameter and state tensor of the model tree that no path reaches is
reported once, on the outermost member whose parameters are all unread.

Only a file without errors is examined (after an error, names are not resolved and reads
would be missed); a use the walk cannot follow to a path (a module held in a local) stops it
for that config, so an unread member is only ever reported when every read was seen.
"""

from __future__ import annotations

from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import ConfigT, ModuleListT, ModuleT, NoneT, TensorT
from .attributes import unread_reason
from .checker import ItemChecker
from .diagnostics import Finding, symbol
from .resolved import Resolved
from .scope import Instance, Scope

__all__ = ["unread_findings"]

MAX_VISITS = 20_000  # (path, function) pairs one config's walk may visit


class _Untraceable(Exception):
    """A module value the walk cannot place in the tree: the config's result is not reported."""


def unread_findings(analysis, cache: dict | None = None) -> list[Finding]:
    """Warnings L904 for the root model's parameters and state that no entry reads, each once,
    naming the configs it occurs under when that is not all of them. Empty when the file has
    no root model or was not checked whole. `cache` (a dict the caller keeps between analyses)
    holds what each function reads under each check result, so an edit re-reads only what changed; it is left
    holding what this analysis's walks used (an entry of a check an edit replaced is never hit again, and it held
    that check's names alive: the server's memory grew ~4 MB per 20 edits of llama.linnet)."""
    old = {} if cache is None else cache
    cache = {}
    model = analysis.model
    ia = analysis.items.get(model) if model is not None else None
    if ia is None:
        return []
    by_key: dict[tuple, tuple[Finding, list[str]]] = {}
    order = []
    everywhere: set[str] = set()
    for (names, result), binding in zip(ia.results, ia.bindings):
        if getattr(result, "tree", None) is None:
            continue
        try:
            found = _Walk(analysis, model, binding, result.resolved, cache, old).findings()
        except _Untraceable:
            continue
        everywhere.update(names or ["defaults"])
        for f in found:
            key = (f.anchor, f.message)
            if key not in by_key:
                by_key[key] = (f, [])
                order.append(key)
            by_key[key][1].extend(names or ["defaults"])
    old.clear()
    old.update(cache)
    out = []
    for key in order:
        f, where = by_key[key]
        if len(set(where)) < len(everywhere):
            f.scenarios = tuple(dict.fromkeys(where))
        out.append(f)
    return out


class _Walk:
    """One config's walk from the root model's entries (see the module docstring)."""

    def __init__(self, analysis, model: Item, binding: dict, resolved: Resolved, cache: dict, old: dict):
        self.analysis = analysis
        self.cache = cache  # what this analysis used
        self.old = old  # what the last one left
        self.model = model
        self.checker = ItemChecker(analysis.context, model, binding)
        scope = Scope(self.checker.global_scope(), "module")
        args = {p.name.id: self.checker.param_value(p, scope) for p in model.ast.params}
        self.root = Instance(model, args)
        self.root_resolved = resolved
        self.reads: set[tuple[str, ...]] = set()
        self.seen: set[tuple] = set()

    # ----- reads
    def findings(self) -> list[Finding]:
        members = self.checker.members(self.root, report=False)
        for info in members.order:
            if info.kind == "fn" and info.present is not False and info.node.entry:
                self.visit((), self.root, info.node, self.root_resolved)
        leaves: list[tuple[tuple[str, ...], list[tuple[Instance, object]]]] = []
        self.leaves(self.root, (), [], leaves, set())
        return self.report(leaves)

    def current(self, inst: Instance) -> Instance:
        """`inst` bound to the current item of its name. A caller's check that an edit left valid (the callee's
        interface unchanged) is reused, and its types still name the callee's item before the edit: walked as it
        is, that old text's reads would be reported (and it would be checked again on every edit)."""
        item = inst.item
        if item in self.analysis.items or item.is_std:
            return inst
        globals_ = self.analysis.namespaces.by_path.get(item.source.path) if self.analysis.namespaces else None
        now = globals_.by_name.get(item.name) if globals_ is not None else None
        if now is None or now is item or now.kind != item.kind:
            return inst
        return Instance(now, inst.args, inst.generic)

    def resolved_of(self, inst: Instance) -> Resolved:
        config = {k: v for k, v in inst.args.items() if isinstance(v, (ConfigT, NoneT))}
        # as cached (`current=False`): a reused check naming a replaced item is walked as it is, mapped by `current`
        # (checking it again would cost every edit after that one a check)
        res = self.analysis.resolved(inst.item, config=config, current=False)
        if res is None or res.errors:
            raise _Untraceable
        return res

    def visit(self, prefix: tuple, inst: Instance, fn: A.FnDef, res: Resolved) -> None:
        key = (prefix, inst.key(), id(fn))
        if key in self.seen:
            return
        self.seen.add(key)
        if len(self.seen) > MAX_VISITS:
            raise _Untraceable
        reads, calls = self.summary(fn, res)
        self.reads.update(prefix + r for r in reads)
        for path, callee, receiver in calls:
            if receiver is None:  # a method called by its name in its module
                self.visit(prefix, inst, callee, res)
            else:
                now = self.current(receiver)
                if now is not receiver:  # the callee's function, by name, in the current item
                    callee = _same_fn(receiver.item, now.item, callee)
                self.visit(prefix + path, now, callee, self.resolved_of(now))

    def summary(self, fn: A.FnDef, res: Resolved) -> tuple[list, list]:
        """What `fn` reads (member paths from its module) and calls ((receiver path, callee, receiver instance or
        None for its own module)), under the check `res`: the same for every path the function is reached at,
        so made once per check (kept across analyses in `cache` while the check's result, or the part of it that
        checked `fn`, is the same object: `Resolved.parts`)."""
        token = res.parts.get(fn) if res.parts else None
        token = token if token is not None else res.names
        key = (id(fn), id(token))
        hit = self.cache.get(key) or self.old.get(key)
        if hit is not None and hit[0] is fn and hit[1] is token:
            self.cache[key] = hit
            if hit[2] is None:
                raise _Untraceable
            return hit[2]
        try:
            found = _summarise(fn, res)
        except _Untraceable:
            self.cache[key] = (fn, token, None)
            raise
        self.cache[key] = (fn, token, found)
        return found

    # ----- the tree
    def leaves(self, inst: Instance, path: tuple, chain: list, out: list, open_items: set) -> None:
        """Every parameter and state tensor under `inst`: (its path, the members leading to it)."""
        if inst.item in open_items:
            return
        members = self.checker.members(inst, report=False)
        for info in members.order:
            if info.present is False:
                continue
            here = path + (info.name,)
            link = chain + [(inst, info)]
            if info.kind in ("param", "state") and isinstance(info.type, TensorT):
                out.append((here, link))
            elif info.kind == "submodule" and isinstance(info.type, ModuleT):
                self.leaves(self.current(info.type.instance), here, link, out, open_items | {inst.item})
            elif info.kind == "list" and isinstance(info.type, ModuleListT):
                count = info.type.count.as_int() if info.type.count is not None else None
                if not count or count < 0:
                    continue
                elements = [info.type.instance]
                if info.type.element is not None:  # elements that receive their index differ
                    elements = [info.type.at(i) for i in range(count)]
                done = set()
                for element in elements:
                    element = self.current(element) if element is not None else None
                    if element is not None and element.key() not in done:
                        done.add(element.key())
                        self.leaves(element, here + ("#",), link, out, open_items | {inst.item})

    def read_anyway(self, leaves: list) -> list[Finding]:
        """A member marked `@unread` that an entry reads after all: the mark is wrong (or the read is)."""
        out, done = [], set()
        for path, chain in leaves:
            if path not in self.reads:
                continue
            for depth, (inst, info) in enumerate(chain):
                if unread_reason(info.node) is not None and (id(info.node), depth) not in done:
                    done.add((id(info.node), depth))
                    out.append(
                        Finding(
                            "L904",
                            f"`{info.name}` is marked `@unread` but an entry of `{self.model.name}` reads it",
                            symbol(inst.item, "member", info.name),
                            notes=[f"read: `{_dotted(path, chain)}`", "remove `@unread`, or the read"],
                            severity="warning",
                        )
                    )
        return out

    def report(self, leaves: list) -> list[Finding]:
        unread = [
            (p, chain)
            for p, chain in leaves
            if p not in self.reads and not any(unread_reason(info.node) is not None for _, info in chain)
        ]
        out: list[Finding] = self.read_anyway(leaves)
        if not unread:
            return out
        read_prefixes = {p[:i] for p, _ in leaves if p in self.reads for i in range(len(p) + 1)}
        done: set[tuple] = set()
        for path, chain in unread:
            # the outermost member of the user's files whose parameters are all unread
            depth = next(
                (i for i in range(len(chain)) if _member_path(path, chain, i) not in read_prefixes),
                len(chain) - 1,
            )
            while depth > 0 and chain[depth][0].item.is_std:
                depth -= 1
            inst, info = chain[depth]
            where = _member_path(path, chain, depth)
            if where in done:
                continue
            done.add(where)
            below = [(p, c) for p, c in unread if p[: len(where)] == where]
            state = all(c[-1][1].kind == "state" for _, c in below)
            shown = ", ".join(f"`{_dotted(p, c)}`" for p, c in below[:3])
            shown += f" and {len(below) - 3} more" if len(below) > 3 else ""
            what = "is written but never read" if state else "is loaded but never read"
            out.append(
                Finding(
                    "L904",
                    f"`{info.name}` {what} by any entry of `{self.model.name}`",
                    symbol(inst.item, "member", info.name),
                    notes=[
                        f"unread: {shown}",
                        "a call may be missing (a norm, a projection), or another member called in its place",
                    ]
                    + (["a cache that is written must be read (`take(k_cache, rows, dim=0)`)"] if state else []),
                    severity="warning",
                )
            )
        return out


def _summarise(fn: A.FnDef, res: Resolved) -> tuple[list, list]:
    """`_Walk.summary`, made: the reads and calls of `fn`'s body (and parameter defaults) under `res`."""
    loops: dict[A.Name, A.Expr] = {}
    attr_names: set[int] = set()
    own_writes: set[int] = set()  # state read only to compute its own next value
    nodes = [n for p in fn.params if p.default is not None for n in A.walk(p.default)] + list(A.walk(fn.body))
    for node in nodes:
        if isinstance(node, A.For):
            loops[node.var] = node.iter
        elif isinstance(node, A.Attr):
            attr_names.add(id(node.name))
        elif isinstance(node, A.Assign):
            own_writes.add(id(node.target))
            target = res.ref(node.target)
            if target is not None and target.kind == "member":
                for n in A.walk(node.value):
                    ref = res.ref(n) if isinstance(n, A.Name) else None
                    if ref is not None and ref.kind == "member" and ref.node is target.node:
                        own_writes.add(id(n))
    reads: list[tuple[str, ...]] = []
    calls: list[tuple] = []
    for node in nodes:
        if isinstance(node, A.Name) and id(node) not in attr_names and id(node) not in own_writes:
            ref = res.ref(node)
            if ref is not None and ref.kind == "member" and ref.value in ("param", "state"):
                reads.append((ref.name,))
        elif isinstance(node, A.Attr) and isinstance(res.types.get(node.value), ModuleT):
            ref = res.ref(node.name)
            if ref is not None and ref.kind == "member" and ref.value in ("param", "state"):
                reads.append(_path_of(node.value, res, loops) + (node.name.id,))
        elif isinstance(node, A.Call):
            info = res.call(node)
            if info is None or not isinstance(info.callee, A.FnDef):
                continue
            if info.kind in ("forward", "method") and info.receiver is not None:
                t = res.types.get(info.receiver)
                if not isinstance(t, ModuleT):
                    raise _Untraceable
                calls.append((_path_of(info.receiver, res, loops), info.callee, t.instance))
            elif info.kind == "method":
                calls.append(((), info.callee, None))
    return reads, calls


def _same_fn(old: Item, item: Item, fn: A.FnDef) -> A.FnDef:
    """The function of `item` (a module) at the place `fn` has in `old` (the module before an edit, with the
    same interface: the same functions in the same order; two of one name may sit in the branches of an `if`).
    Raises _Untraceable when there is none."""
    before = [n for n in A.definitions(old.ast) if isinstance(n, A.FnDef)] if old.ast is not None else []
    now = [n for n in A.definitions(item.ast) if isinstance(n, A.FnDef)] if item.ast is not None else []
    at = next((i for i, n in enumerate(before) if n is fn), None)
    if at is None or at >= len(now) or now[at].name.id != fn.name.id:
        raise _Untraceable
    return now[at]


def _path_of(e: A.Expr, res: Resolved, loops: dict) -> tuple[str, ...]:
    """The member path (from the function's module) of a module-valued expression; a list's elements as `#`."""
    if isinstance(e, A.Name):
        ref = res.ref(e)
        if ref is not None and ref.kind == "member":
            return (ref.name,)
        if ref is not None and ref.kind == "loop" and ref.node in loops:
            return _path_of(loops[ref.node], res, loops) + ("#",)
    elif isinstance(e, A.Attr):
        return _path_of(e.value, res, loops) + (e.name.id,)
    elif isinstance(e, A.Index):
        return _path_of(e.value, res, loops) + ("#",)
    raise _Untraceable


def _member_path(path: tuple, chain: list, depth: int) -> tuple:
    """The prefix of `path` that names the member `chain[depth]` (list elements' `#` kept)."""
    names = 0
    for i, seg in enumerate(path):
        if seg != "#":
            if names == depth:
                return path[: i + 1]
            names += 1
    return path


def _dotted(path: tuple, chain: list) -> str:
    """A leaf's checkpoint name, list elements as `*` (`model.layers.*.mlp.up_proj.weight`)."""
    names = iter(info.checkpoint_name or info.name for _, info in chain)
    return ".".join("*" if p == "#" else next(names) for p in path)
