"""Attributes: `@weights("...")` on a preset names its default weights; `@name("...")` on a
parameter or submodule gives its checkpoint name where it differs from the member's name;
`@composite` on a standard-library function says backends may run it as a native kernel (it
is lowered as a `composite` op whose body is its meaning). Nothing else takes attributes;
`@weights` and `@name` take one string, `@composite` nothing."""

from __future__ import annotations

from pathlib import Path

from ..syntax import ast as A
from ..syntax.items import Item
from .diagnostics import Finding, LocalAnchor

_ALLOWED = {
    A.PresetDef: ("weights", 'a preset\'s default weights: an embedded id (`@weights("smollm2-135m-instruct")`)'),
    A.FieldDecl: ("name", 'the checkpoint name of this member (`@name("LayerNorm")`)'),
    A.FnDef: ("composite", "a standard-library function backends may run as a native kernel"),
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


STD_LIBRARY = Path(__file__).resolve().parent.parent / "std"


def _in_std_library(item: Item) -> bool:
    """A standard-library file checked as a file of its own (`linnet check linnet/std`)."""
    return Path(item.source.path).resolve().parent == STD_LIBRARY


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
            elif name == "composite":
                if attr.args:
                    out.append(Finding("L111", "`@composite` takes no arguments", LocalAnchor(item, attr.span)))
                elif not (item.is_std or _in_std_library(item)):
                    out.append(
                        Finding(
                            "L111",
                            "`@composite` marks a standard-library function a backend may run as a native kernel; "
                            "a function of your own runs as written",
                            LocalAnchor(item, attr.span),
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
