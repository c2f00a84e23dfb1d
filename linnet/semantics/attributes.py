"""Attributes: `@weights("...")` on a preset names its default weights; `@name("...")` on a
parameter or submodule gives its checkpoint name where it differs from the member's name.
Nothing else takes attributes, and each takes one string."""

from __future__ import annotations

from ..syntax import ast as A
from ..syntax.items import Item
from .diagnostics import Finding, LocalAnchor

_ALLOWED = {
    A.PresetDef: ("weights", 'a preset\'s default weights: an embedded id (`@weights("smollm2-135m-instruct")`)'),
    A.FieldDecl: ("name", 'the checkpoint name of this member (`@name("LayerNorm")`)'),
}

_WHAT = {
    A.PresetDef: "a preset",
    A.ConfigDef: "a config",
    A.ConfigField: "a config field",
    A.ModuleDef: "a module",
    A.FnDef: "a function",
    A.FieldDecl: "a member",
    A.StateDecl: "module state",
}


def check_attributes(item: Item) -> list[Finding]:
    """Findings for attributes where none is allowed, unknown ones, and malformed ones."""
    if item.ast is None:
        return []
    out = []
    for node in A.definitions(item.ast):
        allowed = _ALLOWED.get(type(node))
        for attr in getattr(node, "attributes", ()):
            name = attr.name.id
            where = _WHAT.get(type(node), "this")
            if allowed is None or allowed[0] != name:
                hint = f"; `@{allowed[0]}` is" if allowed else "; attributes are"
                hint += " allowed here" if allowed else " `@weights` on presets and `@name` on members"
                out.append(
                    Finding(
                        "L111", f"`@{name}` is not an attribute of {where}{hint}", LocalAnchor(item, attr.name.span)
                    )
                )
            elif len(attr.args) != 1 or attr.args[0].name is not None or not isinstance(attr.args[0].value, A.StrLit):
                out.append(Finding("L111", f"`@{name}` takes one string: {allowed[1]}", LocalAnchor(item, attr.span)))
            elif name == "name" and not attr.args[0].value.value.isidentifier():
                out.append(
                    Finding(
                        "L111",
                        "`@name` gives one segment of a checkpoint name: a name without `.`",
                        LocalAnchor(item, attr.args[0].value.span),
                    )
                )
    return out
