"""Where the source declares the member a checkpoint path names: `model.layers.0.self_attn.q_proj.weight` walked from
the root model through its members. `linnet check --weights` places a weight problem with it, `linnet diff` a
module's difference, and the language server the diff's diagnostic."""

from __future__ import annotations

from ..syntax import ast as A
from ..syntax.items import Location
from .members import checkpoint_name_attribute


def member_location(analysis, path: str, dotted: str) -> Location | None:
    """Walk `dotted` from the root model of `analysis` through its members (checkpoint names, `@name(...)` included;
    a list's index skipped) and return the last member found declared in the file `path` (None when the first is
    not there, or the source has no root model)."""
    item = analysis.model
    found = None
    parts = dotted.split(".") if dotted else []
    i = 0
    while item is not None and isinstance(item.ast, A.ModuleDef) and i < len(parts):
        member = next(
            (
                m
                for m in A.flat_members(item.ast.members)
                if isinstance(m, A.FieldDecl) and (checkpoint_name_attribute(m) or m.name.id) == parts[i]
            ),
            None,
        )
        if member is None:
            break
        if item.source.path == path:
            found = item.resolve(member.name.span)
        i += 2 if member.kind == "list" else 1
        func = member.ctor.func if member.ctor is not None else None
        item = analysis.globals(func.id, item) if isinstance(func, A.Name) and analysis.globals else None
    return found
