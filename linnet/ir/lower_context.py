"""Lowering: the checker's resolved form of a body where it is lowered (a module's under an instance's
config values, a function's at a call), and the values of the checker's atoms, dims, dtypes and
compile-time arguments substituted there (`Context.subst`)."""

from __future__ import annotations

from typing import Any

from ..semantics.names import LOAD_TIME_DIMS
from ..semantics.resolved import CallInfo, Resolved
from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import WORK, ConfigT, DType, NoneT, ScalarT, TensorT, Type
from ..types.dims import Atom, Dim, DivisionError, divide, floor_divide, minimum, remainder
from .core import tensor_type
from .lower_values import (
    _UNKNOWN,
    Context,
    FnRef,
    LoweringError,
    ModInst,
    _config_args,
    _param_atom,
    _spec_key,
    _whole_dims,
)

# A floor quotient's, remainder's or clamped slice bound's atom, recomputed from its operands when they get values.
_DIVISIONS = {"//": floor_divide, "%": remainder, "min": minimum}


class ContextMixin:
    """The resolved form in an instance and at a call, for `Lowering`."""

    # ----- the checker's resolved form, in an instance and at a call
    def resolved(self, item: Item, config: dict[str, Any], node=None) -> Resolved:
        """The check of `item` whose config parameters hold `config` (name -> ConfigValue or
        None). Raises LoweringError when that check (made now: an imported module under this
        file's config) has errors."""
        key = (item, tuple((k, _spec_key(v)) for k, v in config.items()))
        res = self._resolved.get(key)
        if res is None:
            res = self.analysis.resolved(item, config=config)
            if res is None:
                raise LoweringError(self.where(self._item, node) + f"`{item.name}` was not checked")
            if res.errors:
                d = res.errors[0]
                start = d.location.start
                raise LoweringError(
                    f"{d.location.path}:{start.line}:{start.column}: error[{d.code}]: {d.message} "
                    f"(`{item.name}` under this config)"
                )
            self._resolved[key] = res
        return res

    def instance_context(self, inst: ModInst) -> Context:
        """What the resolved form of `inst`'s module means in `inst`: its check under the
        instance's config values, its int parameters' atoms bound to the instance's values."""
        if inst.context is None:
            res = self.resolved(inst.item, _config_args(inst.mdef.params, inst.args))
            inst.context = Context(inst.item, res, inst, self.module_subst(res, inst))
        return inst.context

    def module_subst(self, res: Resolved, inst: ModInst) -> dict[Atom, Dim]:
        """The atoms of a module's int parameters in check `res`, bound to `inst`'s values, and
        the load-time dims. Shared by the instances of one class: do not modify."""
        key = (id(res), inst.spec)
        subst = self._module_substs.get(key)
        if subst is None:
            subst = self.load_dims()
            for p in inst.mdef.params:
                atom = _param_atom(res, p)
                if atom is not None and isinstance(inst.args.get(p.name.id), Dim):
                    subst[atom] = inst.args[p.name.id]
            self._module_substs[key] = subst
        return subst

    def call_context(self, ref: FnRef, info: CallInfo, args: dict[str, Any], caller: Context, e: A.Call) -> Context:
        """What the resolved form of the function `ref` means at the call `e`: its check under
        the config arguments (a method's: its module's check, its own config parameters
        bound there too), its int parameters' atoms bound to `args`, its dim variables to the
        dims the checker solved at the call (in the caller's terms, substituted here)."""
        fn = ref.fn
        config = _config_args(fn.params, args)
        if ref.inst is not None:
            module_config = _config_args(ref.inst.mdef.params, ref.inst.args)
            if config.keys() & module_config.keys():
                raise LoweringError(
                    self.where(caller.item, e)
                    + f"a config parameter of `{fn.name.id}` has the name of one of its module"
                )
            if config:
                res = self.resolved(ref.item, module_config | config, e)
                subst = dict(self.module_subst(res, ref.inst))
            else:
                base = self.instance_context(ref.inst)
                res, subst = base.res, dict(base.subst)
        else:
            res = self.resolved(ref.item, config, e)
            subst = self.load_dims()
        for p in fn.params:
            atom = _param_atom(res, p)
            if atom is not None and isinstance(args.get(p.name.id), Dim):
                subst[atom] = args[p.name.id]
        whole = _whole_dims(fn, args)
        for name, atom in self.dim_vars(res, fn).items():
            solved = info.dims.get(name)
            if solved is None and name in whole:
                # a size the checker could not know at the call (a local a loop over differing elements
                # reassigns: `ItemChecker.varied_type`) is the argument's, read from its shape here
                subst[atom] = whole[name]
                continue
            if solved is None:
                raise LoweringError(
                    self.where(caller.item, e)
                    + f"the dim `{name}` of `{fn.name.id}` is not known at this call where it was checked"
                )
            subst[atom] = self.concrete_dim(caller, solved, e)
        dtypes = {name: self.concrete_dtype(caller, d, e) for name, d in info.dtypes.items() if d is not None}
        return Context(ref.item, res, ref.inst, subst, dtypes)

    def load_dims(self) -> dict[Atom, Dim]:
        """The load-time dims' atoms (`max_batch`, `max_positions`) and their values."""
        return {
            LOAD_TIME_DIMS["max_batch"]: Dim.of(self.max_batch),
            LOAD_TIME_DIMS["max_positions"]: Dim.of(self.max_positions),
        }

    def dim_vars(self, res: Resolved, fn: A.FnDef) -> dict[str, Atom]:
        """A function's dim variables in check `res`, by name (those its parameter types bind)."""
        key = (id(res), id(fn))
        found = self._dim_vars.get(key)
        if found is None:
            found = {}
            for p in fn.params:
                for node in A.walk(p.type):
                    ref = res.ref(node) if isinstance(node, A.Name) else None
                    if ref is not None and ref.kind == "dim":
                        found.setdefault(ref.value.name, ref.value)
            self._dim_vars[key] = found
        return found

    # ----- substituting values into what the checker computed
    def concrete_dim(self, ctx: Context, d: Dim, node=None) -> Dim:
        """`d` (a dim as the checker computed it) with this context's values substituted:
        a number, or a polynomial in the program's dim variables. Raises LoweringError for an
        atom that has no value here (a config field without a default) or a quotient that is
        not exact with these values."""
        d = d.val  # config values substituted (cached on the dim)
        terms = d.terms
        if not terms or not terms[0][0]:
            return d  # a number
        result = Dim.of(0)
        for mono, coeff in terms:
            if coeff == 1 and len(mono) == 1 and mono[0][1] == 1:
                term = self._atom_value(ctx, mono[0][0], node)
            else:
                term = Dim.of(coeff)
                for atom, power in mono:
                    term = term * self._atom_value(ctx, atom, node) ** power
            result = result + term if result.terms else term
        return result

    def _atom_value(self, ctx: Context, a: Atom, node) -> Dim:
        value = ctx.subst.get(a)
        if value is not None:
            return value
        if a.args is not None:  # a floor quotient, remainder or minimum: of its operands' values
            num, den = (self.concrete_dim(ctx, x, node) for x in a.args)
            found = _DIVISIONS[a.kind](num, den)
        elif a.kind == "quot" and a.value is None:  # an exact quotient of unknown values
            num, den = (self.concrete_dim(ctx, x, node) for x in a.quot)
            found = divide(num, den)
        elif a.value is not None:  # a config field's value, a quotient's
            return self.concrete_dim(ctx, a.value, node)
        elif a in self._dim_atoms.values():
            return Dim.atom(a)
        else:
            raise LoweringError(self.where(ctx.item, node) + f"`{a.name}` has no value here")
        if isinstance(found, DivisionError):
            raise LoweringError(self.where(ctx.item, node) + f"`{a.name}` has no value here: {found.reason}")
        return found

    def concrete_dtype(self, ctx: Context, dtype: DType, node=None) -> DType:
        """A dtype as the checker saw it, here: the working dtype for `work`, a generic dtype
        variable's dtype at the call."""
        if dtype == WORK:
            return self.dtype
        if dtype.var:
            found = ctx.dtypes.get(dtype.name)
            if found is None:
                raise LoweringError(self.where(ctx.item, node) + f"the dtype `{dtype.name}` is not known here")
            return found
        return dtype

    def concrete_type(self, ctx: Context, node: A.Node) -> TensorT:
        """The tensor type the checker gave the annotation `node` (a member's, an entry
        parameter's), here."""
        t = ctx.res.types.get(node)
        if not isinstance(t, TensorT) or t.shape.prefix is not None or any(d is None for d in t.shape.dims):
            raise LoweringError(self.where(ctx.item, node) + "this type is not known where it was checked")
        dims = [self.concrete_dim(ctx, d, node) for d in t.shape.dims]
        return tensor_type(self.concrete_dtype(ctx, t.dtype, node), dims)

    def static_value(self, ctx: Context, t: Type, node=None):
        """The compile-time value the checker gave an argument (its converted type), here;
        `_UNKNOWN` when the checker did not know it (a module's float parameter)."""
        if isinstance(t, ConfigT):
            return t.value
        if isinstance(t, NoneT):
            return None
        if isinstance(t, ScalarT) and t.value is not None:
            return self.concrete_dim(ctx, t.value, node) if isinstance(t.value, Dim) else t.value
        return _UNKNOWN
