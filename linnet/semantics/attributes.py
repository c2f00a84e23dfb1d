"""Attributes: `@weights("...")` on a preset names its default weights; `@name("...")` on a
parameter or submodule gives its checkpoint name where it differs from the member's name;
`@composite` on a standard-library function says backends may run it as a native kernel (it
is lowered as a `composite` op whose body is its meaning); `@inert("use_cache", ...)` on a
config lists the keys a checkpoint's config may hold that do not affect the computation
(loading skips them; any other key that is not a field is an error); `@takes_part` on a
`model` says its parameters are a part of the checkpoints it loads (an encoder from a model
with a task head), so the checkpoint tensors no parameter takes are a note, not an error;
`@quantized("mxfp4")` on a parameter says a checkpoint may store it in that format (GPT-OSS's
experts: `W_blocks` and `W_scales`, read when the checkpoint's `quantization_config` names the
format, which the source's config must then declare), dequantized at load; `@unread("why")` on a
member says no entry reads it on purpose (the checkpoint holds it, the source implements no use of
it), so warning L904 does not report it.
Nothing else takes attributes; `@weights`, `@name`, `@quantized` and `@unread` take one string, `@composite`
nothing, `@inert` one or more strings, `@takes_part` nothing or the checkpoint prefix (one string)."""

from __future__ import annotations

from pathlib import Path

from ..syntax import ast as A
from ..syntax.items import Item
from .diagnostics import Finding, LocalAnchor

