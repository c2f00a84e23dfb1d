"""Lowering: blocks, statements and expressions, as the checker resolved their names: compile-time values
computed with the one scalar semantics (`types/scalars.py`), tensor ones emitted as ops."""

from __future__ import annotations

from ..ops import OPERATORS, REGISTRY
from ..ops.slices import resolved_slice_bound
from ..semantics.configs import MISSING, ConfigValue
from ..syntax import ast as A
from ..types.dims import Dim
from ..types.scalars import ScalarError, arithmetic, compare
from .core import Value
from .lower_values import (
    UNIT,
    Env,
    FnRef,
    LoweringError,
    ModInst,
    ModList,
    StateMember,
    _config_scalar,
    _named,
    _number,
)


class ExprsMixin:
    """Statements and expressions, for `Lowering`."""

    # ----- statements and blocks
    def block(self, b: A.Block, env: Env):
        value = UNIT
        for i, s in enumerate(b.stmts):
            last = i == len(b.stmts) - 1
            if isinstance(s, A.ExprStmt):
                v = self.expr(s.expr, env)
                value = v if last else UNIT
            else:
                self.stmt(s, env)
                value = UNIT
        return value

    def stmt(self, s, env: Env) -> None:
        if isinstance(s, A.Let):
            v = self.expr(s.value, env)
            if s.is_tuple:
                if not isinstance(v, tuple) or len(v) != len(s.targets):
                    raise LoweringError(self.where(env.item, s) + "cannot unpack this value")
                for t, x in zip(s.targets, v):
                    env.vars[t] = _named(x, t.id)
            else:
                env.vars[s.targets[0]] = _named(v, s.targets[0].id)
        elif isinstance(s, A.Assign):
            v = self.expr(s.value, env)
            ref = self.ref(s.target, env)
            if ref.kind == "local" and env.assign(ref.node, _named(v, s.target.id)):
                return
            m = self.member(env.inst, s.target.id, s.target) if ref.kind == "member" else None
            if isinstance(m, StateMember):
                if not isinstance(v, Value):
                    raise LoweringError(self.where(env.item, s) + "state is assigned a tensor")
                self.state_spec(m)
                self._state_values[m.path] = _named(v, s.target.id)
                return
            raise LoweringError(self.where(env.item, s.target) + f"cannot assign `{s.target.id}`")
        elif isinstance(s, A.For):
            seq = self.expr(s.iter, env)
            if not isinstance(seq, ModList):
                raise LoweringError(self.where(env.item, s.iter) + "`for` iterates over a list of submodules")
            self.loop(s, seq, env)
        elif isinstance(s, A.ErrorStmt):
            raise LoweringError(self.where(env.item, s) + "this statement did not parse")
        else:
            raise LoweringError(self.where(env.item, s) + "unsupported statement")

    # ----- expressions
    def expr(self, e, env: Env):
        self._depth += 1
        try:
            return self._expr(e, env)
        finally:
            self._depth -= 1

    def _expr(self, e, env: Env):
        if isinstance(e, A.IntLit):
            return Dim.of(e.value)
        if isinstance(e, A.FloatLit):
            return float(e.value)
        if isinstance(e, A.StrLit):
            return e.value
        if isinstance(e, A.BoolLit):
            return e.value
        if isinstance(e, A.NoneLit):
            return None
        if isinstance(e, A.Name):
            return self.name(e, env)
        if isinstance(e, A.Attr):
            return self.attr(e, env)
        if isinstance(e, A.Call):
            return self.call(e, env)
        if isinstance(e, A.BinOp):
            return self.binop(e, env)
        if isinstance(e, A.Compare):
            return self.compare(e, env)
        if isinstance(e, A.Neg):
            v = self.expr(e.operand, env)
            if isinstance(v, Value):
                return self.apply(REGISTRY["neg"], {"x": v}, e)
            return -v
        if isinstance(e, A.Not):
            v = self.expr(e.operand, env)
            if isinstance(v, Value):
                return self.apply(REGISTRY["logical_not"], {"x": v}, e)
            return not v
        if isinstance(e, A.Index):
            return self.index(e, env)
        if isinstance(e, A.TupleLit):
            return tuple(self.expr(i, env) for i in e.items)
        if isinstance(e, A.ListLit):
            return [self.expr(i, env) for i in e.items]
        if isinstance(e, A.IfExpr):
            cond = self.expr(e.cond, env)
            if not isinstance(cond, bool):
                raise LoweringError(self.where(env.item, e.cond) + "the condition of `if` must be a known bool")
            if cond:
                return self.block(e.then, env.child())
            if e.orelse is None:
                return UNIT
            if isinstance(e.orelse, A.Block):
                return self.block(e.orelse, env.child())
            return self.expr(e.orelse, env)
        raise LoweringError(self.where(env.item, e) + "unsupported expression")

    def ref(self, e: A.Name, env: Env):
        """What the checker resolved the name `e` to (`resolved.Ref`)."""
        ref = env.ctx.res.ref(e)
        if ref is None:
            raise LoweringError(self.where(env.item, e) + f"`{e.id}` was not resolved by the checker")
        return ref

    def name(self, e: A.Name, env: Env):
        """The value of a name use, as the checker resolved it, in this instance and call."""
        ref = self.ref(e, env)
        kind = ref.kind
        if kind in ("local", "param", "loop"):
            found, v = env.lookup(ref.node)
            if not found:
                raise LoweringError(self.where(env.item, e) + f"`{e.id}` has no value here")
            return v
        if kind in ("dim", "load_dim"):
            return self.concrete_dim(env.ctx, Dim.atom(ref.value), e)
        if kind == "module_param":
            return env.inst.args[ref.node.id]
        if kind == "member":
            return self.member_value(self.member(env.inst, ref.node.name.id, e), e)
        if kind == "fn":
            return FnRef(ref.item, ref.node, None)
        if kind in ("op", "dtype", "constant"):
            return ref.value
        if kind == "dtype_var":
            return self.concrete_dtype(env.ctx, ref.value, e)
        raise LoweringError(self.where(env.item, e) + f"`{e.id}` is a {kind}, not a value")

    def attr(self, e: A.Attr, env: Env):
        """`a.b`: a field of a config value or a member of a module instance (as the checker
        resolved `b`), or a tensor's dtype, read from the concrete value of `a`."""
        base = self.expr(e.value, env)
        name = e.name.id
        if isinstance(base, Value) and name == "dtype":
            return base.dtype
        ref = self.ref(e.name, env)
        if ref.kind == "config_field" and isinstance(base, ConfigValue):
            v = base.values.get(name, MISSING)
            if v is MISSING:
                raise LoweringError(self.where(env.item, e) + f"config field `{name}` has no value")
            return _config_scalar(v)
        if ref.kind == "member" and isinstance(base, ModInst):
            return self.member_value(self.member(base, name, e), e)
        raise LoweringError(self.where(env.item, e) + f"no field `{name}` here")

    def binop(self, e: A.BinOp, env: Env):
        a = self.expr(e.left, env)
        if e.op in ("and", "or") and isinstance(a, bool):
            if a is (e.op == "or"):
                return a
        b = self.expr(e.right, env)
        if isinstance(a, Value) or isinstance(b, Value):
            return self.apply(REGISTRY[OPERATORS[e.op]], {"x": a, "y": b}, e)
        return self.scalar_binop(e.op, a, b, e, env)

    def scalar_binop(self, op: str, a, b, e, env: Env):
        """Compile-time arithmetic: the one scalar semantics of configs and the checker
        (`types/scalars.py`)."""
        if op in ("and", "or"):
            return (a and b) if op == "and" else (a or b)
        try:
            value = arithmetic(op, a, b)
        except ScalarError as err:
            raise LoweringError(self.where(env.item, e) + err.message) from err
        if value is None:
            raise LoweringError(self.where(env.item, e) + f"`{op}` has no value known at compile time here")
        return Dim.of(value) if isinstance(value, int) else value

    def compare(self, e: A.Compare, env: Env):
        a = self.expr(e.left, env)
        b = self.expr(e.right, env)
        if isinstance(a, Value) or isinstance(b, Value):
            return self.apply(REGISTRY[OPERATORS[e.op]], {"x": a, "y": b}, e)
        if a is None or b is None or isinstance(a, ConfigValue) or isinstance(b, ConfigValue):
            same = a is b
            return same if e.op == "==" else not same
        result = compare(e.op, a, b)
        if result is None:
            raise LoweringError(self.where(env.item, e) + f"`{e.op}` of symbolic dims is not known at compile time")
        return result

    def _check_in_range(self, i: int, n: int, env: Env, e: A.Index, what: str = "") -> None:
        """Refuse (located) an index outside a list of `n`: an int parameter's value that the checker did not
        know, as a method's `i` in `resnets[i]` (L212 where the checker sees the value)."""
        if not -n <= i < n:
            raise LoweringError(self.where(env.item, e.items[0]) + f"index {i} is out of range for a list of {n}{what}")

    def index(self, e: A.Index, env: Env):
        base = self.expr(e.value, env)
        if isinstance(base, ModList):
            i = _number(self.expr(e.items[0], env))
            items = self.list_items(base)
            self._check_in_range(i, len(items), env, e, " submodules")
            return items[i]
        if isinstance(base, list):  # a `list[...]` config field, indexed by a compile-time int
            i = _number(self.expr(e.items[0], env))
            self._check_in_range(i, len(base), env, e)
            return _config_scalar(base[i])
        if not isinstance(base, Value):
            raise LoweringError(self.where(env.item, e) + "only tensors can be indexed")
        ell = [i for i, it in enumerate(e.items) if isinstance(it, A.EllipsisLit)]
        pre = e.items[: ell[0]] if ell else e.items
        post = e.items[ell[0] + 1 :] if ell else []
        n = base.rank
        steps = [(i, it) for i, it in enumerate(pre)] + [(n - len(post) + j, it) for j, it in enumerate(post)]
        x = base
        for pos, it in sorted(steps, key=lambda s: -s[0]):
            if isinstance(it, A.Slice):
                if it.start is None and it.stop is None:
                    continue
                start = self.expr(it.start, env) if it.start is not None else Dim.of(0)
                stop = self.expr(it.stop, env) if it.stop is not None else None
                start, stop = resolved_slice_bound(start, x.dims[pos]), resolved_slice_bound(stop, x.dims[pos])
                x = self.apply(REGISTRY["slice"], {"x": x, "dim": pos, "start": start, "stop": stop}, it)
                continue
            v = self.expr(it, env)
            if isinstance(v, Value):
                x = self.apply(REGISTRY["take"], {"x": x, "indices": v, "dim": pos}, it)
            else:
                x = self.apply(REGISTRY["select"], {"x": x, "dim": pos, "index": v}, it)
        return x
