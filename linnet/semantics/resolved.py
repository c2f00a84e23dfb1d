"""The checker's output in resolved form: what every name means and how every call binds.

Checking an item (under one config binding) decides, for each name use, which definition it
refers to, and for each call, which callee it reaches and which argument (or default) each
parameter takes, converted to the kind the callee expects. `Resolved` records those decisions
so that the compiler lowers the checked program instead of resolving names and matching
arguments a second time (where the two could disagree, as the three evaluators of scalars
once did). With `ItemResult.types` (every expression's type; compile-time scalars carry their
folded values, ints as `Dim`s) it is the resolved, typed form of the item.

Reading it (`Analysis.resolved(item, preset)`):

- `names[node]` for an `A.Name` use (in a body, a type, a member declaration) is a `Ref`;
  for `a.b`, the `A.Name` of `b` (`Attr.name`) is resolved: a config field or a member.
- `calls[node]` for an `A.Call` is a `CallInfo`: op, Linnet function, method, a module's
  `forward`, or a submodule's constructor (`q_proj: Linear(...)`).
- `dims` of a `CallInfo` are the callee's dim variables solved at that call, in the caller's
  terms; a module's bodies are checked once for all its instances, so their values are
  symbolic in the atoms of the module's parameters (`Ref.value` of a `module_param`; an int
  parameter's type, `types[param.name]`, is its atom), and a function's in its int
  parameters and dim variables: lowering substitutes an instance's and a call's values.
- A value the checker did not know is None (a module's float parameter, a local assigned in
  a loop): lowering computes it from the same expressions (a parameter's default is resolved
  in its function, generic in the parameters before it).
- Each config value gets its own check: `Analysis.resolved(item, config=...)` picks it, and
  makes it on demand for values no preset of the file gives (an imported module under the
  importer's config; `errors` then holds that check's errors).

Keys are AST nodes of the checked item (and of the items it instantiates generically), so a
`Resolved` is valid for as long as the item's parse is (it is cached with the item's result).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import ScalarT, Type

# Ref kinds, and what `node` and `value` hold for each:
#   local        a `let` binding                       node: the bound A.Name
#   loop         a `for` variable                      node: the A.Name after `for`
#   param        a function's parameter                node: the parameter's A.Name
#   dim          a dim variable of a function          node: the A.Name that introduced it; value: its Atom
#   load_dim     `max_batch`, `max_positions`          value: its Atom
#   module_param a module's parameter                  node: the parameter's A.Name; value: its Atom (ints)
#   member       a member of a module instance         node: its declaration (FieldDecl, StateDecl, FnDef);
#                                                      value: "param" | "state" | "submodule" | "list" | "fn"
#   config_field a field of a config value (`c.x`)     node: the A.ConfigField; value: the ConfigValue read
#   fn           a top-level function                  node: its A.FnDef
#   module       a module used as a constructor        node: its A.ModuleDef
#   op           a primitive                           value: the OpDef
#   dtype        `f32`, `i64`...                       value: the DType
#   dtype_var    a generic dtype variable (`T`)        value: the DType variable
#   constant     `pi`, `inf`                           value: the float
#   conversion   `int`, `len` (compile-time scalars)   value: the function (types/scalars.py CONVERSIONS)
REF_KINDS = (
    "local", "loop", "param", "dim", "load_dim", "module_param", "member", "config_field",
    "fn", "module", "op", "dtype", "dtype_var", "constant", "conversion",
)  # fmt: skip


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__, and a check makes a Ref for
# every name it reads (1.7 million in the 5 MB document of issue 45: the frozen form's __init__ was ~3 % of its check).
# Nothing changes a Ref after it is made; it hashes by identity either way (eq=False).
@dataclass(slots=True, eq=False)
class Ref:
    """What a name use refers to. `item` is the item holding the definition (None for
    built-ins); see `REF_KINDS` for `node` and `value`."""

    kind: str
    name: str
    node: A.Node | None = None
    item: Item | None = None
    value: Any = None


@dataclass(slots=True)
class Arg:
    """One parameter of a call, bound.

    node: the argument expression as written, None when the parameter took its default.
    default: the default expression used (a Linnet callee's; evaluate it in the callee's
      scope, `CallInfo.item`), None when an argument was given or for an op's default.
    value: the value as the callee receives it: for a Linnet callee the argument's type
      (`TensorT`; for compile-time parameters a `ScalarT` with its folded value, converted to
      the parameter's type: an int given for a `float` is a float); for an op the value its
      rules saw, converted to the parameter's kind (`TensorT`, a `Dim` for ints, an int for
      an index, a float, a bool, a str, a `DType`, lists of those; an op's default as is).
    """

    param: str
    node: A.Expr | None
    value: Any
    default: A.Expr | None = None


@dataclass(slots=True)
class CallInfo:
    """How one call binds.

    kind: "op" (a primitive, `callee` its OpDef), "fn" (a top-level function), "method"
      (`x.name(...)` on a module instance, `receiver` the instance expression), "forward"
      (calling a module instance: `self_attn(x)`), "module" (a submodule's constructor),
      "conversion" (`int(x)`, `len(xs)` on compile-time values).
    callee: the OpDef, the A.FnDef, for "module" the A.ModuleDef, for "conversion" its name.
    item: the callee's item (None for ops).
    args: every parameter in declaration order, defaults filled (an op's `sizes` aside).
    sizes: an op's `sizes` (`rearrange`'s axis sizes), by axis name.
    dims: the callee's dim variables solved at this call (None: not known); dtypes: its
      generic dtype variables.
    folded: the compile-time value of a call folded by the checker (`sqrt(64)`), else None.
    scalar: an op applied to compile-time numbers (folded; `folded` is None when the checker
      did not know a number: a function's float parameter).
    """

    kind: str
    callee: Any
    item: Item | None
    args: dict[str, Arg] = field(default_factory=dict)
    sizes: dict[str, Arg] = field(default_factory=dict)
    receiver: A.Expr | None = None
    dims: dict[str, Any] = field(default_factory=dict)
    dtypes: dict[str, Any] = field(default_factory=dict)
    folded: Any = None
    scalar: bool = False


@dataclass(slots=True)
class Resolved:
    """Names and calls of one checked item (under one config binding), with its types.
    `errors`: the located errors of a check made on demand (`Analysis.resolved`)."""

    names: dict[A.Name, Ref] = field(default_factory=dict)
    calls: dict[A.Call, CallInfo] = field(default_factory=dict)
    types: dict[A.Node, Type] = field(default_factory=dict)
    errors: list = field(default_factory=list)
    # A module's check in parts (`fn_reuse.Segment`), by function: a function whose part is the same object has the
    # same names, calls and types as before (an edit in another function's body re-checked only that one).
    parts: dict[A.FnDef, Any] | None = None

    def ref(self, node: A.Name) -> Ref | None:
        """What the name `node` refers to (None: not resolved, e.g. after an error)."""
        return self.names.get(node)

    def call(self, node: A.Call) -> CallInfo | None:
        """How the call `node` binds (None: not checked, e.g. after an error)."""
        return self.calls.get(node)

    def value(self, node: A.Node):
        """The folded compile-time value of an expression: an int as a `Dim` (maybe symbolic),
        a float, a bool, a str; None when it is not a compile-time scalar or not known."""
        t = self.types.get(node)
        return t.value if isinstance(t, ScalarT) else None

    def merge(self, other: "Resolved") -> None:
        self.names.update(other.names)
        self.calls.update(other.calls)