_ALLOWED = {
    A.PresetDef: ("weights", 'a preset\'s default weights: an embedded id (`@weights("smollm2-135m-instruct")`)'),
    A.ConfigDef: ("inert", 'the checkpoint config keys that do not affect the computation (`@inert("use_cache")`)'),
    A.FieldDecl: ("name", 'the checkpoint name of this member (`@name("LayerNorm")`)'),
    A.FnDef: ("composite", "a standard-library function backends may run as a native kernel"),
    A.ModuleDef: ("takes_part", 'a model whose parameters are a part of its checkpoints (`@takes_part("roberta")`)'),
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
        if isinstance(node, A.ModuleDef) and not node.is_model:
            allowed = None  # a module is a part of a model; only the loaded root takes a part of a checkpoint
        for attr in getattr(node, "attributes", ()):
            name = attr.name.id
            where = "a model" if isinstance(node, A.ModuleDef) and node.is_model else _WHAT.get(type(node), "this")
            if isinstance(node, A.FieldDecl) and name == "quantized":
                out += _check_quantized(item, node, attr)
                continue
            if isinstance(node, A.FieldDecl) and name == "unread":
                if len(attr.args) != 1 or attr.args[0].name is not None or not isinstance(attr.args[0].value, A.StrLit):
                    message = '`@unread` takes one string: why no entry reads this member (`@unread("unused")`)'
                    out.append(Finding("L111", message, LocalAnchor(item, attr.span)))
                continue
            if allowed is None or allowed[0] != name:
                hint = f"; `@{allowed[0]}` is" if allowed else "; attributes are"
                hint += (
                    " allowed here"
                    if allowed
                    else " `@weights` on presets, `@inert` on configs, `@name`, `@quantized` and `@unread` on "
                    "members and `@takes_part` on a model"
                )
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
            elif name == "inert":
                out += _check_inert(item, node, attr)
            elif name == "takes_part":
                out += _check_takes_part(item, attr)
            elif len(attr.args) != 1 or attr.args[0].name is not None or not isinstance(attr.args[0].value, A.StrLit):
                out.append(Finding("L111", f"`@{name}` takes one string: {allowed[1]}", LocalAnchor(item, attr.span)))
            elif name == "name" and not _dotted_name(attr.args[0].value.value):
                out.append(
                    Finding(
                        "L111",
                        '`@name` gives the checkpoint name of a member: names or numbers joined by `.` (`"layer.0"`)',
                        LocalAnchor(item, attr.args[0].value.span),
                    )
                )
    return out


def _dotted_name(text: str) -> bool:
    """A checkpoint name: one segment (`LayerNorm`) or several joined by `.`, each a name or a
    number (T5's `layer.0`, a submodule list flattened into its parent's numbering)."""
    segments = text.split(".")
    return segments[0].isidentifier() and all(s.isidentifier() or s.isdigit() for s in segments)


def unread_reason(member) -> str | None:
    """The reason a member's `@unread("...")` gives, or None (no such attribute)."""
    for attr in getattr(member, "attributes", ()):
        if attr.name.id == "unread" and len(attr.args) == 1 and isinstance(attr.args[0].value, A.StrLit):
            return attr.args[0].value.value
    return None


def _check_inert(item: Item, config: A.ConfigDef, attr: A.Attribute) -> list[Finding]:
    """`@inert` takes one or more strings, each a key that is not a field of the config (a field
    is checked against the checkpoint; it cannot also be skipped) and not listed twice."""
    if not attr.args or any(a.name is not None or not isinstance(a.value, A.StrLit) for a in attr.args):
        message = f"`@inert` takes one or more strings: {_ALLOWED[A.ConfigDef][1]}"
        return [Finding("L111", message, LocalAnchor(item, attr.span))]
    fields = {f.name.id for f in config.fields if isinstance(f, A.ConfigField)}
    out, seen = [], set()
    for arg in attr.args:
        key = arg.value.value
        if key in fields:
            message = f"`{key}` is a field of `{config.name.id}`: a field is checked against the checkpoint, not inert"
        elif key in seen:
            message = f"`{key}` is listed twice"
        else:
            seen.add(key)
            continue
        out.append(Finding("L111", message, LocalAnchor(item, arg.value.span)))
    return out


def _check_takes_part(item: Item, attr: A.Attribute) -> list[Finding]:
    """`@takes_part` takes nothing (the prefix is found in the checkpoint) or one string: the
    checkpoint prefix of the model's parameters, segments joined by `.` (`"roberta"`,
    `"model.encoder"`), without a leading or trailing `.`."""
    if not attr.args:
        return []
    arg = attr.args[0].value
    if len(attr.args) != 1 or attr.args[0].name is not None or not isinstance(arg, A.StrLit):
        return [Finding("L111", f"`@takes_part` takes nothing or one string: {_ALLOWED[A.ModuleDef][1]}",
                        LocalAnchor(item, attr.span))]  # fmt: skip
    if not all(segment.isidentifier() or segment.isdigit() for segment in arg.value.split(".")):
        message = '`@takes_part` gives the checkpoint prefix: names joined by `.` (`"model.encoder"`)'
        return [Finding("L111", message, LocalAnchor(item, arg.span))]
    return []


# The checkpoint formats `@quantized` names, each read by the loader (linnet/runtimes/formats/mxfp4.py).
QUANTIZED_FORMATS = ("mxfp4",)


def _check_quantized(item: Item, member: A.FieldDecl, attr: A.Attribute) -> list[Finding]:
    """`@quantized` takes one string, a format of `QUANTIZED_FORMATS`, on a parameter (a member
    whose type is a tensor, not a submodule)."""
    arg = attr.args[0].value if len(attr.args) == 1 and attr.args[0].name is None else None
    if not isinstance(arg, A.StrLit):
        message = '`@quantized` takes one string: the format a checkpoint may store the parameter in (`"mxfp4"`)'
        return [Finding("L111", message, LocalAnchor(item, attr.span))]
    if arg.value not in QUANTIZED_FORMATS:
        message = f"`@quantized` names a format the loader reads ({', '.join(QUANTIZED_FORMATS)}), not {arg.value!r}"
        return [Finding("L111", message, LocalAnchor(item, arg.span))]
    if member.kind != "param":
        message = "`@quantized` marks a parameter (a tensor member); a submodule's parameters take it themselves"
        return [Finding("L111", message, LocalAnchor(item, attr.span))]
    return []


def quantized_attribute(member: A.FieldDecl) -> str | None:
    """The format a member's `@quantized("...")` names, or None."""
    for attr in getattr(member, "attributes", ()):
        if attr.name.id == "quantized" and len(attr.args) == 1 and isinstance(attr.args[0].value, A.StrLit):
            return attr.args[0].value.value
    return None


def takes_part(model: A.ModuleDef) -> tuple[bool, str | None]:
    """(whether the model takes a part of its checkpoints, the prefix its `@takes_part` names or None)."""
    for attr in model.attributes:
        if attr.name.id == "takes_part":
            args = [a.value.value for a in attr.args if isinstance(a.value, A.StrLit)]
            return True, (args[0] if args else None)
    return False, None


def inert_keys(config: A.ConfigDef) -> list[str]:
    """The keys a config's `@inert(...)` attributes list, in order."""
    return [
        a.value.value
        for attr in config.attributes
        if attr.name.id == "inert"
        for a in attr.args
        if isinstance(a.value, A.StrLit)
    ]
