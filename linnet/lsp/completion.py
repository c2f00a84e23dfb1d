"""textDocument/completion and textDocument/signatureHelp.

Completion offers, after `x.`, the members of what `x` is (a config's fields, a module's
members and methods, a tensor's `dtype`); elsewhere the names in scope at the cursor
(function and module parameters, `let`s above it, loop variables, dims, members), the
file's and the standard library's items, the primitive ops with their signatures and docs,
keywords, dtypes, and item snippets at the start of a line. Where only a type can go (`fn f(y: |`,
`-> |`) it offers types, and at a field name of a config value (`MlpConfig { in_features = 8, | }`)
the fields not yet set (`completion_context`). It reads the text before the cursor, so it works
while the statement being typed does not parse.
"""

from __future__ import annotations

from dataclasses import dataclass

from linnet.ops import REGISTRY
from linnet.semantics.configs import MISSING, SCALAR_TYPES, ConfigValue
from linnet.semantics.describe import dotted
from linnet.semantics.program import Analysis
from linnet.syntax import ast as A
from linnet.syntax.items import Item
from linnet.syntax.parser import code_mask
from linnet.types.core import DTYPES, ConfigT, ModuleListT, ModuleT, TensorT

from .completion_context import BEFORE_ITEM_CHARS, Place, completion_place
from .lookup import doc_of, field_value, header, line_start, place_kind, value_text
from .navigation import KEYWORDS

LOAD_TIME_DIMS = ("max_batch", "max_positions")

SNIPPETS = {
    "module": (
        "module ${1:Name}(c: ${2:Config}) {\n    ${3:member}: ${4:Linear(c.hidden_size, c.hidden_size)}\n\n"
        "    fn forward(x: [B, S, c.hidden_size]) -> [B, S, c.hidden_size] {\n        ${0:x}\n    }\n}"
    ),
    "model": (
        "model ${1:Name}(c: ${2:Config}) {\n    entry fn forward(input_ids: i64[B, S]) -> [B, S, c.vocab_size] {\n"
        "        ${0}\n    }\n}"
    ),
    "fn": "fn ${1:name}(${2:x: [..., D]}) -> ${3:[..., D]} {\n    ${0:x}\n}",
    "config": "config ${1:Name} {\n    ${2:hidden_size}: ${3:int} = ${4:768}\n}",
    "preset": "preset ${1:name} = ${2:Config} {\n    ${0}\n}",
    "from": 'from "${1:file.linnet}" import ${0:Name}',
}
BODY_SNIPPETS = {
    "let": "let ${1:name} = ${0}",
    "for": "for ${1:layer} in ${2:layers} {\n    ${0}\n}",
    "if": "if ${1:cond} {\n    ${2}\n} else {\n    ${0}\n}",
}


@dataclass
class Completion:
    """One completion: label, kind (an LSP CompletionItemKind name), detail (a signature or
    type), documentation (markdown), for snippets the snippet text, and the character range
    the label replaces when it is not the word before the cursor (a path in a string)."""

    label: str
    kind: str
    detail: str = ""
    documentation: str | None = None
    snippet: str | None = None
    sort: str = "5"
    replace: tuple[int, int] | None = None


def _chain_before(text: str, end: int) -> str:
    """The dotted name ending at `end` (`model.embed_tokens` before a `.`)."""
    start = end
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_."):
        start -= 1
    return text[start:end].strip(".")


def _type_of_chain(analysis: Analysis, item: Item, chain: str, preset: str | None):
    """The type of a dotted name as recorded anywhere in the item's check (the statement being
    typed may not parse, but the name usually occurs elsewhere)."""
    for _, result in analysis.results_for(item, preset):
        for node, t in result.types.items():
            if isinstance(node, (A.Name, A.Attr)) and dotted(node) == chain:
                return t
    if item.ast is not None and "." not in chain:
        params = list(getattr(item.ast, "params", []))
        for node in A.walk(item.ast):
            if isinstance(node, A.FnDef):
                params.extend(node.params)
        for p in params:
            if p.name.id == chain and isinstance(p.type, A.NamedType) and analysis.globals is not None:
                target = analysis.globals(p.type.name.id)
                if target is not None and target.kind == "config":
                    return target
    return None


