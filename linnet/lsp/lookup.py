"""What is at a place in a document: the word under the cursor, the definition a symbol
names, the header text and doc comment of a definition. Shared by hover, completion and
signature help."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from linnet.semantics.configs import MISSING, ConfigValue
from linnet.semantics.diagnostics import LocalAnchor, SymbolAnchor
from linnet.semantics.program import Analysis, find_symbol
from linnet.syntax import ast as A
from linnet.syntax.items import Item
from linnet.syntax.positions import split_lines

_WORD = re.compile(r"[A-Za-z_]\w*")

DEFINITIONS = (A.FnDef, A.ModuleDef, A.ConfigDef, A.PresetDef, A.ConfigField, A.FieldDecl, A.StateDecl, A.Param)


def line_start(text: str, offset: int) -> int:
    """The offset where the line holding `offset` starts (lines end at `\\n`, `\\r\\n` or `\\r`)."""
    return max(text.rfind("\n", 0, offset), text.rfind("\r", 0, offset)) + 1


def place_kind(text: str, offset: int) -> str:
    """ "code", "comment" or "string": what a character typed at `offset` would be part of.
    Comments and strings end at the line's end (as in `linnet.syntax.parser.code_mask`)."""
    line = text[line_start(text, offset) : offset]
    in_string = False
    i = 0
    while i < len(line):
        ch = line[i]
        if in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "#":
            return "comment"
        i += 1
    return "string" if in_string else "code"


def word_at(text: str, offset: int) -> tuple[str, int, int] | None:
    """The identifier touching `offset` (character offset), with its start and end."""
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    m = _WORD.match(text, start)
    if m is None or m.end() < offset:
        return None
    return m.group(), m.start(), m.end()


@dataclass
class Definition:
    """A definition found from an anchor: the item, the node (None for locals) and the span of
    its name (item-relative)."""

    item: Item
    node: A.Node | None
    name_span: A.Span


def find_definition(analysis: Analysis, target) -> Definition | None:
    """The definition an anchor (from `Analysis.symbol_at`) names."""
    if isinstance(target, LocalAnchor):
        node = _definition_node(target.item, target.span)
        return Definition(target.item, node, target.span)
    if isinstance(target, SymbolAnchor) and analysis.globals is not None:
        found = find_symbol(target, analysis.globals, analysis.document.workspace)
        if found is None:
            return None
        item, span = found
        return Definition(item, _definition_node(item, span), span)
    return None


def _definition_node(item: Item, span: A.Span) -> A.Node | None:
    if item.ast is None:
        return None
    for node in reversed(A.node_at(item.ast, span.start)):
        if isinstance(node, DEFINITIONS):
            name = node.name
            if name.span == span or node.span == span:
                return node
    return None


def header(item: Item, node: A.Node) -> str:
    """A definition as its signature: a function or module up to its `{`, a field or
    parameter whole; whitespace collapsed."""
    text = item.text[node.span.start : node.span.end]
    if isinstance(node, A.FnDef):
        text = item.text[node.span.start : node.body.span.start]
    elif isinstance(node, (A.ModuleDef, A.ConfigDef)):
        brace = text.find("{")
        text = text[:brace] if brace >= 0 else text
    elif isinstance(node, A.PresetDef):
        brace = text.find("{")
        text = text[:brace] if brace >= 0 else text
    lines = [ln for ln in split_lines(text) if not ln.lstrip().startswith(("#", "@"))]
    return " ".join(" ".join(lines).split()).rstrip(" ,")


def doc_of(node: A.Node | None) -> str | None:
    return getattr(node, "doc", None) if node is not None else None


def value_text(value) -> str:
    """A config field's value as Linnet writes it: `576`, `1e-05`, `"silu"`, `true`, `none`,
    `[1, 2]`, `RopeScaling { … }`."""
    if isinstance(value, ConfigValue):
        return f"{value.type_name} {{ … }}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, float):
        return re.sub(r"e([+-])0+(\d)", r"e\1\2", repr(value))  # 1e-5, as sources write it
    return str(value)


def field_value(analysis: Analysis, config: Item, name: str, preset: str | None) -> tuple[str, str] | None:
    """The value of field `name` of config `config` under `preset` (else the file's first
    preset), as `value_text` writes it, and that preset's name; None without presets or when
    no preset binds that config."""
    wanted = preset or (analysis.presets[0] if analysis.presets else None)
    for scenario in analysis.scenarios:
        if scenario.name != wanted:
            continue
        for value in scenario.configs.values():
            if isinstance(value, ConfigValue) and value.item is config and name in value.values:
                if value.values[name] is MISSING:
                    return None
                return value_text(value.values[name]), scenario.name
    return None
