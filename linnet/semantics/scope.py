"""Scopes, bindings, module instances and callables: what names mean while checking."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import ConfigT, NoneT, ScalarT, Type, UnknownT, format_type
from ..types.dims import Dim


@dataclass(eq=False, slots=True)
class Binding:
    """What a name is bound to in a scope.

    kind: "local" (let), "param" (function parameter), "dim" (dim variable), "loop" (for
    variable), "member", "module_param", "dtype" (generic dtype variable).
    `anchor` is where it is defined (for go-to-definition and labels); `item` the module
    instance's item for a member. `depth` (a local's): how many `for` bodies and branches of
    an `if` whose condition is not known enclose its `let` (checker.ItemChecker.unsure).
    """

    type: Type
    kind: str
    anchor: Any = None
    node: A.Node | None = None
    uses: int = 0
    item: Any = None
    depth: int = 0


class Scope:
    def __init__(self, parent: "Scope | None" = None, kind: str = "block"):
        self.parent = parent
        self.kind = kind
        self.names: dict[str, Binding] = {}

    def lookup(self, name: str) -> Binding | None:
        s: Scope | None = self
        while s is not None:
            b = s.names.get(name)
            if b is not None:
                return b
            s = s.parent
        return None

    def lookup_in_fn(self, name: str) -> Binding | None:
        """Lookup stopping at the function boundary (for shadowing warnings)."""
        s: Scope | None = self
        while s is not None:
            b = s.names.get(name)
            if b is not None:
                return b
            if s.kind == "fn":
                return None
            s = s.parent
        return None

    def bind(self, name: str, binding: Binding) -> None:
        self.names[name] = binding

    def all_names(self) -> list[str]:
        out, s = [], self
        while s is not None:
            out.extend(s.names)
            s = s.parent
        return out


def type_key(t: Type):
    """A hashable key for a compile-time argument value (instance caching). An int is keyed by its dim as written
    (`c.num_attention_heads * c.head_dim`, the atoms of one config value), not by its value: the cached members and
    signatures hold the argument's atoms, whose names and origins label findings, so two uses of equal size (`o_proj`
    and `q_proj`'s 576, or another config's 576) must not share an entry. A config value is keyed by its values and
    where they came from (`ConfigValue.origins_key`): a preset and the config's defaults may give the same values."""
    if isinstance(t, ScalarT):
        v = t.value
        return (t.kind, v.key() if isinstance(v, Dim) else v)
    if isinstance(t, ConfigT):
        return ("config", t.value.key(), t.value.origins_key())
    if isinstance(t, NoneT):
        return ("none",)
    if isinstance(t, UnknownT):
        return ("unknown",)
    return ("other", id(t))


@dataclass(eq=False)
class Instance:
    """A module bound to its argument values (config values, compile-time ints and bools)."""

    item: Item
    args: dict[str, Type]
    generic: bool = False  # the instance a module is checked as (parameters unknown)
    _key: Any = None
    scope: Any = None  # its module scope, made once (checker.module_scope)
    members: Any = None  # its Members, evaluated once per analysis (checker.members)

    @property
    def module(self) -> A.ModuleDef:
        return self.item.ast

    def key(self):
        if self._key is None:
            self._key = (self.item, tuple((k, type_key(v)) for k, v in self.args.items()))
        return self._key

    def describe(self) -> str:
        parts = []
        for name, t in self.args.items():
            if isinstance(t, ConfigT):
                parts.append(name)
            elif isinstance(t, ScalarT) and t.value is not None:
                shown = format_type(t, concrete=True).split(" = ", 1)[-1]
                parts.append(f"{name}={shown}")
        return f"{self.module.name.id}({', '.join(parts)})"


@dataclass(eq=False)
class MemberInfo:
    """A module member as seen in one instance.

    kind: "param" | "submodule" | "list" | "state" | "fn" | "error" (skipped by recovery).
    present: True, False (its `if` is false in this instance) or None (its `if` is not known:
    uses must be under the same condition, listed in `conditions` as (key, polarity)).
    """

    name: str
    kind: str
    node: A.Node | None
    type: Type
    present: bool | None = True
    conditions: tuple[tuple[str, bool], ...] = ()
    cond_text: str = ""
    checkpoint_name: str | None = None


@dataclass(eq=False)
class FnTarget:
    """A callable function: a top-level fn (instance None) or a method of an instance."""

    item: Item
    fn: A.FnDef
    instance: Instance | None = None

    def describe(self) -> str:
        owner = f"{self.instance.module.name.id}." if self.instance is not None else ""
        return f"fn {owner}{self.fn.name.id}"


@dataclass(eq=False)
class Members:
    """All members of an instance, with the findings their evaluation produced."""

    by_name: dict[str, MemberInfo] = field(default_factory=dict)
    order: list[MemberInfo] = field(default_factory=list)
    findings: list = field(default_factory=list)
    poisoned: set[str] = field(default_factory=set)