def _config_fields(analysis: Analysis, config: Item, preset: str | None, value=None) -> list[Completion]:
    """A config's fields, each detailed with its value under `preset` as hover shows it
    (`hidden_size: int = 576 (smollm2_135m)`), else as declared (with its default). `value`:
    the ConfigValue the check bound (a nested config's value is found only there)."""
    out = []
    if isinstance(config.ast, A.ConfigDef):
        for f in config.ast.fields:
            if isinstance(f, A.ConfigField):
                detail = header(config, f)
                shown = field_value(analysis, config, f.name.id, preset)
                if shown is None and isinstance(value, ConfigValue) and f.name.id in value.values:
                    if value.values[f.name.id] is not MISSING:
                        shown = (value_text(value.values[f.name.id]), None)
                if shown is not None:
                    declared = detail.split(" = ", 1)[0]
                    detail = f"{declared} = {shown[0]}" + (f" ({shown[1]})" if shown[1] else "")
                out.append(Completion(f.name.id, "Field", detail, doc_of(f), sort="1"))
    return out


def _module_members(module: Item) -> list[Completion]:
    out = []
    if isinstance(module.ast, A.ModuleDef):
        for m in A.flat_members(module.ast.members):
            if isinstance(m, A.FnDef):
                out.append(Completion(m.name.id, "Method", header(module, m), doc_of(m), sort="1"))
            elif isinstance(m, (A.FieldDecl, A.StateDecl)):
                kind = "Module" if isinstance(m, A.FieldDecl) and m.kind != "param" else "Field"
                out.append(Completion(m.name.id, kind, header(module, m), doc_of(m), sort="1"))
    return out


def member_completions(analysis: Analysis, item: Item, chain: str, preset: str | None) -> list[Completion]:
    t = _type_of_chain(analysis, item, chain, preset)
    if isinstance(t, Item):
        return _config_fields(analysis, t, preset)
    if isinstance(t, ConfigT):
        return _config_fields(analysis, t.value.item, preset, t.value)
    if isinstance(t, (ModuleT, ModuleListT)):
        return _module_members(t.instance.item)
    if isinstance(t, TensorT):
        return [Completion("dtype", "Property", "the tensor's dtype", sort="1")]
    return []


def _scope_names(item: Item, rel: int) -> list[Completion]:
    """Names bound at item-relative offset `rel`: parameters, generics, members, `let`s and
    loop variables of enclosing blocks above it, and dims named in the signature."""
    if item.ast is None:
        return []
    out: dict[str, Completion] = {}

    def add(name: str, kind: str, detail: str = "", doc: str | None = None):
        out.setdefault(name, Completion(name, kind, detail, doc, sort="0"))

    chain = A.node_at(item.ast, rel)
    for node in chain:
        if isinstance(node, A.ModuleDef):
            for p in node.params:
                add(p.name.id, "Variable", header(item, p))
            for m in A.flat_members(node.members):
                if isinstance(m, A.FnDef):
                    add(m.name.id, "Method", header(item, m), doc_of(m))
                elif isinstance(m, (A.FieldDecl, A.StateDecl)):
                    add(m.name.id, "Field", header(item, m), doc_of(m))
            for name in LOAD_TIME_DIMS:
                add(name, "Constant", "load-time dim")
        elif isinstance(node, A.FnDef):
            for g in node.generics:
                add(g.name.id, "TypeParameter", "dtype variable")
            for p in node.params:
                add(p.name.id, "Variable", header(item, p))
                for sub in A.walk(p.type):
                    if isinstance(sub, A.TensorType):
                        for d in sub.dims:
                            if isinstance(d, A.Name) and d.id[:1].isupper():
                                add(d.id, "TypeParameter", "dim")
        elif isinstance(node, A.Block):
            for stmt in node.stmts:
                if stmt.span.start >= rel:
                    break
                if isinstance(stmt, A.Let):
                    for target in stmt.targets:
                        add(target.id, "Variable", "let")
                elif isinstance(stmt, A.ErrorStmt):
                    for name in stmt.bound:
                        add(name, "Variable", "let")
        elif isinstance(node, A.For):
            add(node.var.id, "Variable", "loop variable")
    return list(out.values())


