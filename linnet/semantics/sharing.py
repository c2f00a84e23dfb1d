"""Structural config parameters: a module or function declared over one config accepts another.

`module LlamaMLP(c: Llama)` reads `c.hidden_size`, `c.intermediate_size` and `c.mlp_bias`.
A `Mistral` config may be passed as its `c` when `Mistral` declares every field of `Llama`
that `LlamaMLP` reads, each with a type that `Llama`'s declaration accepts: the same type, a
one-value type of it (`mlp_bias: false` where `Llama` says `bool`), or the non-optional form of
an optional one (`int` where `Llama` says `int?`). So families share modules (Mistral imports
Llama's layers) while each config still declares, and checks, exactly the keys its
checkpoints carry (issue 14): nothing is inherited.

What a module reads is found in its source, not under one config's values: every `c.field`
in its members, defaults and functions (through `let d = c` too), whatever `if` guards it,
and, through each call that passes `c` on (`LlamaAttention(c)`, `rotary(c)`), what the callee reads. So the answer does
not depend on the preset, and a field read in a branch one family never takes must still be
declared by it (with a one-value type, a family says why the branch is not taken).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..syntax import ast as A
from ..syntax.items import Item

SCALARS = ("int", "float", "bool", "str")


@dataclass(frozen=True, slots=True)
class Read:
    """Where a module first reads a config field: the item (possibly in another file) and the
    item-relative span of the field's name in `c.field`."""

    item: Item
    span: A.Span


Lookup = Callable[[str, Item], "Item | None"]


def config_reads(item: Item, owner: A.ModuleDef | A.FnDef, param: str, lookup: Lookup) -> dict[str, Read]:
    """The fields of config parameter `param` of `owner` (a module, or a function of `item`)
    that it reads, directly or through the modules and functions it passes the config to,
    each with its first read in source order. `lookup(name, site)` finds the item a name
    written in `site` names (imports.Globals)."""
    reads: dict[str, Read] = {}
    seen: set[tuple[int, str]] = set()
    stack = [(item, owner, param)]
    while stack:
        site, node, name = stack.pop()
        if (id(node), name) in seen:
            continue
        seen.add((id(node), name))
        for n in A.walk(node):
            if isinstance(n, A.Attr) and isinstance(n.value, A.Name) and n.value.id == name:
                reads.setdefault(n.name.id, Read(site, n.name.span))
            elif isinstance(n, A.Let) and isinstance(n.value, A.Name) and n.value.id == name and not n.is_tuple:
                stack.extend((site, node, t.id) for t in n.targets)  # `let d = c`: what `d` reads, `c` does
            elif isinstance(n, A.Call):
                for callee_site, callee, callee_param in _passed_on(site, node, n, name, lookup):
                    stack.append((callee_site, callee, callee_param))
    return reads


def _passed_on(site: Item, owner: A.Node, call: A.Call, name: str, lookup: Lookup):
    """The (item, definition, parameter) that `call` binds to the bare name `name`, when it
    passes it: a module or function of the file's namespace, or a method of the same module."""
    passes = [i for i, a in enumerate(call.args) if isinstance(a.value, A.Name) and a.value.id == name]
    if not passes or not isinstance(call.func, A.Name):
        return
    callee_site, callee = None, None
    module = site.ast if isinstance(site.ast, A.ModuleDef) else None
    if module is not None:
        callee = next(
            (m for m in A.flat_members(module.members) if isinstance(m, A.FnDef) and m.name.id == call.func.id), None
        )
        callee_site = site
    if callee is None:
        found = lookup(call.func.id, site)
        if found is None or not isinstance(found.ast, (A.ModuleDef, A.FnDef)):
            return
        callee_site, callee = found, found.ast
    params = callee.params
    for i in passes:
        arg = call.args[i]
        if arg.name is not None:
            target = next((p for p in params if p.name.id == arg.name.id), None)
        else:
            positional = sum(1 for a in call.args[:i] if a.name is None)
            target = params[positional] if positional < len(params) else None
        if target is not None and isinstance(target.type, A.NamedType) and target.type.name.id not in SCALARS:
            yield callee_site, callee, target.name.id


def param_owner(site: Item, p: A.Param) -> A.ModuleDef | A.FnDef | None:
    """The module or function of `site` that declares parameter `p`."""
    for node in A.definitions(site.ast) if site.ast is not None else ():
        if isinstance(node, (A.ModuleDef, A.FnDef)) and any(q is p for q in node.params):
            return node
    return None


def field_fits(have: A.Type, have_item: Item, want: A.Type, want_item: Item, lookup: Lookup) -> bool:
    """Whether a config field declared `have` (in config `have_item`) can be read where it is
    declared `want` (in `want_item`): the same type, a one-value type of `want`'s kind or
    values, or `want`'s non-optional form. Config types compare by what they name."""
    if isinstance(want, A.LiteralType):
        allowed = {(type(v).__name__, v.value) for v in want.values}
        return isinstance(have, A.LiteralType) and all((type(v).__name__, v.value) in allowed for v in have.values)
    if isinstance(want, A.NamedType):
        if isinstance(have, A.LiteralType):
            return want.name.id == have.kind
        if not isinstance(have, A.NamedType) or (have.optional and not want.optional):
            return False
        if want.name.id in SCALARS or have.name.id in SCALARS:
            return want.name.id == have.name.id
        theirs, ours = lookup(have.name.id, have_item), lookup(want.name.id, want_item)
        return theirs is not None and theirs is ours
    if isinstance(want, A.ListType):
        return isinstance(have, A.ListType) and field_fits(have.item, have_item, want.item, want_item, lookup)
    return False


def type_text(item: Item, t: A.Node) -> str:
    """The source text of a declaration's type (`RopeScaling?`, `false`)."""
    return " ".join(item.text[t.span.start : t.span.end].split())
