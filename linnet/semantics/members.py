"""Module instances and their members: binding a module's parameters to a constructor call,
evaluating its members (parameters, submodules, lists, state, methods, what `if` guards),
and refusing modules that contain themselves."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import (
    UNKNOWN,
    ConfigT,
    FnRefT,
    ModuleListT,
    ModuleT,
    NoneT,
    ScalarT,
    TensorT,
    Type,
    UnknownT,
    format_type,
)
from ..types.dims import Dim, const
from .describe import cond_key, cond_text, kind_text
from .diagnostics import Finding, Label, LocalAnchor, symbol
from .names import LOAD_TIME_DIMS, SCALAR_TYPE_NAMES
from .resolved import Arg, CallInfo
from .scope import Binding, FnTarget, Instance, MemberInfo, Members, Scope
from .sharing import config_reads, field_fits, param_owner, type_text

if TYPE_CHECKING:
    from .checker import ItemChecker

# A list of submodules whose elements (each built with its index) are checked one by one up to this length: a
# longer one (a model tree of a million tensors) is checked with its index symbolic only.
MAX_CHECKED_ELEMENTS = 1024


class MembersMixin:
    """Instances and members for `ItemChecker`."""

    def check_containment(self, mdef: A.ModuleDef) -> None:
        """A module may not contain itself, directly or through its submodules."""

        def submodules(m: A.ModuleDef):
            for member in A.flat_members(m.members):
                if isinstance(member, A.FieldDecl) and member.ctor is not None and isinstance(member.ctor.func, A.Name):
                    yield member, member.ctor.func.id

        for member, name in submodules(mdef):
            path = [mdef.name.id, name]
            stack = [(name, self.item, path)]  # a name, the item that uses it, the chain to it
            seen = set()
            while stack:
                current, site, chain = stack.pop()
                item = self.global_item(current, site)
                if item is self.item:
                    self.report("L111", f"`{mdef.name.id}` contains itself: {' -> '.join(chain)}", member.ctor.func)
                    return
                if item is None or item in seen or not isinstance(item.ast, A.ModuleDef):
                    continue
                seen.add(item)
                for _, sub in submodules(item.ast):
                    stack.append((sub, item, chain + [sub]))

    def module_scope(self, inst: Instance) -> Scope:
        """The scope of a module's members and functions: its parameters bound to the
        instance's values, and the load-time dims. Shared: nothing binds into it later."""
        if inst.scope is not None:
            return inst.scope
        scope = Scope(self.global_scope(), "module")
        mdef = inst.module
        for p in mdef.params:
            t = inst.args.get(p.name.id, UNKNOWN)
            scope.bind(p.name.id, Binding(t, "module_param", symbol(inst.item, "param", p.name.id), p.name))
        for name, atom in LOAD_TIME_DIMS.items():
            scope.bind(name, Binding(ScalarT("int", Dim.atom(atom)), "dim", None))
        scope.instance = inst
        inst.scope = scope
        return scope

    def instantiate(self, item: Item, args: list[A.Arg], scope: Scope, call: A.Node) -> Instance | None:
        """Bind a module's parameters to a constructor call's arguments."""
        mdef: A.ModuleDef = item.ast
        matched = self.match_args(
            [p.name.id for p in mdef.params],
            {p.name.id: p.default is not None for p in mdef.params},
            args,
            f"`{mdef.name.id}`",
            call,
            scope,
            owner_path=(mdef.name.id, "param"),
            owner_file=item.source.path,
        )
        if matched is None:
            return None
        callee_scope = Scope(self.global_scope(), "module")
        values: dict[str, Type] = {}
        ok = True
        info = self.result.call_info[call] = CallInfo("module", mdef, item) if isinstance(call, A.Call) else None
        for p in mdef.params:
            name = p.name.id
            if name in matched:
                arg = matched[name]
                t = self.expr(arg.value, scope)
                node = arg.value
            else:
                t = self.silent_expr(p.default, callee_scope, item)
                node = call
            t = self.check_compile_time_arg(p, t, node, f"`{mdef.name.id}`", item)
            if t is None:
                ok = False
                t = UNKNOWN
            values[name] = t
            callee_scope.bind(name, Binding(t, "module_param"))
            if info is not None:
                given = matched.get(name)
                info.args[name] = Arg(name, given.value if given else None, t, None if given else p.default)
        inst = Instance(item, values)
        if ok:
            members = self.members(inst, report=False)
            for f in members.findings:
                # L409 is reported at its own argument already, by the check of the module that
                # builds it (a config that passes here passes there: the reads are transitive).
                if f.code[1] in "24" and f.code != "L409":
                    self.report(
                        f.code,
                        f"in `{inst.describe()}`: {f.message}",
                        call,
                        notes=f.notes,
                        labels=[Label(f.anchor, "required here")],
                    )
                    return None  # a broken instance: its uses would only repeat this
        return inst

    def silent_expr(self, e: A.Expr, scope: Scope, item: Item) -> Type:
        """Evaluate an expression of another item (a callee's default) without recording."""
        sub = type(self)(self.ctx, item, {})
        sub.instance = None
        t = sub.expr(e, scope)
        for name, v in sub.result.deps.items():
            self.result.deps.setdefault(name, v)
        return t

    def check_compile_time_arg(self, p: A.Param, t: Type, node, callee: str, site: Item) -> Type | None:
        """Check a value against a module (or scalar function) parameter's type (`p` of item
        `site`, whose file names its config type)."""
        if isinstance(t, UnknownT):
            return t
        pt = p.type
        if isinstance(pt, A.LiteralType):
            allowed = [s.value for s in pt.values]
            if not (isinstance(t, ScalarT) and t.kind == pt.kind):
                self.report("L107", f"`{p.name.id}` of {callee} is a {pt.kind}, got {kind_text(t)}", node)
                return None
            if pt.kind == "bool":
                if t.value is not None and t.value is not allowed[0]:
                    self.report("L401", f"`{p.name.id}` of {callee} can only be `{str(allowed[0]).lower()}`", node)
                    return None
                return ScalarT("bool", t.value)
            if t.value is not None and t.value not in allowed:
                self.report(
                    "L401",
                    f"`{p.name.id}` of {callee} is one of {', '.join(chr(34) + a + chr(34) for a in allowed)}; "
                    f'got "{t.value}"',
                    node,
                )
                return None
            return ScalarT("str", t.value, tuple(allowed))
        if not isinstance(pt, A.NamedType):
            return t
        name = pt.name.id
        if name in SCALAR_TYPE_NAMES:
            if isinstance(t, ScalarT) and (t.kind == name or (name == "float" and t.kind == "int")):
                if name == "float" and t.kind == "int":
                    iv = t.value.as_int() if t.value is not None else None
                    return ScalarT("float", float(iv) if iv is not None else None)
                return t
            self.report(
                "L107",
                f"`{p.name.id}` of {callee} is a compile-time {name}, got {kind_text(t)}",
                node,
                label=format_type(t),
            )
            return None
        if isinstance(t, NoneT):
            if pt.optional:
                return t
            self.report("L406", f"`{p.name.id}` of {callee} is a `{name}`, not optional; got `none`", node)
            return None
        if isinstance(t, ConfigT):
            declared = self.global_item(name, site)
            if t.value.item is declared:
                return t
            if declared is None or declared.kind != "config":
                self.report(
                    "L107", f"`{p.name.id}` of {callee} is a `{name}` config, got a `{t.value.type_name}`", node
                )
                return None
            return t if self.config_fits(p, t, node, callee, site, declared) else None
        self.report("L107", f"`{p.name.id}` of {callee} is a `{name}` config, got {kind_text(t)}", node)
        return None

    def config_fits(self, p: A.Param, t: ConfigT, node, callee: str, site: Item, declared: Item) -> bool:
        """Whether config value `t` (of another config than `declared`, the type of `p`) may be
        passed as `p`: it declares every field of `declared` that `p`'s owner reads, with a type
        that fits (`sharing`). Reports L409 on the first that does not."""
        owner = param_owner(site, p)
        if owner is None:
            return False
        given = t.value.item
        reads = config_reads(site, owner, p.name.id, self.ctx.lookup)
        for item in {r.item for r in reads.values()} | {given}:
            self.result.deps.setdefault((item.source.path, item.name), item.interface)
        want_fields = {f.name.id: f for f in declared.ast.fields if isinstance(f, A.ConfigField)}
        reader = f"`{owner.name.id}`"
        for field, read in reads.items():
            want = want_fields.get(field)
            if want is None:
                continue  # not a field of the declared config: reported where it is read (L102)
            have = t.value.field_def(field)
            wanted = type_text(declared, want.type)
            labels = [
                Label(LocalAnchor(read.item, read.span), "read here"),
                Label(symbol(declared, field), f"`{declared.name}` declares `{field}: {wanted}` here"),
            ]
            if have is None:
                self.report(
                    "L409",
                    f"{reader} reads `{field}` of its `{declared.name}` config, which `{given.name}` does not declare",
                    node,
                    labels=labels + [Label(symbol(given), f"`{given.name}` has no `{field}`")],
                    notes=[
                        f"`{p.name.id}` of {callee} is a `{declared.name}`; another config is accepted when it "
                        f"declares every field {reader} reads",
                        f"consider declaring `{field}: {wanted}` in `{given.name}` "
                        "(a one-value type such as `false` if its family has one value)",
                    ],
                )
                return False
            if not field_fits(have.type, given, want.type, declared, self.ctx.lookup):
                have_text = type_text(given, have.type)
                theirs = Label(symbol(given, field), f"`{given.name}` declares `{field}: {have_text}` here")
                self.report(
                    "L409",
                    f"{reader} reads `{field}` of its `{declared.name}` config as `{wanted}`, but `{given.name}` "
                    f"declares it `{have_text}`",
                    node,
                    labels=labels + [theirs],
                    notes=[
                        f"a field read as `{wanted}` takes `{wanted}`, a one-value type of it (`false` for `bool`), "
                        "or, for an optional type, its non-optional form"
                    ],
                )
                return False
        return True

    def members(self, inst: Instance, report: bool) -> Members:
        if not report and inst.members is not None:
            return inst.members
        key = inst.key()
        cache = self.ctx.members_cache
        if key in cache and not report:
            inst.members = cache[key]
            return inst.members
        if key in self.ctx.computing:
            return Members()  # asked again while being evaluated (a did-you-mean, a cycle)
        self.ctx.computing.add(key)
        try:
            members = _MemberEvaluator(self, inst).run()
        finally:
            self.ctx.computing.discard(key)
        if key not in cache:
            self.ctx.remember("members", key, inst.item)
        cache[key] = members
        inst.members = members
        if report:
            self.result.findings.extend(members.findings)
        return members


