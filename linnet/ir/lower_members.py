"""Lowering: module instances, their classes (`Program.modules`) and members (a member `if` decided by the
instance's values), submodule lists, and the reads of parameters and state in the current graph."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..semantics.attributes import quantized_attribute
from ..semantics.resolved import Arg, CallInfo
from ..syntax import ast as A
from ..types.core import ScalarT, TensorT, TupleT
from ..types.dims import Atom, Dim
from .core import Graph, ModuleClass, Op, TensorSpec, Value
from .lower_values import (
    _UNKNOWN,
    Context,
    Env,
    FnRef,
    Frame,
    LoweringError,
    ModInst,
    ModList,
    ParamMember,
    StateMember,
    _as_kind,
    _checkpoint_name,
    _hint_from_path,
)


class ModulesMixin:
    """Module classes and members, for `Lowering`."""

    # ----- module classes
    def module_class(self, inst: ModInst) -> str:
        """The key of `inst`'s class in `modules` (registered, with its children, on first use):
        the module's name, suffixed when another set of arguments came first."""
        spec = (id(inst.item), inst.spec)
        key = self._class_keys.get(spec)
        if key is not None:
            return key
        name = inst.mdef.name.id
        key, n = name, 1
        while key in self.modules:
            n += 1
            key = f"{name}_{n}"
        self._class_keys[spec] = key
        cls = ModuleClass(key, name, self._origin_in(inst.item, inst.mdef.name), std=inst.item.is_std)
        self.modules[key] = cls
        rel = ModInst(inst.item, inst.args, "", _spec=inst.spec)
        saved, saved_item = self.frame, self._item
        self.frame, self._item = Frame(Graph("", [])), inst.item
        try:
            for name_, m in self.members(rel).items():
                if isinstance(m, ParamMember):
                    cls.params[m.path] = self.member_type(m)
                elif isinstance(m, StateMember):
                    cls.state[m.path] = self.member_type(m)
                elif isinstance(m, ModInst):
                    cls.children[name_] = (self.module_class(m), None)
                    if m.path[:-1] != name_:  # `@name`: paths below it start with its checkpoint name
                        cls.checkpoint_names[name_] = m.path[:-1]
                elif isinstance(m, ModList):
                    items = self.list_items(m)
                    keys = [self.module_class(x) for x in items]
                    if m.path != name_:
                        cls.checkpoint_names[name_] = m.path
                    if len(set(keys)) == 1:
                        cls.children[name_] = (keys[0], m.count)
                    elif keys:  # items of different classes: a class whose children are `0`, `1`...
                        cls.children[name_] = (self.items_class(cls, name_, keys), None)
        finally:
            self.frame, self._item = saved, saved_item
        return key

    def items_class(self, owner: ModuleClass, name: str, keys: list[str]) -> str:
        """The class of a list whose items are of different classes (they received their
        index): no tensors or methods of its own, item `i` its child `i`, so paths stay
        `layers.3.attn...` (torch: an `nn.Module` whose submodules are named `0`, `1`...)."""
        key, n = f"{owner.key}_{name}", 1
        while key in self.modules:
            n += 1
            key = f"{owner.key}_{name}_{n}"
        cls = ModuleClass(key, key, owner.origin)
        cls.children = {str(i): (k, None) for i, k in enumerate(keys)}
        self.modules[key] = cls
        return key

    # ----- members
    def members(self, inst: ModInst) -> dict[str, Any]:
        """The members of a concrete instance, by name: its member `if`s decided by its values."""
        if inst.members is not None:
            return inst.members
        out: dict[str, Any] = {}
        self._members(inst, inst.mdef.members, self.module_env(inst), out)
        inst.members = out
        return out

    def _members(self, inst: ModInst, members: list, env: Env, out: dict) -> None:
        saved = self._item
        self._item = inst.item
        try:
            for m in members:
                if isinstance(m, A.MemberIf):
                    cond = self.expr(m.cond, env)
                    if not isinstance(cond, bool):
                        raise LoweringError(self.where(inst.item, m.cond) + "a member condition must be a known bool")
                    self._members(inst, m.then if cond else m.orelse, env, out)
                elif isinstance(m, A.FieldDecl):
                    seg = _checkpoint_name(m)
                    path = f"{inst.path}{seg}"
                    if m.kind == "param":
                        out[m.name.id] = ParamMember(path, m, inst)
                    elif m.kind == "submodule":
                        out[m.name.id] = self.instantiate(m.ctor, env, path + ".")
                    else:
                        count = self.expr(m.count, env)
                        n = count.as_int() if isinstance(count, Dim) else None
                        if n is None:
                            raise LoweringError(self.where(inst.item, m.count) + "a list length must be a known int")
                        out[m.name.id] = ModList(inst, m.ctor, n, path, self.list_index(env.ctx, m))
                elif isinstance(m, A.StateDecl):
                    out[m.name.id] = StateMember(f"{inst.path}{m.name.id}", m, inst)
                elif isinstance(m, A.FnDef):
                    out[m.name.id] = FnRef(inst.item, m, inst)
        finally:
            self._item = saved

    def member(self, inst: ModInst, name: str, node) -> Any:
        """The member `name` of a concrete instance (the checker resolved the use to it)."""
        m = self.members(inst).get(name)
        if m is None:
            raise LoweringError(self.where(self._item, node) + f"`{inst.mdef.name.id}` has no member `{name}` here")
        return m

    def list_index(self, ctx: Context, m: A.FieldDecl) -> Atom | None:
        """The atom the checker bound a list's element index to (None without an index)."""
        if m.index is None:
            return None
        t = ctx.res.types.get(m.index)
        atoms = t.value.atoms() if isinstance(t, ScalarT) and isinstance(t.value, Dim) else ()
        if len(atoms) != 1:
            raise LoweringError(self.where(ctx.item, m.index) + "this list index was not checked")
        return next(iter(atoms))

    def list_items(self, ml: ModList) -> list[ModInst]:
        if ml._items is None:
            env = self.module_env(ml.owner)
            saved = self._item
            self._item = ml.owner.item
            try:
                ml._items = [
                    self.instantiate(ml.ctor, self.item_env(ml, env, i), f"{ml.path}.{i}.") for i in range(ml.count)
                ]
            finally:
                self._item = saved
        return ml._items

    def item_env(self, ml: ModList, env: Env, i: int) -> Env:
        """Where item `i`'s constructor call is evaluated: the owner's, the index bound to `i`."""
        if ml.index is None:
            return env
        return Env(dataclasses.replace(env.ctx, subst={**env.ctx.subst, ml.index: Dim.of(i)}))

    def module_env(self, inst: ModInst) -> Env:
        return Env(self.instance_context(inst))

    def instantiate(self, ctor: A.Call, env: Env, path: str) -> ModInst:
        """The submodule a constructor call makes, its arguments as the checker bound them
        (`CallInfo` "module"), with the owner's values substituted."""
        info = env.ctx.res.call(ctor)
        if info is None or info.kind != "module":
            raise LoweringError(self.where(env.item, ctor) + "this submodule was not checked")
        args, unknown = self.static_args(info, env.ctx, ctor)
        if unknown:
            # what the checker could not know (a float parameter of the owner) is computed
            # here: an argument in the owner, a default in the module, after the known ones
            inst = ModInst(info.item, args, "")
            callee = self.module_env(inst)
            for p, arg in unknown:
                value = self.expr(arg.node, env) if arg.node is not None else self.expr(arg.default, callee)
                args[p.name.id] = _as_kind(value, arg.value)
            args = {p.name.id: args[p.name.id] for p in info.callee.params}  # declaration order
        return ModInst(info.item, args, path)

    def static_args(self, info: CallInfo, ctx: Context, node) -> tuple[dict[str, Any], list[tuple[A.Param, Arg]]]:
        """The compile-time arguments of a call of a Linnet module or function, by parameter
        name, as the checker converted them (in the caller's terms, substituted here), and
        the (parameter, argument) pairs whose value the checker did not know."""
        params = info.callee.params
        args: dict[str, Any] = {}
        unknown = []
        for p, (name, arg) in zip(params, info.args.items()):
            if isinstance(arg.value, (TensorT, TupleT)):
                continue
            value = self.static_value(ctx, arg.value, node)
            if value is _UNKNOWN:
                unknown.append((p, arg))
            else:
                args[name] = value
        return args, unknown

    def member_type(self, m: "ParamMember | StateMember") -> TensorT:
        """The concrete type of a parameter or state member: the checker's, in its instance."""
        return self.concrete_type(self.instance_context(m.owner), m.decl.type)

    def param_spec(self, m: ParamMember) -> TensorSpec:
        """The program's parameter at `m`'s (absolute) path."""
        spec = self.params.get(m.path)
        if spec is None:
            spec = self.params[m.path] = TensorSpec(m.path, self.member_type(m), "param", quantized_attribute(m.decl))
        return spec

    def state_spec(self, m: StateMember) -> TensorSpec:
        """The program's state tensor at `m`'s (absolute) path."""
        spec = self.state.get(m.path)
        if spec is None:
            spec = self.state[m.path] = TensorSpec(m.path, self.member_type(m), "state")
        return spec

    def member_value(self, m, node=None):
        """A member's value in the current graph: a parameter or state tensor is read once per
        graph (by its path relative to the receiver), other members are themselves."""
        if isinstance(m, ParamMember):
            v = self._param_values.get(m.path)
            if v is None:
                v = self._param_values[m.path] = self._read("param", m)
            return v
        if isinstance(m, StateMember):
            v = self._state_values.get(m.path)
            if v is None:
                if m.path in self._loop_writes():
                    raise LoweringError(
                        self.where(self._item, node)
                        + f"state `{m.path}` is read after a loop that writes it; read it in the loop"
                    )
                v = self._state_values[m.path] = self._read("state", m)
            return v
        return m

    def _loop_writes(self) -> set[str]:
        """State paths a loop of the current graph wrote, with every index substituted."""
        out: set[str] = set()
        for op in self.graph.ops:
            if op.name == "loop":
                for w in op.writes:
                    out |= {w.replace(op.attrs["index"], str(i)) for i in range(op.attrs["count"])}
        return out

    def _read(self, kind: str, m) -> Value:
        op = Op(kind, {}, [], {"path": m.path})
        op.results = [Value(self.member_type(m), _hint_from_path(m.path), op)]
        self.graph.ops.append(op)
        self.frame.defined.add(id(op.result))
        return op.result
