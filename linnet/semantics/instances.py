"""The root model's check again, following its calls into each module instance with that instance's values.

A module is checked once for every value of its int parameters (`DownBlock(c, in_channels, out_channels, scale)`
keeps `in_channels` symbolic), so what only some instances break (a GroupNorm over channels its group count does
not divide, a return shape right for one `scale` and not another) passed `linnet check`, and lowering, which
builds each instance with its numbers, refused it. So once the file's checks are clean, the root model is checked
again under each binding with `ItemChecker.follow` set: a call into a user module checks the callee's body again
with the instance's values, the arguments' types and the dims solved at the call (`specialize.first_error_at`,
recursively), and a loop over an indexed list checks its body once per element, as lowering unrolls it. The first
error is reported at the model's call that leads to it.

Not in an item's own check: what it finds depends on the callees' bodies, which an item's cached check does not
follow; this pass runs on each full analysis that found no error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .checker import ItemChecker
from .diagnostics import Finding

if TYPE_CHECKING:
    from .program import Analysis


def instance_findings(analysis: "Analysis") -> list[Finding]:
    """The first error of the root model's check with its calls followed into each instance (`follow`), under
    each of its bindings, with the presets it occurs under."""
    model = analysis.model
    ia = analysis.items.get(model) if model is not None else None
    if ia is None or analysis.context is None:
        return []
    out: list[Finding] = []
    for (names, _), binding in zip(ia.results, ia.bindings):
        checker = ItemChecker(analysis.context, model, binding)
        checker.follow = True
        result = checker.run()
        found = next((f for f in result.findings if f.severity in (None, "error")), None)
        if found is None:
            continue
        where = ", ".join(f"`{n}`" for n in names or ())
        scenario = [f"under {'presets' if len(names) > 1 else 'preset'} {where}"] if names else ["under the config defaults"]
        out.append(Finding(found.code, found.message, found.anchor, label=found.label, labels=list(found.labels), notes=scenario + list(found.notes)))
    return out
