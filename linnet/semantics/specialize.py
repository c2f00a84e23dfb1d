"""Standard-library functions checked again at each call, with the call's sizes.

A module of the standard library is checked once for every size: `Conv2d(in_channels, out_channels,
kernel_size)` keeps `kernel_size` and the input's `H` symbolic, so its `conv2d` cannot know whether the window
fits. Lowering runs the same op rules with the instance's numbers, and a window of 16 over 8 rows fails there,
after `linnet check` said nothing. So a call into the standard library checks the callee's body once more with
this call's values bound (the instance's parameters, the argument types, the solved dim variables): each op's own
rule (`linnet.ops`) reports what these sizes break, and the call reports it, located at the call with the
callee's line as a label.

Only the standard library: its bodies never change, so a caller's findings still depend only on what it can see
of its callees (their interfaces, `syntax.items.interface_key`); a user's module keeps being checked generically.
The bodies are small (one op, or a few), each checked once per callee, instance and argument types
(`CheckContext.specialized`). And only the bodies that concrete sizes can break (`may_fail_with_sizes`): most
(`Linear`, `rms_norm`, `attention`) use only ops whose rules decide everything with symbolic sizes, so their
generic check already said all a specialised one would, and checking them again cost a third of `linnet check`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ops import REGISTRY
from ..syntax import ast as A
from ..types.core import ModuleListT, ModuleT, ScalarT, TensorT, Type, UnitT, UnknownT
from ..types.dims import Dim
from .describe import tail_node
from .diagnostics import Finding
from .scope import Binding, Scope, type_key

if TYPE_CHECKING:
    from .checker import ItemChecker
    from .scope import FnTarget


def arg_key(t: Type, partial: bool = False):
    """A hashable key for an argument's type: a tensor by its dtype and its dims as written; None where one is
    not known (no specialised check then), but with `partial` an unknown dim, which matches any size."""
    if isinstance(t, TensorT):
        if t.shape.prefix is not None or (not partial and any(d is None for d in t.shape.dims)):
            return None
        return ("tensor", t.dtype, tuple(d.key() if d is not None else None for d in t.shape.dims))
    if isinstance(t, UnknownT):
        return None
    return type_key(t)


def first_error_at(
    checker: "ItemChecker", target: "FnTarget", args: dict[str, Type], dims: dict, returned: Type
) -> Finding | None:
    """The first error of `target`'s body (a standard-library function, or a function of the checker's own item:
    `same_item_call`) checked with the parameters bound to `args` (by name), its dim variables to `dims` (name ->
    Dim, solved at the call) and its result compared with `returned` (the return type at the call); None when it
    checks clean or cannot be specialised."""
    fn = target.fn
    if fn.body is None or (target.item.is_std and not may_fail_with_sizes(checker, target.item, fn)):
        return None
    # The caller's own function may be checked with a dim it did not solve: an unknown dim matches any size, so
    # the body's other values still decide (unet's `layer(h1, s1, ..., 2)` after `pop` left `N` unknown).
    partial = not target.item.is_std
    keys = [arg_key(t, partial) for t in args.values()]
    if any(k is None for k in keys) or (not partial and any(d is None for d in dims.values())):
        return None
    inst = target.instance
    key = (
        fn,
        inst.key() if inst is not None else None,
        tuple(zip(args, keys)),
        tuple((n, d.key() if d is not None else None) for n, d in dims.items()),
    )
    if checker.follow is not None:
        return followed(checker, target.item, key, lambda: _check_body(checker, target, args, dims, returned))
    sizes = sizes_key(fn, args, dims) if target.item.is_std and inst is None else None
    clean = checker.ctx.specialized_clean
    if sizes is not None and sizes in clean:
        return None
    fresh = key not in checker.ctx.specialized  # else a recursive call's guard, which is no result
    found = once(checker, key, lambda: _check_body(checker, target, args, dims, returned))
    if found is None and sizes is not None and fresh:
        if len(clean) >= _CLEAN_ENTRIES:
            clean.clear()
        clean[sizes] = True
    return found


# How many clean specialisations `CheckContext.specialized_clean` keeps before it starts again: each entry is a few
# hundred bytes, and a language server's session could otherwise grow it with every size it ever saw.
_CLEAN_ENTRIES = 4096


class _Symbolic(Exception):
    """A dim that `sizes_key` cannot key by value: it holds a quotient, a floor division or an alias."""


def sizes_key(fn: A.FnDef, args: dict[str, Type], dims: dict):
    """A key for a standard-library free function's specialised check by values alone: each dim by its value, the
    atoms left unknown (dim variables, `B`, `S`) renumbered in the order they occur, so that `apply_rope` with
    [B, 9, S, 64] is one key in every caller, binding and analysis; None when an argument has no such key (not a
    tensor of known dims nor a scalar, or a dim holding a quotient, floor division or alias).

    Only a clean result is shared under it (`CheckContext.specialized_clean`): whether a body checks clean depends
    only on these values (every rule compares dims by `Dim.val`), and two keys are equal only when one renaming
    of the unknown atoms maps one call's sizes onto the other's; a finding, which names the caller's atoms and
    origins, is kept under the exact key only (`once`)."""
    numbers: dict = {}

    def dim(d: Dim):
        v = d.val
        n = v.as_int()
        if n is not None:
            return n
        terms = []
        for mono, coeff in v.terms:
            factors = []
            for a, p in mono:
                if a.value is not None or a.quot is not None or a.args is not None or a.alias is not None:
                    raise _Symbolic
                factors.append((a.kind, numbers.setdefault(a, len(numbers)), p))
            terms.append((tuple(factors), coeff))
        return tuple(terms)

    try:
        keys = []
        for name, t in args.items():
            if isinstance(t, TensorT):
                if t.shape.prefix is not None or any(d is None for d in t.shape.dims):
                    return None
                keys.append((name, t.dtype, tuple(dim(d) for d in t.shape.dims)))
            elif isinstance(t, ScalarT) and not isinstance(t.value, Dim):
                keys.append((name, t.kind, t.value))
            elif isinstance(t, ScalarT) and t.value is not None:
                keys.append((name, "int", dim(t.value)))
            else:
                return None
        solved = tuple((n, dim(d)) for n, d in dims.items())  # (every one solved: `first_error_at`)
    except _Symbolic:
        return None
    return (fn, tuple(keys), solved)


def once(checker: "ItemChecker", key, check):
    """`check()` (of a body) once per key and analysis (`CheckContext.specialized`); each use records again in
    `checker.bodies_read` the functions of its own item whose bodies that check read (`fn_reuse`: an edit of one
    of them checks the reader's function again)."""
    cache = checker.ctx.specialized
    if key in cache:
        found, reads = cache[key]
        checker.bodies_read |= reads
        return found
    cache[key] = (None, frozenset())  # a recursive call of the same function with the same values: no second check
    outer, checker.bodies_read = checker.bodies_read, set()
    try:
        found = check()
    finally:
        reads = frozenset(checker.bodies_read)
        checker.bodies_read = outer | reads
    cache[key] = (found, reads)
    return found


def followed(checker: "ItemChecker", item, key, check) -> Finding | None:
    """`check()` (of a body in `item`) once per key for the `follow` check (`CheckContext.followed`, lent from
    one analysis to the next): each entry remembers the items its check read, its callee's and those of the
    checks it followed in turn, and is dropped when one of them is replaced or edited (an edit in one module's
    body checks again only the instances that lead into it)."""
    ctx = checker.ctx
    reading = ctx.following
    if key in ctx.followed:
        found, items = ctx.followed[key]
        if reading:
            reading[-1].update(items)
        return found
    ctx.followed[key] = (None, frozenset())  # a recursive call of the same function with the same values
    reading.append(set() if item.is_std else {item})  # the standard library's items are never replaced
    try:
        found = check()
    finally:
        items = frozenset(reading.pop())
    ctx.followed[key] = (found, items)
    if reading:
        reading[-1].update(items)
    return found


def checked_body(checker: "ItemChecker", target: "FnTarget", args: dict[str, Type], dims: dict):
    """`target`'s body checked with its parameters bound to `args` (by name) and its dim variables to `dims`:
    the checker that checked it (its findings) and the body's type. A body of `checker`'s own item is recorded
    in `checker.bodies_read`, with the bodies its check read in turn."""
    inst = target.instance
    own = target.item is checker.item
    sub = type(checker)(checker.ctx, target.item, checker.binding if own else {})
    sub.instance = inst
    sub.follow = checker.follow
    scope = Scope(sub.module_scope(inst) if inst is not None else sub.global_scope(), "fn")
    for name, t in args.items():
        scope.bind(name, Binding(t, "param"))
    for name, d in dims.items():
        scope.bind(name, Binding(ScalarT("int", d), "dim"))
    sub.current_binder = None
    body = sub.block(target.fn.body, Scope(scope, "block"))
    if own:
        checker.bodies_read |= sub.bodies_read | {target.fn}
    return sub, body


def _check_body(
    checker: "ItemChecker", target: "FnTarget", args: dict[str, Type], dims: dict, returned: Type
) -> Finding | None:
    """The first error of `target`'s body checked with `args`, `dims` and `returned` (`first_error_at`)."""
    fn = target.fn
    sub, body = checked_body(checker, target, args, dims)
    if fn.ret is not None and not isinstance(body, (UnknownT, UnitT)):
        what = f"`{fn.name.id}` returns"
        sub.check_same(body, returned, tail_node(fn.body), fn.ret, what, "L204", "L305")
    return next((f for f in sub.result.findings if f.severity in (None, "error")), None)


# The ops whose rules hold a condition on sizes or compile-time values that they skip while one is symbolic (a
# window larger than its input, a group split `(g c)` that does not divide, slice bounds, a size of 0 or less,
# dropout's p), or that make dims by arithmetic that a value can make negative (`apply_op`'s L213). Every other
# op (elementwise, reductions but top_k, matmul, transpose, concat, take, where, cast) decides its rule from the
# dims as written: what it proves for symbolic sizes holds for every value. So does `arange`: its step must be
# known and positive in the generic check already, and a concrete span below 0 makes 0 entries, not an error.
SIZED_OPS = frozenset(
    {"dropout", "top_k", "reshape", "squeeze", "expand", "rearrange", "split", "repeat_interleave", "slice", "select"}
    | {"full", "zeros", "ones", "tensor", "cache_write"}
    | {n for n, op in REGISTRY.items() if op.category == "spatial"}
)


def may_fail_with_sizes(checker: "ItemChecker", item, fn: A.FnDef) -> bool:
    """Whether `fn`'s body (in `item`, of the standard library) could fail with concrete sizes where its generic
    check passed: it indexes a tensor (slice and select bounds), calls an op of `SIZED_OPS` (but for the calls
    `_sizeless` clears), a standard-library function that could, or anything else but an op (a submodule, a
    method: not followed). Computed once per function and check (`CheckContext.size_dependent`)."""
    cache = checker.ctx.size_dependent
    if fn in cache:
        return cache[fn]
    cache[fn] = True  # a recursive function: as if it could
    sizes = {
        n.id for p in fn.params if isinstance(p.type, A.TensorType) for n in A.walk(p.type) if isinstance(n, A.Name)
    }
    found = False
    for node in A.walk(fn.body):
        if isinstance(node, A.Index):
            found = True
        elif isinstance(node, A.Call):
            found = not isinstance(node.func, A.Name) or _call_may_fail(checker, item, node, sizes)
        if found:
            break
    cache[fn] = found
    return found


def _call_may_fail(checker: "ItemChecker", item, call: A.Call, sizes: set[str]) -> bool:
    """Whether `call` in `item`'s body could fail with concrete sizes (`may_fail_with_sizes`); `sizes` are the
    names its function's tensor parameters use as dims."""
    name = call.func.id
    callee = checker.global_item(name, item)
    if callee is None and name in REGISTRY:
        return name in SIZED_OPS and not _sizeless(name, call.args, sizes)
    if callee is not None and callee.kind == "fn" and callee.is_std and callee.ast is not None:
        return may_fail_with_sizes(checker, callee, callee.ast)
    return True


def _sizeless(op: str, args: list[A.Arg], sizes: set[str]) -> bool:
    """Whether this call of a `SIZED_OPS` op has none of its size conditions: a `rearrange` whose literal pattern
    splits no group and matches no number on its left (`"t -> 1 1 t"`), with no sizes given; a `repeat_interleave`
    by a size (a dim of a tensor parameter, as attention's `G`) or a literal, which cannot make a negative dim."""
    if op == "rearrange" and len(args) == 2 and isinstance(args[1].value, A.StrLit):
        left = args[1].value.value.split("->")[0]
        return "(" not in left and not any(c.isdigit() for c in left)
    if op == "repeat_interleave" and len(args) >= 2:
        repeats = args[1].value
        return isinstance(repeats, A.IntLit) or (isinstance(repeats, A.Name) and repeats.id in sizes)
    return False


def same_item_call(checker: "ItemChecker", target: "FnTarget", compile_time: dict[str, Type]) -> bool:
    """Whether a call of `target` is checked again with its values (`first_error_at`): a function of the
    checker's own item (a module's method, as unet's `layer(x, temb, context, 2)`) given a known int or bool.
    Its body was checked with that parameter symbolic, so `resnets[i]` could not know that `i` is past the list's
    end; lowering then indexes it with the value. Only the caller's own item: its findings still depend on
    nothing but its text and its callees' interfaces."""
    if target.item is not checker.item or target.item.is_std:
        return False
    return any(
        isinstance(t, ScalarT) and t.kind in ("int", "bool") and t.value is not None for t in compile_time.values()
    )


def worth_following(checker: "ItemChecker", target: "FnTarget", compile_time: dict[str, Type], dims: dict) -> bool:
    """Whether the `follow` check (instances.py) checks this call's body again: the call knows something the
    callee's own check did not, an int or bool of its instance (`DownBlock`'s `out_channels`) or of the call, or
    a dim variable of its signature solved to more than a dim variable (`H` = c.sample_size, `C` = 320); or the
    instance holds, at any depth, a user's module built with a known int or bool or a list whose elements differ
    (`_varies`: resnet's model holds the encoder, whose stages differ). A module of config parameters only
    (`LlamaDecoderLayer(c)`, holding such modules and the standard library's layers) called with symbolic sizes
    was checked under the same config values already: following it would cost each edit of its body a check of
    the model."""
    inst = target.instance
    if inst is not None and _varies(checker, inst):
        return True
    scalars = list(inst.args.values()) if inst is not None else []
    if any(isinstance(t, ScalarT) and t.value is not None for t in scalars + list(compile_time.values())):
        return True
    return any(d is not None and not _bare_variable(d) for d in dims.values())


def _bare_variable(d) -> bool:
    """Whether dim `d` is one dim variable (`S`, a caller's symbolic size), nothing the callee's check lacked."""
    terms = d.terms
    if len(terms) != 1:
        return False
    mono, coeff = terms[0]
    return coeff == 1 and len(mono) == 1 and mono[0][1] == 1 and mono[0][0].kind == "var"


def _varies(checker: "ItemChecker", inst) -> bool:
    """Whether instance `inst` holds, at any depth of its members, a submodule of a user's module built with a
    known int or bool, or a list whose elements receive their index; once per instance and check."""
    cache = checker.ctx.varies
    key = inst.key()
    if key in cache:
        return cache[key]
    cache[key] = False  # a module that contains itself (reported where it is declared)
    found = False
    for info in checker.members(inst, report=False).order:
        t = info.type
        if isinstance(t, ModuleListT) and t.element is not None and not t.instance.item.is_std:
            found = True
        elif isinstance(t, (ModuleT, ModuleListT)) and not t.instance.item.is_std:
            found = _known_scalar(t.instance) or _varies(checker, t.instance)
        if found:
            break
    cache[key] = found
    return found


def _known_scalar(inst) -> bool:
    """Whether one of `inst`'s arguments is an int, bool or other scalar with a known value (not a config)."""
    return any(isinstance(t, ScalarT) and t.value is not None for t in inst.args.values())
