"""A readable dump of the syntax tree, used by the parser golden tests.

One node per line, indented by depth: `Kind@start..end field=value`. Spans are absolute
character offsets in the source.
"""

from __future__ import annotations

from . import ast as A

_SCALARS = ("id", "value", "op", "kind", "entry", "is_model", "optional", "is_tuple", "bound", "doc")


def dump(node: A.Node, base: int = 0, indent: int = 0) -> str:
    lines: list[str] = []
    _dump(node, base, indent, lines, label=None)
    return "\n".join(lines)


def _dump(node: A.Node, base: int, indent: int, lines: list[str], label: str | None) -> None:
    attrs = []
    for name in _SCALARS:
        if name in node.__slots__:
            value = getattr(node, name)
            if isinstance(value, A.Node):
                continue
            if name == "doc" and value is None:
                continue
            if isinstance(node, A.FloatLit) and name == "value":
                value = node.text
            if value is False and name in ("entry", "is_model", "optional", "is_tuple"):
                continue
            attrs.append(f"{name}={value!r}")
    where = f"{base + node.span.start}..{base + node.span.end}"
    head = f"{'  ' * indent}{label + ': ' if label else ''}{type(node).__name__}@{where}"
    lines.append(" ".join([head] + attrs))
    for name in node.__slots__:
        value = getattr(node, name)
        if (name in _SCALARS and not isinstance(value, A.Node)) or name == "span" or name.endswith("_span"):
            continue
        if isinstance(value, A.Node):
            _dump(value, base, indent + 1, lines, name)
        elif isinstance(value, list) and value and isinstance(value[0], A.Node):
            lines.append(f"{'  ' * (indent + 1)}{name}:")
            for v in value:
                _dump(v, base, indent + 2, lines, None)