def _type_completions(analysis: Analysis, item: Item | None, rel: int, place: Place) -> list[Completion]:
    """What can start a type: the scalar types, the configs, the dtypes (`f32[B, S]`), a function's dtype
    variables, and in a config field `list`."""
    out = [Completion(n, "Keyword", "type", sort="0") for n in SCALAR_TYPES + (("list",) if place.in_config else ())]
    generics = list(place.generics)
    if not generics and item is not None and item.ast is not None:
        generics = [g.name.id for node in A.node_at(item.ast, rel) if isinstance(node, A.FnDef) for g in node.generics]
    out.extend(Completion(name, "TypeParameter", "dtype variable", sort="0") for name in generics)
    if analysis.globals is not None:
        for name, it in analysis.globals.by_name.items():
            if it.kind == "config":
                out.append(Completion(name, "Struct", header(it, it.ast) if it.ast is not None else "config", sort="1"))
    out.extend(Completion(name, "TypeParameter", "dtype", sort="2") for name in sorted(set(DTYPES) - set(SCALAR_TYPES)))
    return out


def _place_completions(
    analysis: Analysis, item: Item | None, place: Place, start: int, preset: str | None
) -> list[Completion]:
    """Completions where only a type or a config value's field can go (`completion_context`)."""
    if place.kind == "type":
        return _type_completions(analysis, item, start - item.offset if item is not None else 0, place)
    config = analysis.globals(place.config) if analysis.globals is not None else None
    if config is None or config.kind != "config":
        return []
    return [c for c in _config_fields(analysis, config, preset) if c.label not in place.written]


def completions(analysis: Analysis, offset: int, preset: str | None) -> list[Completion]:
    """Completions at character `offset`; none inside comments and strings."""
    text = analysis.document.text
    if place_kind(text, offset) != "code":
        return []
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    item = analysis.item_at(max(0, start - 1)) or analysis.item_at(start)
    begin = line_start(text, start)
    if start > 0 and text[start - 1] == ".":
        chain = _chain_before(text, start - 1)
        if item is None or not chain:
            return []
        return member_completions(analysis, item, chain, preset)
    floor = item.offset if item is not None else max(0, start - BEFORE_ITEM_CHARS)
    limit = item.offset + len(item.text) if item is not None else len(text)
    place = completion_place(text, floor, start, limit)
    if place is not None:
        return _place_completions(analysis, item, place, start, preset)
    if text[begin:start].strip() == "" and start == begin:
        return [Completion(k, "Snippet", f"{k} …", snippet=s, sort="0") for k, s in SNIPPETS.items()] + [
            Completion(k, "Keyword", sort="1") for k in ("entry",)
        ]
    out: list[Completion] = []
    if item is not None:
        out.extend(_scope_names(item, start - item.offset))
    seen = {c.label for c in out}
    if analysis.globals is not None:
        kinds = {"module": "Class", "fn": "Function", "config": "Struct", "preset": "Constant"}
        for name, it in analysis.globals.by_name.items():
            if name in seen or it.kind not in kinds:
                continue
            node = it.ast
            out.append(
                Completion(
                    name, kinds[it.kind], header(it, node) if node is not None else it.kind, doc_of(node), sort="2"
                )
            )
            seen.add(name)
    for name, op in REGISTRY.items():
        if name not in seen:
            out.append(Completion(name, "Function", op.describe(), op.doc or None, sort="3"))
            seen.add(name)
    for name in sorted(DTYPES):
        out.append(Completion(name, "TypeParameter", "dtype", sort="4"))
    for k in sorted(KEYWORDS - {"config", "preset", "module", "model"}):
        out.append(Completion(k, "Keyword", sort="4"))
    for k, s in BODY_SNIPPETS.items():
        out.append(Completion(f"{k} …", "Snippet", k, snippet=s, sort="4"))
    return out


