"""textDocument/hover: the type of what is under the cursor under the selected preset, with
the symbolic form where it differs (`[B, S, c.hidden_size]` = `[B, S, 576]`); a module's, a
function's or an op's signature and doc comment; a parameter's checkpoint names and count; what
the root model, a preset, a module or a member costs, on its declaration (`costs.py`)."""

from __future__ import annotations

from linnet.ops import REGISTRY
from linnet.semantics.diagnostics import SymbolAnchor
from linnet.semantics.program import Analysis
from linnet.semantics.sharing import config_reads
from linnet.syntax import ast as A
from linnet.types.core import ModuleListT, ModuleT, TensorT

from .lookup import doc_of, field_value, find_definition, header, word_at

MAX_EXPR = 48  # characters of the hovered expression quoted in the type line
MAX_NAMES = 4  # checkpoint names listed before "and N more"


def hover_markdown(analysis: Analysis, offset: int, preset: str | None) -> tuple[str, tuple[int, int]] | None:
    """Markdown for the hover at character `offset`, and the absolute range it is about; None
    when there is nothing to say."""
    text = analysis.document.text
    sections: list[str] = []
    span: tuple[int, int] | None = None
    info = analysis.type_at(offset, preset)
    if info is not None:
        span = (info.location.start.offset, info.location.end.offset)
        expr = " ".join(text[span[0] : span[1]].split())
        if len(expr) > MAX_EXPR:
            expr = expr[: MAX_EXPR - 1] + "…"
        if isinstance(info.type, (ModuleT, ModuleListT)):
            sections.append(f"```linnet\n{expr}: {info.concrete}\n```")
        else:
            sections.append(f"```linnet\n{expr}: {info.symbolic}\n```")
            if info.concrete != info.symbolic:
                where = f" under preset `{info.scenario}`" if info.scenario and info.scenario != "defaults" else ""
                sections.append(f"= `{info.concrete}`{where}")
            elif info.scenario and info.scenario != "defaults" and isinstance(info.type, TensorT):
                sections.append(f"under preset `{info.scenario}`")
    target = analysis.symbol_at(offset)
    definition = find_definition(analysis, target) if target is not None else None
    if definition is not None and definition.node is not None:
        signature = header(definition.item, definition.node)
        if not sections or signature not in sections[0]:
            sections.append(f"```linnet\n{signature}\n```")
        if isinstance(definition.node, A.ConfigField):  # its value under the preset, as completion shows it
            shown = field_value(analysis, definition.item, definition.node.name.id, preset)
            if shown is not None:
                sections.append(f"= `{shown[0]}` under preset `{shown[1]}`")
        doc = doc_of(definition.node)
        if doc:
            sections.append(doc)
        reads = _config_reads(analysis, definition.item, definition.node)
        if reads:
            sections.append(reads)
        names = _checkpoint_names(analysis, target, preset)
        if names:
            sections.append(names)
        if _at_declaration(analysis, definition, offset):
            from .costs import cost_section  # loads the IR with the first hover on a declaration

            cost = cost_section(analysis, target, preset)
            if cost:
                sections.append(cost)
    elif target is None:
        word = word_at(text, offset)
        if word is not None and word[0] in REGISTRY:
            op = REGISTRY[word[0]]
            sections.append(f"```linnet\n{op.describe()}\n```")
            if op.doc:
                sections.append(op.doc)
            span = span or (word[1], word[2])
    if not sections:
        return None
    if span is None:
        word = word_at(text, offset)
        span = (word[1], word[2]) if word is not None else (offset, offset)
    return "\n\n".join(sections), span


def _config_reads(analysis: Analysis, item, node) -> str | None:
    """What a module or function reads of each config parameter: the fields another config
    passed in its place must declare (semantics.sharing)."""
    if not isinstance(node, (A.ModuleDef, A.FnDef)) or analysis.globals is None:
        return None
    lines = []
    for p in node.params:
        if not isinstance(p.type, A.NamedType):
            continue
        config = analysis.globals(p.type.name.id, item)
        if config is None or config.kind != "config":
            continue
        fields = config_reads(item, node, p.name.id, analysis.globals)
        if fields:
            shown = ", ".join(f"`{f}`" for f in fields)
            lines.append(
                f"Reads {shown} of `{p.name.id}`: another config than `{config.name}` "
                "can be passed if it declares them."
            )
    return "\n\n".join(lines) or None


def _at_declaration(analysis: Analysis, definition, offset: int) -> bool:
    """Whether `offset` is on the name of `definition` where this document declares it: costs are
    shown there only, so hovering a use never waits for the model to be lowered."""
    item = definition.item
    if item.source.path != analysis.document.source.path:
        return False
    return item.offset + definition.name_span.start <= offset <= item.offset + definition.name_span.end


def _checkpoint_names(analysis: Analysis, target, preset: str | None) -> str | None:
    """For a member parameter or state: its checkpoint names in the root model under the preset
    (`model.layers.{0..29}.self_attn.q_proj.weight`), how many, and their total elements."""
    if not isinstance(target, SymbolAnchor) or len(target.path) != 3 or target.path[1] != "member":
        return None
    wanted = preset or (analysis.presets[0] if analysis.presets else "defaults")
    tree_name = wanted if wanted in analysis.trees else next(iter(analysis.trees), None)
    if tree_name is None:
        return None
    tree = analysis.trees[tree_name]
    found = [t for t in tree.params + tree.state if t.anchor == target]
    if not found:
        return None
    total = 0
    for t in found:
        n = t.numel()
        total = None if n is None or total is None else total + n
    names = [f"`{t.path}`" for t in found[:MAX_NAMES]]
    if len(found) > MAX_NAMES:
        names.append(f"and {len(found) - MAX_NAMES} more")
    kind = "state" if found[0].kind == "state" else "checkpoint"
    count = f", {total:,} elements" if total is not None else ""
    where = f" under preset `{tree_name}`" if tree_name != "defaults" else ""
    return f"{kind} {'tensor' if len(found) == 1 else 'tensors'} ({len(found)}{count}){where}: " + ", ".join(names)