class _MemberEvaluator:
    """Evaluates the member declarations of one module instance."""

    def __init__(self, checker: ItemChecker, inst: Instance):
        self.outer = checker
        self.inst = inst
        # findings land in a private checker anchored at the module's own item
        self.c = type(checker)(checker.ctx, inst.item, {})
        self.c.instance = inst
        self.members = Members()
        self.scope = checker.module_scope(inst)

    def run(self) -> Members:
        self.walk(self.inst.module.members, True, (), ())
        self.members.findings = self.c.result.findings
        if self.inst.generic:
            self.outer.result.types.update(self.c.result.types)
            self.outer.result.refs.extend(self.c.result.refs)
            self.outer.result.names.update(self.c.result.names)
            self.outer.result.call_info.update(self.c.result.call_info)
        for k, v in self.c.result.deps.items():
            self.outer.result.deps.setdefault(k, v)
        return self.members

    def walk(self, members: list, present: bool | None, conditions: tuple, texts: tuple[str, ...]) -> None:
        """Evaluate `members`; `present`, `conditions` (keys of the conditions not known here) and `texts` (every
        enclosing condition as written, for messages) are what the `if`s around them say."""
        for m in members:
            if isinstance(m, A.MemberIf):
                t = self.c.expr(m.cond, self.scope)
                cond = self.c.compile_time_bool(t, m.cond)
                key = cond_key(m.cond, self.inst.item.text)
                text = " ".join(self.inst.item.text[m.cond.span.start : m.cond.span.end].split())
                for branch, pol in ((m.then, True), (m.orelse, False)):
                    if cond is None:
                        sub_present = present
                        sub_cond = conditions + ((key[0], key[1] if pol else not key[1]),)
                    else:
                        sub_present = present if cond == pol else False
                        sub_cond = conditions
                    shown = text if pol else f"not ({text})" if " " in text else f"not {text}"
                    self.walk(branch, sub_present, sub_cond, texts + (shown,))
                continue
            if isinstance(m, A.ErrorStmt):
                self.members.poisoned.update(m.bound)
                continue
            if present is False:
                # Under a condition that is false here the member does not exist: its
                # declaration is not evaluated (it may read `c.extra.n` guarded by `c.extra != none`).
                info = _absent(m)
            else:
                info = self.member(m)
            if info is None:
                continue
            self.c.ref(m.name, symbol(self.inst.item, "fn" if info.kind == "fn" else "member", info.name))
            info.present = present
            info.conditions = conditions
            info.cond_text = _joined(texts)
            prev = self.members.by_name.get(info.name)
            if prev is not None and (prev.present is not False and present is not False) and not _exclusive(prev, info):
                self.c.report(
                    "L105",
                    f"`{info.name}` is declared twice in `{self.inst.module.name.id}`",
                    m.name,
                    labels=[Label(self.c.anchor(prev.node.name), "first declared here")],
                )
                continue
            if prev is not None and prev.present is not False and present is False:
                continue
            path = info.checkpoint_name or info.name
            clash = next(
                (
                    o
                    for o in self.members.order
                    if o.kind in ("param", "submodule", "list")
                    and (o.checkpoint_name or o.name) == path
                    and not _exclusive(o, info)
                ),
                None,
            )
            if clash is not None and info.kind in ("param", "submodule", "list") and present is not False:
                self.c.report(
                    "L105",
                    f"`{info.name}` and `{clash.name}` have the same checkpoint name `{path}`",
                    m.name,
                    labels=[Label(self.c.anchor(clash.node.name), "the other one")],
                )
            if prev is not None and prev.present is not False and present is not False and _same_member(prev, info):
                # declared alike in branches that exclude each other (`if a { w } else { w }`, or two of an
                # `else if` chain): it exists where either holds, so under the conditions both share
                info.conditions = tuple(c for c in info.conditions if c in prev.conditions)
                info.cond_text = _joined(tuple(map(cond_text, info.conditions)))
            self.members.by_name[info.name] = info
            self.members.order.append(info)

    def member(self, m) -> MemberInfo | None:
        c = self.c
        checkpoint = checkpoint_name_attribute(m)
        if isinstance(m, A.FnDef):
            return MemberInfo(m.name.id, "fn", m, FnRefT(FnTarget(self.inst.item, m, self.inst)), checkpoint_name=None)
        if isinstance(m, A.StateDecl):
            t = c.eval_type(m.type, self.scope, None)
            c.record(m.name, t)
            return MemberInfo(m.name.id, "state", m, t)
        if isinstance(m, A.FieldDecl):
            if m.kind == "param":
                t = c.eval_type(m.type, self.scope, None)
                if isinstance(t, TensorT) and any(
                    a.kind == "var" or a.name in LOAD_TIME_DIMS
                    for d in t.shape.dims
                    if d is not None
                    for a in d.atoms()
                ):
                    c.report(
                        "L111",
                        "parameter shapes are fixed when the model is loaded: load-time dims belong to `state`",
                        m.type,
                    )
                c.record(m.name, t)
                return MemberInfo(m.name.id, "param", m, t, checkpoint_name=checkpoint)
            ctor = m.ctor
            item = c.global_item(ctor.func.id) if isinstance(ctor.func, A.Name) else None
            if item is None:
                if not (isinstance(ctor.func, A.Name) and c.failed_import(ctor.func.id)):
                    c.unknown_name(ctor.func, self.scope)
                c.eval_args(ctor.args, self.scope)
                return MemberInfo(m.name.id, "submodule" if m.kind == "submodule" else "list", m, UNKNOWN)
            c.ref(ctor.func, symbol(item))
            if item.kind != "module" or item.ast is None:
                if item.ast is not None:
                    c.report("L107", f"`{item.name}` is a {item.kind}, not a module", ctor.func)
                return MemberInfo(m.name.id, "submodule", m, UNKNOWN)
            if m.kind == "list" and m.index is not None:
                return self.indexed_list(m, item, checkpoint)
            inst = c.instantiate(item, ctor.args, self.scope, ctor)
            if inst is None:
                return MemberInfo(m.name.id, "submodule", m, UNKNOWN)
            if m.kind == "submodule":
                t = ModuleT(inst)
                c.record(m.name, t)
                return MemberInfo(m.name.id, "submodule", m, t, checkpoint_name=checkpoint)
            count = self.list_count(m)
            t = ModuleListT(inst, count)
            c.record(m.name, t)
            return MemberInfo(m.name.id, "list", m, t, checkpoint_name=checkpoint)
        return None

    def list_count(self, m: A.FieldDecl) -> Dim | None:
        """The length of a submodule list: a compile-time int that is not negative."""
        c = self.c
        count_t = c.expr(m.count, self.scope)
        count = count_t.value if isinstance(count_t, ScalarT) and count_t.kind == "int" else None
        if count is not None and (count.as_int() or 0) < 0:
            c.report("L213", f"a list of {count.as_int()} submodules: the length is negative", m.count)
            count = None
        if not isinstance(count_t, (UnknownT,)) and not (isinstance(count_t, ScalarT) and count_t.kind == "int"):
            c.report("L107", f"the length of a submodule list is a compile-time int, got {kind_text(count_t)}", m.count)
        return count

    def indexed_list(self, m: A.FieldDecl, item: Item, checkpoint: str | None) -> MemberInfo:
        """`layers: [Block(c, layer_idx=i) for i in range(n)]`: element `i` is the constructor
        call with `i` bound to its index. The list is checked with `i` a symbolic int (the
        elements' module generically in what depends on it, as a module is checked in its int
        parameters); `ModuleListT.element(k)` is element `k`, its arguments evaluated with
        `i = k` (the checkpoint tree, `layers[k]`, lowering)."""
        c = self.c
        count = self.list_count(m)
        index = m.index
        c.check_bindable(index)
        atom = const(index.id)
        index_t = ScalarT("int", Dim.atom(atom))
        scope = Scope(self.scope, "block")
        binding = Binding(index_t, "dim", c.anchor(index), index)
        scope.bind(index.id, binding)
        c.record(index, index_t)
        c.resolve(index, "dim", node=index, item=c.item, value=atom)
        before = len(c.result.findings)
        inst = c.instantiate(item, m.ctor.args, scope, m.ctor)
        generic_error = any(f.severity in (None, "error") for f in c.result.findings[before:])
        if binding.uses == 0 and not index.id.startswith("_"):
            c.report(
                "L901",
                f"the index `{index.id}` is not used",
                index,
                severity="warning",
                notes=[f"consider `[{m.ctor.func.id}(...); n]` for equal elements, or `_{index.id}` to keep the name"],
            )
        if inst is None:
            return MemberInfo(m.name.id, "list", m, UNKNOWN)
        outer, owner = self.outer, self.inst
        elements: dict[int, Instance | None] = {}
        errors: dict[int, Finding | None] = {}

        def element(k: int) -> Instance | None:
            if k not in elements:
                quiet = type(outer)(outer.ctx, owner.item, {})
                quiet.instance = owner
                at = Scope(self.scope, "block")
                at.bind(index.id, Binding(ScalarT("int", Dim.of(k)), "dim", None, index))
                elements[k] = quiet.instantiate(item, m.ctor.args, at, m.ctor)
                errors[k] = next((f for f in quiet.result.findings if f.severity in (None, "error")), None)
            return elements[k]

        n = count.as_int() if count is not None else None
        if n is not None and n <= MAX_CHECKED_ELEMENTS and not generic_error:
            self.check_elements(m, index, n, element, errors)
        t = ModuleListT(inst, count, index=atom, element=element)
        c.record(m.name, t)
        return MemberInfo(m.name.id, "list", m, t, checkpoint_name=checkpoint)

    def check_elements(self, m: A.FieldDecl, index: A.Name, n: int, element, errors: dict) -> None:
        """Report the first error of the constructor's arguments evaluated with the index at each of its `n`
        values (`c.block_out_channels[c.num_levels - 1 - i]` past the list's end for one `i`): the list is
        checked with a symbolic index, and lowering builds each element with its own. The elements are built
        once (the model tree and lowering read them)."""
        for k in range(n):
            element(k)
            found = errors.get(k)
            if found is not None:
                self.c.result.findings.append(
                    replace(found, message=f"element {k} of `{m.name.id}` ({index.id} = {k}): {found.message}")
                )
                return