# ----------------------------------------------------------------------------- signature help


@dataclass
class Signature:
    """A callee's signature: its label, the parameters' labels, its doc, and the index of the
    argument the cursor is in."""

    label: str
    parameters: list[tuple[str, str | None]]
    documentation: str | None
    active: int


def _open_call(text: str, offset: int, floor: int) -> tuple[int, int, str | None] | None:
    """The innermost unclosed `(` before `offset` (not before `floor`), brackets in comments
    and strings aside: its offset, the index of the argument the cursor is in, and the keyword
    of that argument if it has one."""
    mask = code_mask(text[floor:offset] + '"')  # the quote closes a string the cursor is in
    depth = 0
    commas = 0
    i = offset - 1
    last_arg_start = offset
    while i >= floor:
        ch = text[i]
        if not mask[i - floor]:
            pass
        elif ch in ")]}":
            depth += 1
        elif ch in "([{":
            if depth == 0:
                if ch != "(":
                    return None
                segment = text[last_arg_start:offset] if commas else text[i + 1 : offset]
                keyword = None
                eq = segment.find("=")
                if eq > 0 and segment[eq + 1 : eq + 2] != "=" and segment[:eq].strip().isidentifier():
                    keyword = segment[:eq].strip()
                return i, commas, keyword
            depth -= 1
        elif ch == "," and depth == 0:
            if commas == 0:
                last_arg_start = i + 1
            commas += 1
        i -= 1
    return None


def _fn_signature(owner: Item, fn: A.FnDef | A.ModuleDef, active: int, keyword: str | None) -> Signature:
    params = [(" ".join(owner.text[p.span.start : p.span.end].split()), None) for p in fn.params]
    names = [p.name.id for p in fn.params]
    if keyword in names:
        active = names.index(keyword)
    return Signature(header(owner, fn), params, doc_of(fn), active)


def signature_help(analysis: Analysis, offset: int, preset: str | None) -> Signature | None:
    text = analysis.document.text
    item = analysis.item_at(offset)
    if item is None or place_kind(text, offset) == "comment":
        return None
    found = _open_call(text, offset, item.offset)
    if found is None:
        return None
    paren, active, keyword = found
    chain = _chain_before(text, paren)
    if not chain:
        return None
    last = chain.rsplit(".", 1)[-1]
    if "." not in chain and last in REGISTRY and (analysis.globals is None or analysis.globals(last) is None):
        op = REGISTRY[last]
        params = [(p.text(), p.doc or None) for p in op.params]  # each a substring of the label
        names = [p.name for p in op.params]
        if keyword in names:
            active = names.index(keyword)
        return Signature(op.signature(), params, op.doc or None, active)
    if "." not in chain and analysis.globals is not None:
        target = analysis.globals(chain)
        if target is not None and isinstance(target.ast, (A.FnDef, A.ModuleDef)):
            return _fn_signature(target, target.ast, active, keyword)
    # a submodule called (its `forward`) or a method of one (`self_attn.step`)
    owner_chain, method = (chain, "forward")
    t = _type_of_chain(analysis, item, chain, preset)
    if not isinstance(t, ModuleT) and "." in chain:
        owner_chain, method = chain.rsplit(".", 1)
        t = _type_of_chain(analysis, item, owner_chain, preset)
    if not isinstance(t, ModuleT) and "." not in chain and isinstance(item.ast, A.ModuleDef):
        # a method of the enclosing module called by its bare name
        for m in A.flat_members(item.ast.members):
            if isinstance(m, A.FnDef) and m.name.id == chain:
                return _fn_signature(item, m, active, keyword)
    if isinstance(t, ModuleT):
        module = t.instance.item
        if isinstance(module.ast, A.ModuleDef):
            for m in A.flat_members(module.ast.members):
                if isinstance(m, A.FnDef) and m.name.id == method:
                    return _fn_signature(module, m, active, keyword)
    return None
