"""Which checkpoint a preset names, and whether it can be checked against the file's model: read from an
analysis alone (no IR), so the language server asks it on every check without importing the compiler's lowering.
`linnet.ir.build` re-exports both."""

from __future__ import annotations

from ..syntax import ast as A
from ..syntax.items import Location
from .program import Analysis


def preset_weights_at(analysis: Analysis, preset: str | None) -> tuple[str, Location] | None:
    """The `@weights("...")` default of a preset in the analysed document and where its string is written
    (an embedded id, or a path, relative to the `.linnet` file), if it has one."""
    for item in analysis.document.items:
        if item.kind == "preset" and item.name == preset and isinstance(item.ast, A.PresetDef):
            for attr in item.ast.attributes:
                if attr.name.id == "weights" and attr.args and isinstance(attr.args[0].value, A.StrLit):
                    return attr.args[0].value.value, item.resolve(attr.args[0].span)
    return None


def preset_model_mismatch(analysis: Analysis, preset: str) -> str | None:
    """Why `preset`'s weights cannot be checked against the analysed document's root model, or None when they can:
    the preset configures another config type than the one the root model takes (a file holding a Llama model
    and a BERT preset), or the document has no root model. The reason reads after "preset `NAME` ..."."""
    model = analysis.model
    if model is None or not isinstance(model.ast, A.ModuleDef):
        return "has no root `model` in this file to be checked against"
    takes = [p.type.name.id for p in model.ast.params if isinstance(p.type, A.NamedType)]
    for item in analysis.document.items:
        if item.kind == "preset" and item.name == preset and isinstance(item.ast, A.PresetDef):
            configures = item.ast.value.type_name.id
            if takes and configures not in takes:
                return (
                    f"configures `{configures}`, but the root model `{model.ast.name.id}` takes "
                    f"`{'`, `'.join(takes)}`: its weights are not checked against this file's model"
                )
    return None
