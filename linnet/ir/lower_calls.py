"""Lowering: calls (of ops, of Linnet functions and methods, specialised as functions of the program or
lowered in place, of `@composite` standard-library functions) and `for` loops over submodule lists."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..ops import OpDef
from ..semantics.resolved import Arg, CallInfo
from ..syntax import ast as A
from ..types.core import NoneT, TensorT, TupleT
from ..types.dims import Dim
from ..types.scalars import CONVERSIONS
from .core import LOOP_INDEX, Graph, Op, Value, shift_indices
from .lower_values import (
    Context,
    Env,
    FnRef,
    Frame,
    LoweringError,
    ModInst,
    ModList,
    _as_kind,
    _assigned,
    _fresh_key,
    _hint_from_path,
    _identifier_path,
    _number,
    _param_atom,
    _spec_key,
    _type_key,
    _Unspecialisable,
    is_composite,
    unbound_dim,
)


class CallsMixin:
    """Calls and loops, for `Lowering`."""

    # ----- calls
    def call(self, e: A.Call, env: Env):
        """A call, bound as the checker bound it (`CallInfo`): an op, a function, or a method
        of the concrete instance its receiver evaluates to."""
        info = env.ctx.res.call(e)
        if info is None:
            raise LoweringError(self.where(env.item, e) + "this call was not checked")
        if info.kind == "conversion":  # `int(x)`, `len(xs)`: the one definition, types/scalars.py
            value = CONVERSIONS[info.callee](_number(self.expr(e.args[0].value, env)))
            return Dim.of(value) if isinstance(value, int) else value
        if info.kind == "op":
            return self.call_op(info, e, env)
        if info.kind == "fn":
            return self.call_fn(FnRef(info.item, info.callee, None), info, e, env)
        if info.kind in ("method", "forward"):
            receiver = env.inst if info.receiver is None else self.expr(info.receiver, env)
            if not isinstance(receiver, ModInst):
                raise LoweringError(self.where(env.item, e.func) + "this is not a module instance")
            # the instance's own method of that name: its member `if`s are decided here
            method = self.member(receiver, info.callee.name.id, e.func)
            if not isinstance(method, FnRef):
                raise LoweringError(self.where(env.item, e.func) + f"`{info.callee.name.id}` is not a method here")
            return self.call_fn(method, info, e, env)
        raise LoweringError(self.where(env.item, e) + "a module is constructed only as a member")

    def call_op(self, info: CallInfo, e: A.Call, env: Env):
        """An op call: tensor operands and dtypes evaluated here, the other arguments the
        checker converted (with this instance's values), or computed here when it could not."""
        op: OpDef = info.callee
        if info.scalar:  # applied to compile-time numbers
            return self.fold(op, [self.expr(a.value, env) for a in e.args], e)
        args: dict[str, Any] = {}
        for p in op.params:
            if p.kind == "sizes":
                args[p.name] = {k: self.concrete_dim(env.ctx, a.value, e) for k, a in info.sizes.items()}
                continue
            arg = info.args.get(p.name)
            if arg is None:
                continue
            if arg.node is None:  # the op's default
                args[p.name] = arg.value
            elif p.kind in ("operand", "tensor", "tensors", "dtype"):
                args[p.name] = self.expr(arg.node, env)
            else:
                args[p.name] = self.op_constant(p.kind, arg, env)
        return self.apply(op, args, e)

    def op_constant(self, kind: str, arg: Arg, env: Env):
        """A compile-time argument of an op of kind `kind` ("int", "index", "float", ...) as
        the checker converted it, in this instance; computed here where it was not known."""
        value = arg.value
        if kind in ("window", "padding"):  # an int, a list of ints, or a padding's "same" / "valid"
            if isinstance(value, str):
                return value
            kind = "ints" if isinstance(value, list) else "int"
        if kind in ("int", "ints"):
            items = value if kind == "ints" else [value]
            unknown = any(x is None for x in items) and not isinstance(env.ctx.res.types.get(arg.node), NoneT)
            if not unknown:
                found = [self.concrete_dim(env.ctx, x, arg.node) if isinstance(x, Dim) else x for x in items]
                return found if kind == "ints" else found[0]
        elif value is not None:
            return value  # an index, a bool, a str: known where it was checked, or the check failed
        computed = self.expr(arg.node, env)
        if kind == "float" and isinstance(computed, Dim):
            return float(_number(computed))
        return computed

    def call_fn(self, ref: FnRef, info: CallInfo, e: A.Call, env: Env):
        fn = ref.fn
        caller = env.ctx
        args, unknown = self.static_args(info, caller, e)
        # arguments in the order they are written (their ops come in that order), then defaults
        order = sorted((a for a in info.args if info.args[a].node is not None), key=lambda a: info.args[a].node.span)
        order += [a for a in info.args if info.args[a].node is None]
        for name in order:
            arg = info.args[name]
            if isinstance(arg.value, (TensorT, TupleT)):
                if arg.node is None:
                    raise LoweringError(self.where(env.item, e) + f"`{name}` of `{fn.name.id}` has no argument")
                args[name] = self.expr(arg.node, env)
        if self._depth > 5000:
            raise LoweringError(self.where(env.item, e) + "calls nest too deeply")
        ctx = self.call_context(ref, info, args, caller, e)
        if unknown:
            # what the checker could not know where it checked the call (a float parameter
            # of the caller) is computed here: an argument in the caller, a default in the callee
            callee = Env(ctx)
            callee.vars.update({p.name: args[p.name.id] for p in fn.params if p.name.id in args})
            for p, arg in unknown:
                value = self.expr(arg.node, env) if arg.node is not None else self.expr(arg.default, callee)
                args[p.name.id] = callee.vars[p.name] = _as_kind(value, arg.value)
                atom = _param_atom(ctx.res, p)
                if atom is not None and isinstance(args[p.name.id], Dim):
                    ctx.subst[atom] = args[p.name.id]
        saved = self._item
        origin = self._origin(e) if saved is not None else ""
        self._item = ref.item
        try:
            if ref.item.is_std and is_composite(fn) and ref.inst is None:
                return self.composite(fn, ctx, {a: args[a] for a in order}, origin)
            args = {p.name.id: args[p.name.id] for p in fn.params}  # declaration order
            graph = self.specialise(ref, ctx, args)
            if graph is None:  # not a function of tensors, or of dims it cannot read: in place
                callee = Env(ctx)
                callee.vars.update({p.name: args[p.name.id] for p in fn.params})
                result = self.block(fn.body, callee.child())
                self.check_returns(ctx, fn, list(result) if isinstance(result, tuple) else [result], ref.item)
                return result
        finally:
            self._item = saved
        result = self.emit_call(graph, ref, args, e)
        self.check_returns(ctx, fn, list(result) if isinstance(result, tuple) else [result], ref.item)
        return result

    def specialise(self, ref: FnRef, ctx: Context, args: dict[str, Any]) -> Graph | None:
        """The function of `Program.functions` that runs `ref` on arguments like `args`
        (lowered on first use, in context `ctx`), or None when the call must be evaluated in
        place: an argument that is a list of tensors or a module, a result that is not
        tensors, or a graph whose shapes use a dim variable that no argument's shape has as a
        whole dim (called with `[E, B * S, n]`: `B` and `S` could not be read in it)."""
        fn = ref.fn
        try:
            static = tuple((k, _spec_key(v)) for k, v in args.items() if not isinstance(v, Value))
        except _Unspecialisable:
            return None
        tensors = tuple((k, _type_key(v.type)) for k, v in args.items() if isinstance(v, Value))
        receiver = self.module_class(ref.inst) if ref.inst is not None else None
        key = (id(fn), receiver, tensors, static)
        if key in self._specialised:
            return self._specialised[key]
        name = f"{self.modules[receiver].name}.{fn.name.id}" if receiver is not None else fn.name.id
        graph = Graph(name, [], kind="method" if receiver is not None else "function", qualname=name)
        graph.receiver, graph.origin = receiver, self._origin_in(ref.item, fn.name)
        header = " ".join(ref.item.text[fn.name.span.start : fn.body.span.start].split())
        graph.signature = re.sub(r",?\s*\)", ")", re.sub(r"\(\s+", "(", header))
        rel = ModInst(ref.inst.item, ref.inst.args, "", _spec=ref.inst.spec) if ref.inst is not None else None
        saved, depth = self.frame, self._loop_depth
        self.frame, self._loop_depth = Frame(graph), 0
        try:
            callee = Env(dataclasses.replace(ctx, inst=rel))  # members read relative to the receiver
            for p in fn.params:
                v = args[p.name.id]
                callee.vars[p.name] = self.input(v.type, p.name.id) if isinstance(v, Value) else v
            result = self.block(fn.body, callee.child())
            outs = list(result) if isinstance(result, tuple) else [result]
            if not outs or not all(isinstance(o, Value) for o in outs):
                self._specialised[key] = None
                return None
            graph.outputs = outs
            if unbound_dim(graph) is not None:
                # an argument's dim is a product or sum of the caller's (`B * S` through
                # `...`), so its shapes use `B` and `S`, which no argument's shape has as a
                # whole dim to read them from: lowered in the caller, where they are known
                self._specialised[key] = None
                return None
            self.finish(graph, outs, ref.item, fn.name)
        finally:
            self.frame, self._loop_depth = saved, depth
        graph.name = _fresh_key(self.functions, _identifier_path(name))
        self.functions[graph.name] = graph
        self._specialised[key] = graph
        return graph

    def emit_call(self, graph: Graph, ref: FnRef, args: dict[str, Any], e: A.Call):
        """A `call` of `graph` with the tensor arguments of `args`; the callee's state writes,
        prefixed with its receiver, become the caller's (their new values follow the outputs)."""
        prefix = ref.inst.path if ref.inst is not None else None
        shift = lambda w: shift_indices(w, self._loop_depth)  # noqa: E731
        writes = [(prefix or "") + shift(w) for w in sorted(graph.written_state())]
        updates = [(prefix or "") + w for w in graph.state_updates]
        op_args = {p.name.id: args[p.name.id] for p in ref.fn.params if isinstance(args[p.name.id], Value)}
        types = [o.type for o in graph.outputs] + [v.type for v in graph.state_updates.values()]
        attrs = {"fn": graph.name, "receiver": prefix, "writes": writes, "updates": updates}
        # named after the submodule called (`mlp`), else the function (`apply_rope`)
        member = (prefix or "").rstrip(".").rsplit(".", 1)[-1]
        hint = member if member.isidentifier() else ref.fn.name.id
        results = self.emit("call", op_args, types, hint, e, **attrs)
        results[0].producer.callee = graph
        outs = results[: len(graph.outputs)]
        for path, v in zip(updates, results[len(graph.outputs) :]):
            v.name = v.hint = _hint_from_path(path)
            self._state_values[path] = v
        return outs[0] if len(outs) == 1 else tuple(outs)

    def composite(self, fn: A.FnDef, ctx: Context, args: dict[str, Any], origin: str):
        """Lower a std function as a `composite` op whose body is its decomposition."""
        tensor_args = {k: v for k, v in args.items() if isinstance(v, Value)}
        attrs = {k: v for k, v in args.items() if not isinstance(v, Value)}
        body = Graph(f"composite:{fn.name.id}", [], kind="composite", qualname=fn.name.id)
        body.origin = self._origin_in(self._item, fn.name)
        header = " ".join(self._item.text[fn.name.span.start : fn.body.span.start].split())
        body.signature = re.sub(r",?\s*\)", ")", re.sub(r"\(\s+", "(", header))
        params = {p.name.id: p.name for p in fn.params}
        inner_env = Env(ctx)
        inner_env.vars.update({params[k]: v for k, v in attrs.items()})
        saved = self.frame
        self.frame = Frame(body)
        try:
            for k, v in tensor_args.items():
                inner_env.vars[params[k]] = self.input(v.type, k)
            result = self.block(fn.body, inner_env.child())
        finally:
            self.frame = saved
        outs = result if isinstance(result, tuple) else (result,)
        body.outputs = list(outs)
        op = Op("composite", {k: self.local(v) for k, v in tensor_args.items()} | attrs, [], {"name": fn.name.id}, body)
        op.results = [Value(o.type, fn.name.id, op) for o in outs]
        op.origin = origin  # the call site, in the caller's file
        self.graph.ops.append(op)
        self.frame.defined.update(id(r) for r in op.results)
        return op.results[0] if len(op.results) == 1 else tuple(op.results)

    # ----- loops
    def loop(self, s: A.For, ml: "ModList", env: Env) -> None:
        """`for x in list { ... }` over a list of submodules as one `loop` op: the body is
        lowered once, with the item `{list}.{iN}.` as receiver prefix, the outer locals it
        assigns as loop-carried values and the outer values it reads as captured inputs.
        Unrolled instead when a carried value is not a tensor or changes type."""
        carried = []  # (the local's defining node, its value before the loop)
        for target in _assigned(s.body):
            ref = self.ref(target, env)
            if ref.kind != "local" or any(node is ref.node for node, _ in carried):
                continue
            found, v = env.lookup(ref.node)
            if found and isinstance(v, Value):
                carried.append((ref.node, v))
            elif found:
                return self.unrolled(s, ml, env)
        if ml.index is not None:  # items that receive their index are different modules
            return self.unrolled(s, ml, env)
        if ml.count == 0:
            return None
        index = LOOP_INDEX % self._loop_depth
        saved_item = self._item
        self._item = ml.owner.item
        try:
            item = self.instantiate(ml.ctor, self.module_env(ml.owner), f"{ml.path}.{index}.")
        finally:
            self._item = saved_item
        body = Graph(f"{s.var.id} in {ml.path}", [], kind="loop", qualname=s.var.id, receiver=self.graph.receiver)
        parent = self.frame
        frame = Frame(body, parent=parent)
        self.frame = frame
        self._loop_depth += 1
        try:
            inner = env.child()
            for node, v in carried:
                inner.vars[node] = self.input(v.type, node.id)
            inner.vars[s.var] = item
            self.block(s.body, inner.child())
            outs = [self.local(inner.vars[node]) for node, _ in carried]
            body.outputs = outs
            for path, v in frame.state_values.items():
                if v.producer is not None and v.producer.name != "state":
                    body.state_updates[path] = v
        finally:
            self.frame = parent
            self._loop_depth -= 1
        if any(_type_key(o.type) != _type_key(v.type) for o, (_, v) in zip(outs, carried)):
            return self.unrolled(s, ml, env)
        attrs = {
            "list": ml.path,
            "count": ml.count,
            "index": index,
            "var": s.var.id,
            "writes": sorted(body.written_state()),
        }
        results = self.emit(
            "loop",
            {"carried": [v for _, v in carried], "captured": frame.captured},
            [v.type for _, v in carried],
            "",
            s,
            **attrs,
        )
        loop_op = self.graph.ops[-1]
        loop_op.body = body
        for (node, _), r in zip(carried, results):
            r.name = r.hint = node.id
            env.assign(node, r)
        return None

    def unrolled(self, s: A.For, ml: "ModList", env: Env) -> None:
        """The loop's body once per item, in place."""
        for x in self.list_items(ml):
            inner = env.child()
            inner.vars[s.var] = x
            self.block(s.body, inner)