def _joined(texts: tuple[str, ...]) -> str:
    """The conditions a member is declared under, as one (`` `a and not b` ``); "" for none."""
    if not texts:
        return ""
    return "`" + " and ".join(f"({t})" if " or " in t and len(texts) > 1 else t for t in texts) + "`"


def _absent(m) -> MemberInfo | None:
    """A member whose condition is false in this instance: its name and kind only."""
    if isinstance(m, A.FnDef):
        return MemberInfo(m.name.id, "fn", m, UNKNOWN)
    if isinstance(m, A.StateDecl):
        return MemberInfo(m.name.id, "state", m, UNKNOWN)
    if isinstance(m, A.FieldDecl):
        return MemberInfo(m.name.id, m.kind, m, UNKNOWN, checkpoint_name=checkpoint_name_attribute(m))
    return None


def _same_member(a: MemberInfo, b: MemberInfo) -> bool:
    """Two declarations of one name under conditions that exclude each other, of one kind and type."""
    return _exclusive(a, b) and a.kind == b.kind and format_type(a.type) == format_type(b.type)


def _exclusive(a: MemberInfo, b: MemberInfo) -> bool:
    """Two members under opposite conditions (`if x { a } else { a }`) don't clash."""
    for ca in a.conditions:
        for cb in b.conditions:
            if ca[0] == cb[0] and ca[1] != cb[1]:
                return True
    return False


def checkpoint_name_attribute(m) -> str | None:
    """The checkpoint name given by `@name("...")` (validated in `attributes.py`)."""
    for attr in getattr(m, "attributes", []):
        if attr.name.id == "name" and len(attr.args) == 1 and isinstance(attr.args[0].value, A.StrLit):
            return attr.args[0].value.value
    return None
