"""The root model's check again, following its calls into each module instance with that instance's values.

A module is checked once for every value of its int parameters (`DownBlock(c, in_channels, out_channels, scale)`
keeps `in_channels` symbolic), so what only some instances break (a GroupNorm over channels its group count does
not divide, a return shape right for one `scale` and not another) passed `linnet check`, and lowering, which
builds each instance with its numbers, refused it. So once the file's checks are clean, the root model is checked
again under each binding with `ItemChecker.follow` set: a call into a module of the model's file checks the
callee's body again with the instance's values, the arguments' types and the dims solved at the call
(`specialize.first_error_at`, recursively) where the call knows more than the callee's own check did
(`specialize.worth_following`), and a loop over a list of submodules checks its body once per element, as
lowering unrolls it. The first error is reported at the model's call that leads to it.

Not in an item's own check: what it finds depends on the callees' bodies, which an item's cached check does not
follow. What it finds is kept (`CheckContext.followed`) until an item it read is replaced or edited: an edit in
one module's body checks again the model and the instances that lead into that module, nothing else. Only the
model's file: a module imported from another is checked under the configs the importer gives it (`imported.py`),
and the standard library's bodies at each call (`specialize.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .checker import ItemChecker
from .diagnostics import Finding
from .scope import type_key
from .specialize import followed

if TYPE_CHECKING:
    from .program import Analysis


def instance_findings(analysis: "Analysis") -> list[Finding]:
    """The first error of the root model's check with its calls followed into each instance (`follow`), under
    each of its bindings, with the presets it occurs under."""
    model = analysis.model
    ia = analysis.items.get(model) if model is not None else None
    ctx = analysis.context
    if ia is None or ctx is None:
        return []
    if ctx.follow_atoms.get("model") is not model:  # the atoms of another model's (or text's) signatures
        ctx.follow_atoms.clear()
        ctx.follow_atoms["model"] = model
    out: list[Finding] = []
    for (names, _), binding in zip(ia.results, ia.bindings):
        checker = ItemChecker(ctx, model, binding)
        checker.follow = model.source
        key = ("model", model, tuple((k, type_key(v)) for k, v in binding.items()))
        found = followed(checker, model, key, _first_error_of(checker))
        if found is None:
            continue
        where = ", ".join(f"`{n}`" for n in names or ())
        scenario = (
            f"under {'presets' if len(names) > 1 else 'preset'} {where}" if names else "under the config defaults"
        )
        out.append(
            Finding(
                found.code,
                found.message,
                found.anchor,
                label=found.label,
                labels=list(found.labels),
                notes=[scenario] + list(found.notes),
            )
        )
    return out


def _first_error_of(checker: ItemChecker):
    """A function that checks `checker`'s item whole and returns its first error (None: clean)."""
    return lambda: next((f for f in checker.run().findings if f.severity in (None, "error")), None)
