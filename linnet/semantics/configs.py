"""Configs as checked data: evaluating `config` defaults, derived fields and `preset`s.

A `ConfigValue` is one concrete config: every field's value (int, float, bool, str, a list
of those for a `list[T]` field, None for `none`, a nested ConfigValue, or `MISSING` when no
default exists and nothing set it).
Fields are evaluated lazily in dependency order, so a derived field
(`head_dim: int = hidden_size / num_attention_heads`) may name fields declared after it, and
a preset may override it (Llama 3.1 sets `head_dim`). Integer division must be exact.

Scenarios are what the checker runs under: "defaults" (every config at its defaults) and one
per preset. `values_by_type` collects, per config type, every distinct value occurring in
them (nested records included), so a function taking `RopeScaling?` is checked under `none`
and under Llama 3.1's llama3 scaling alike.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from ..syntax import ast as A
from ..syntax.items import Item
from ..types.core import NONE, UNKNOWN, ConfigT, ListT, ScalarT, Type
from ..types.dims import Atom, Dim, const, derived_key, new_uid
from ..types.scalars import CONVERSIONS, ScalarError, arithmetic, compare, is_number
from .diagnostics import Finding, Label, LocalAnchor, SymbolAnchor
from .suggest import closest

MISSING = object()
SCALAR_TYPES = ("int", "float", "bool", "str")


@dataclass(eq=False)
class ConfigValue:
    """One concrete value of a config type. `origins[field]` anchors where the value was
    written (a preset's field init, the config's default); `scenarios` are the names of the
    scenarios it occurs in."""

    type_name: str
    item: Item
    values: dict[str, Any]
    origins: dict[str, Any]
    scenarios: list[str] = field(default_factory=list)
    _atoms: dict[str, Atom] = field(default_factory=dict)  # by display (`atom`)
    # the dim of each of those atoms, by display (`field_type`): one Dim a way of writing a field, so that its value
    # (`Dim.val`), atoms and hash are computed once, not at each of the checks' reads (the 5 MB document: 330,000)
    _atom_dims: dict[str, Dim] = field(default_factory=dict)
    _key: tuple | None = None
    _uids: dict[str, int] = field(default_factory=dict)
    _fields: dict[str, A.ConfigField] | None = None
    poisoned: set[str] = field(default_factory=set)  # fields whose value an error left unknown
    shared_atoms: "weakref.WeakValueDictionary | None" = None  # the document's (ConfigEvaluator)
    # `origins_key`, kept once the value is evaluated (`register`): every instance, signature and binding key of a
    # check reads it (the 5 MB document: 76,000 walks of its fields)
    _origins_key: tuple | None = None
    _evaluated: bool = False
    _deriving: set[str] = field(default_factory=set)  # the derived fields whose value `atom` is deriving now

    def __post_init__(self):
        # Atom ids in declaration order: products print as written (`c.heads * c.head_dim`).
        for f in self.config_def.fields:
            if isinstance(f, A.ConfigField):
                self._uids[f.name.id] = new_uid()

    def key(self) -> tuple:
        if self._key is None:
            parts = []
            for name, v in self.values.items():
                if isinstance(v, ConfigValue):
                    v = v.key()
                elif isinstance(v, list):
                    v = tuple((type(x).__name__, x) for x in v)  # 1 and 1.0 are different values
                elif v is MISSING:
                    v = "<missing>"
                parts.append((name, type(v).__name__, v))
            # the declaration order too: it orders the factors of a product (`ConfigValue.atom`)
            self._key = (self.type_name, tuple(parts), tuple(sorted(self.poisoned)), tuple(self._uids))
        return self._key

    def origins_key(self) -> tuple:
        """Where each field's value came from (`origins`), nested values' too: equal values from different places
        label findings differently, so a result checked under one is not another's."""
        if self._origins_key is not None:
            return self._origins_key
        parts = []
        for name, v in self.values.items():
            nested = v.origins_key() if isinstance(v, ConfigValue) else None
            parts.append((name, self.origins.get(name), nested))
        out = tuple(parts)
        if self._evaluated:  # while its fields are evaluated, `origins` still grows
            self._origins_key = out
        return out

    @property
    def config_def(self) -> A.ConfigDef:
        return self.item.ast

    def field_def(self, name: str) -> A.ConfigField | None:
        if self._fields is None:  # built once: a scan per lookup made a config quadratic in its fields
            self._fields = {}
            for f in self.config_def.fields:
                if isinstance(f, A.ConfigField):
                    self._fields.setdefault(f.name.id, f)
        return self._fields.get(name)

    def atom(self, name: str, display: str) -> Atom:
        """The dim atom of int field `name` as this use writes it (`display`: `c.hidden_size`,
        `c.vision_config.hidden_size`), valued when known. One atom per way of writing a field, so that
        each use prints what it wrote, whichever use came first (a module taking the vision config as
        `c` and the model reading it as `c.vision_config` both print their own; a check's output never
        depends on what was checked before it: `linnet check --jobs`). Equal values share them across
        analyses of one document (`shared_atoms`): a field whose value is not known compares by atom,
        and cached results of an earlier analysis must agree (equal values from the same places: the
        origin labels findings). An unknown value's atoms of every display alias one atom
        (`Atom.alias`), so that `c.d` and `cfg.d` of one value are equal. Never shared across documents:
        an atom's id orders the factors it is printed with, and another file's declaration order must
        not decide how this one prints."""
        a = self._atoms.get(display)
        if a is None:
            shared = self.shared_atoms if self.shared_atoms is not None else weakref.WeakValueDictionary()
            # where the values came from too: the atom's origin labels findings (a preset's `d = 8` is not the
            # config's default `d: int = 8`, though an earlier version's value of equal fields made the atom there);
            # every field's origin, so that a value's atoms are all shared or all new (their uids order products)
            value_key = (self.key(), self.origins_key())
            # the ids of the first value made of those equal ones (`register`), not of the first one read: the
            # order of the atoms' ids is the order the values were evaluated in, not the order of the checks
            first = shared.get(value_key, self)
            uid = first._uids.get(name)
            key = (value_key, display)
            a = shared.get(key)
            if a is None:
                v = self.values.get(name, MISSING)
                known = isinstance(v, int) and not isinstance(v, bool)
                a = const(display, Dim.of(v) if known else None, origin=self.origins.get(name), uid=uid)
                a._key = derived_key(a._key, display)  # a product of `c.d` and `cfg.d` prints in one order
                if not known:
                    base_key = (value_key, name, None)  # not a display: one written without a prefix is `name`
                    base = shared.get(base_key)
                    if base is None:
                        base = const(f"{self.type_name}.{name}", None, origin=self.origins.get(name), uid=uid)
                        shared[base_key] = base
                    a.alias = base
                    a.value = self._derived(name, display)
                shared[key] = a
            self._atoms[display] = a
        return a

    def _derived(self, name: str, display: str) -> Dim | None:
        """The value of int field `name`, not known here, as its default derives it from the other fields (`head_dim:
        int = hidden / heads` written `c.head_dim` is `c.hidden / c.heads`, its inputs' atoms as this use writes
        them), so that it follows from their unknown values rather than being a dim of its own (docs/language.md:
        a field without a default is unknown under the config defaults); None when it has no default, an error left
        it unknown, or its default is more than integer arithmetic of fields and literals."""
        fdef = self.field_def(name)
        if fdef is None or fdef.default is None or name in self.poisoned or name in self._deriving:
            return None
        prefix = display[: len(display) - len(name)] if display.endswith(name) else ""
        self._deriving.add(name)  # (a cycle of derived fields is reported on the config; here it stays unknown)
        try:
            return self._symbolic(fdef.default, prefix)
        finally:
            self._deriving.discard(name)

    def _symbolic(self, e, prefix: str) -> Dim | None:
        """Default expression `e` as a dim over the fields' atoms (written `prefix` + name); None for anything but
        integer literals, int fields, `-` and arithmetic (`types/scalars.py`), or arithmetic without a dim value."""
        if isinstance(e, A.IntLit):
            return Dim.of(e.value)
        if isinstance(e, A.Name):
            fdef = self.field_def(e.id)
            v = self.values.get(e.id, MISSING)
            if fdef is None or _field_kind(fdef.type) != "int" or e.id in self.poisoned or isinstance(v, bool):
                return None
            return Dim.atom(self.atom(e.id, prefix + e.id)) if v is MISSING or isinstance(v, int) else None
        if isinstance(e, A.Neg):
            operand = self._symbolic(e.operand, prefix)
            return -operand if operand is not None else None
        if isinstance(e, A.BinOp):
            left, right = self._symbolic(e.left, prefix), self._symbolic(e.right, prefix)
            if left is None or right is None:
                return None
            try:
                out = arithmetic(e.op, left, right)
            except ScalarError:
                return None
            return out if isinstance(out, Dim) else None
        return None

    def register(self) -> None:
        """Record this value, once evaluated, as the first of the values equal to it (`atom`: their atoms' ids
        are this one's) unless one was evaluated before it."""
        self._evaluated = True
        if self.shared_atoms is not None:
            value_key = (self.key(), self.origins_key())
            if self.shared_atoms.get(value_key) is None:
                self.shared_atoms[value_key] = self

    def field_type(self, name: str, display: str) -> Type:
        """The Linnet type of reading field `name` (as `display`, e.g. `c.hidden_size`)."""
        if name in self.poisoned:
            return UNKNOWN
        fdef = self.field_def(name)
        v = self.values.get(name, MISSING)
        kind = _field_kind(fdef.type) if fdef is not None else None
        if isinstance(v, ConfigValue):
            return ConfigT(v)
        if v is None:
            return NONE
        if v is MISSING and fdef is not None and kind is None and isinstance(fdef.type, A.NamedType):
            # a config-typed field without a default, under the config defaults: its value is not known there (every
            # preset must set it: L403), so what reads it is checked under the presets; not an int
            return UNKNOWN
        if isinstance(fdef.type, A.ListType) if fdef is not None else False:
            return UNKNOWN if v is MISSING else ListT(tuple(_scalar_type(x) for x in v))
        if kind == "int":
            d = self._atom_dims.get(display)
            if d is None:
                d = self._atom_dims[display] = Dim.atom(self.atom(name, display))
            return ScalarT("int", d)
        if kind in ("float", "bool", "str"):
            literal = isinstance(fdef.type, A.LiteralType) and kind == "str"
            lits = tuple(s.value for s in fdef.type.values) if literal else None
            return ScalarT(kind, None if v is MISSING else v, lits)
        return ScalarT(kind or "int", None)

    def describe(self) -> str:
        return self.type_name


def _scalar_type(v) -> ScalarT:
    """The type of one element of a list field: its value known (an int as a constant dim)."""
    if isinstance(v, bool):
        return ScalarT("bool", v)
    if isinstance(v, int):
        return ScalarT("int", Dim.of(v))
    return ScalarT("float" if isinstance(v, float) else "str", v)


def _field_kind(t: A.Type) -> str | None:
    if isinstance(t, A.LiteralType):
        return t.kind
    if isinstance(t, A.NamedType) and t.name.id in SCALAR_TYPES:
        return t.name.id
    return None


class ConfigEvaluator:
    """Evaluates configs and presets. `lookup(name, site)` finds an item by the name item
    `site` uses for it (imports.Globals); findings are appended to `findings[item]`. `atoms`
    holds the dim atoms of int fields, shared by the analyses of one document
    (`ConfigValue.atom`)."""

    def __init__(self, lookup, atoms: "weakref.WeakValueDictionary | None" = None):
        self.lookup = lookup
        self.atoms = atoms if atoms is not None else weakref.WeakValueDictionary()
        self.findings: dict[Item, list[Finding]] = {}
        self._defaults: dict[Item, ConfigValue] = {}
        self._type_checked: dict[Item, set[str]] = {}

    def _report(self, item: Item, finding: Finding) -> None:
        self.findings.setdefault(item, []).append(finding)

    def _count(self) -> int:
        return sum(len(f) for f in self.findings.values())

    # ----- public
    def config_item(self, name: str, site: Item | None = None) -> Item | None:
        """The config that item `site` (default: the analysed file) calls `name`."""
        item = self.lookup(name, site)
        if item is not None and item.kind == "config" and item.ast is not None:
            return item
        return None

    def defaults(self, config: Item) -> ConfigValue | None:
        """Config item `config` with every field at its default."""
        if config.kind != "config" or config.ast is None:
            return None
        if config not in self._defaults:
            self._defaults[config] = self._evaluate(config, None, config, (config.name,), silent_missing=True)
        return self._defaults[config]

    def preset(self, item: Item) -> ConfigValue | None:
        """Evaluate a preset item; None when its config type is unknown (reported)."""
        record = item.ast.value
        cfg = self.config_item(record.type_name.id, item)
        if cfg is None:
            known = self.lookup(record.type_name.id, item)
            if (known is not None and known.ast is None) or self._failed_import(record.type_name.id, item):
                return None  # the config did not parse, or its import failed: that error says it all
            names = [i.name for i in self._all_configs()]
            hint = closest(record.type_name.id, names)
            self._report(
                item,
                Finding(
                    "L407",
                    f"unknown config `{record.type_name.id}`" + (f"; did you mean `{hint}`?" if hint else ""),
                    LocalAnchor(item, record.type_name.span),
                ),
            )
            return None
        return self._evaluate(cfg, record, item, (item.name,))

    def _all_configs(self):
        return getattr(self.lookup, "configs", lambda: [])()

    def _failed_import(self, name: str, site: Item) -> bool:
        return getattr(self.lookup, "is_failed", lambda n, s: False)(name, site)

    # ----- evaluation
    def _evaluate(
        self, cfg: Item, record: A.RecordLit | None, owner: Item, path: tuple, silent_missing: bool = False
    ) -> ConfigValue:
        """Evaluate config `cfg` with the field inits of `record` (from item `owner`)."""
        cdef: A.ConfigDef = cfg.ast
        fields: dict[str, A.ConfigField] = {}
        for f in cdef.fields:
            if not isinstance(f, A.ConfigField):
                continue
            if f.name.id in fields:
                self._report(
                    cfg,
                    Finding(
                        "L105",
                        f"field `{f.name.id}` is declared twice in `{cdef.name.id}`",
                        LocalAnchor(cfg, f.name.span),
                        labels=[Label(LocalAnchor(cfg, fields[f.name.id].name.span), "first declared here")],
                    ),
                )
                continue
            fields[f.name.id] = f
        skipped = {n for f in cdef.fields if isinstance(f, A.ErrorStmt) for n in f.bound}
        given: dict[str, A.FieldInit] = {}
        if record is not None:
            for init in record.fields:
                if not isinstance(init, A.FieldInit):
                    continue
                name = init.name.id
                if name in skipped:
                    continue  # the field's declaration did not parse: its syntax error says it all
                if name not in fields:
                    hint = closest(name, list(fields))
                    self._report(
                        owner,
                        Finding(
                            "L402",
                            f"config `{cdef.name.id}` has no field `{name}`"
                            + (f"; did you mean `{hint}`?" if hint else ""),
                            LocalAnchor(owner, init.name.span),
                            label="unknown field",
                            fixes=_rename_fix(owner, init.name.span, hint),
                        ),
                    )
                elif name in given:
                    self._report(
                        owner,
                        Finding(
                            "L105",
                            f"field `{name}` is set twice",
                            LocalAnchor(owner, init.name.span),
                            labels=[Label(LocalAnchor(owner, given[name].name.span), "first set here")],
                        ),
                    )
                else:
                    given[name] = init
        value = ConfigValue(cdef.name.id, cfg, {}, {}, shared_atoms=self.atoms)
        value.poisoned |= skipped | self._bad_field_types(cfg)
        computing: set[str] = set()

        def get(name: str):
            if name in value.values:
                return value.values[name]
            findings_before = self._count()
            used: set[str] = set()

            def dependency(dep: str):
                used.add(dep)
                return get(dep)

            fdef = fields[name]
            if name in computing:
                self._report(
                    cfg, Finding("L404", f"field `{name}` depends on itself", LocalAnchor(cfg, fdef.name.span))
                )
                value.values[name] = MISSING
                return MISSING
            computing.add(name)
            if name in given:
                init = given[name]
                v = self._value(init.value, fdef, cfg, owner, path + (name,), lambda n: None, where="preset")
                value.origins[name] = SymbolAnchor(path + (name,), owner.source.path)
            elif fdef.default is not None:
                v = self._value(
                    fdef.default,
                    fdef,
                    cfg,
                    cfg,
                    (cdef.name.id, name),
                    dependency,
                    where="default",
                    preset_owner=owner if record is not None else None,
                    origins=value.origins,
                )
                value.origins[name] = SymbolAnchor((cdef.name.id, name), cfg.source.path)
            else:
                v = MISSING
                if not silent_missing:
                    anchor = (
                        LocalAnchor(owner, record.type_name.span)
                        if record is not None
                        else LocalAnchor(cfg, fdef.name.span)
                    )
                    self._report(
                        owner,
                        Finding(
                            "L403",
                            f"`{cdef.name.id}.{name}` has no default and is not set",
                            anchor,
                            labels=[
                                Label(
                                    SymbolAnchor((cdef.name.id, name), cfg.source.path),
                                    "declared without a default here",
                                )
                            ],
                        ),
                    )
            computing.discard(name)
            value.values[name] = v
            if v is MISSING and (self._count() > findings_before or used & value.poisoned):
                value.poisoned.add(name)  # an error made it, or it derives from one: unknown, not symbolic
            return v

        for name in fields:
            get(name)
        value.register()
        return value

    def _bad_field_types(self, cfg: Item) -> set[str]:
        """Fields whose declared type is unknown (each reported once, on the config)."""
        if cfg in self._type_checked:
            return self._type_checked[cfg]
        bad = set()
        for f in cfg.ast.fields:
            if isinstance(f, A.ConfigField) and isinstance(f.type, A.ListType):
                item = f.type.item
                if isinstance(item, A.LiteralType) or (
                    isinstance(item, A.NamedType) and item.name.id in SCALAR_TYPES and not item.optional
                ):
                    continue
                bad.add(f.name.id)
                self._report(
                    cfg,
                    Finding(
                        "L101",
                        "a list field holds `int`, `float`, `bool`, `str` or a literal union",
                        LocalAnchor(cfg, item.span),
                    ),
                )
                continue
            if not isinstance(f, A.ConfigField) or not isinstance(f.type, A.NamedType):
                continue
            name = f.type.name.id
            if name in SCALAR_TYPES or self.config_item(name, cfg) is not None:
                continue
            bad.add(f.name.id)
            known = self.lookup(name, cfg)
            if (known is not None and known.ast is None) or self._failed_import(name, cfg):
                continue  # a config that did not parse, or whose import failed: that error says it all
            hint = closest(name, list(SCALAR_TYPES) + [i.name for i in self._all_configs()])
            self._report(
                cfg,
                Finding(
                    "L101",
                    f"unknown type `{name}`" + (f"; did you mean `{hint}`?" if hint else ""),
                    LocalAnchor(cfg, f.type.name.span),
                    fixes=_rename_fix(cfg, f.type.name.span, hint),
                ),
            )
        self._type_checked[cfg] = bad
        return bad

    def _value(
        self,
        expr,
        fdef: A.ConfigField,
        config: Item,
        item: Item,
        path: tuple,
        get,
        where: str,
        preset_owner: Item | None = None,
        origins: dict | None = None,
    ):
        """Evaluate one field value (written in `item`) of a field `fdef` of `config` and check
        it against the field's type."""
        ftype = fdef.type
        if isinstance(expr, A.RecordLit):
            expected = ftype.name.id if isinstance(ftype, A.NamedType) else None
            expected_item = self.config_item(expected, config) if expected is not None else None
            written = self.config_item(expr.type_name.id, item)
            same = written is expected_item if written is not None else expr.type_name.id == expected
            if expected is None or not same:
                self._report(
                    item,
                    Finding(
                        "L401",
                        f"`{fdef.name.id}` is a {_type_text(ftype)}, got a `{expr.type_name.id}` record",
                        LocalAnchor(item, expr.type_name.span),
                    ),
                )
                return MISSING
            if expected_item is None:
                return MISSING
            return self._evaluate(expected_item, expr, item, path)
        ev = _ConstEval(self, item, get, fdef, preset_owner, origins or {})
        v = ev.eval(expr)
        if v is MISSING:
            return v
        return self._check_type(v, ftype, fdef, config, item, expr)

    def _check_type(self, v, ftype: A.Type, fdef: A.ConfigField, config: Item, item: Item, expr):
        anchor = LocalAnchor(item, expr.span)
        if isinstance(ftype, A.ListType):
            if not isinstance(v, list):
                self._report(item, Finding("L401", f"`{fdef.name.id}` is a list, got {_show(v)}", anchor))
                return MISSING
            nodes = expr.items if isinstance(expr, A.ListLit) and len(expr.items) == len(v) else [expr] * len(v)
            out = [self._check_type(x, ftype.item, fdef, config, item, node) for x, node in zip(v, nodes)]
            return MISSING if any(x is MISSING for x in out) else out
        if isinstance(ftype, A.LiteralType):
            allowed = [s.value for s in ftype.values]
            if v is None and ftype.optional:
                return None
            if ftype.kind == "bool":  # a one-value type: the only value the source supports
                if v is not allowed[0]:
                    self._report(
                        item,
                        Finding(
                            "L401",
                            f"`{fdef.name.id}` can only be {_show(allowed[0])} (the source supports no other value); "
                            f"got {_show(v)}",
                            anchor,
                        ),
                    )
                    return MISSING
                return v
            if not isinstance(v, str) or v not in allowed:
                hint = closest(v, allowed) if isinstance(v, str) else None
                one = "can only be" if len(allowed) == 1 else "is one of"
                self._report(
                    item,
                    Finding(
                        "L401",
                        f"`{fdef.name.id}` {one} {', '.join(repr(a).replace(chr(39), chr(34)) for a in allowed)}; "
                        f"got {_show(v)}" + (f'; did you mean "{hint}"?' if hint else ""),
                        anchor,
                        fixes=_rename_fix(item, expr.span, f'"{hint}"' if hint else None),
                    ),
                )
                return MISSING
            return v
        if isinstance(ftype, A.NamedType):
            name = ftype.name.id
            if name not in SCALAR_TYPES and self.config_item(name, config) is None:
                return MISSING  # an unknown type: reported once on the config (`_field_types`)
            if v is None:
                if ftype.optional:
                    return None
                self._report(
                    item,
                    Finding(
                        "L401",
                        f"`{fdef.name.id}` is not optional; it cannot be `none`",
                        anchor,
                        notes=[f"declare it as `{name}?` to allow `none`"],
                    ),
                )
                return MISSING
            ok = {
                "int": isinstance(v, int) and not isinstance(v, bool),
                "float": isinstance(v, (int, float)) and not isinstance(v, bool),
                "bool": isinstance(v, bool),
                "str": isinstance(v, str),
            }.get(name)
            if ok is None:  # a config type given a scalar
                self._report(item, Finding("L401", f"`{fdef.name.id}` is a `{name}` record, got {_show(v)}", anchor))
                return MISSING
            if not ok:
                truncate = name == "int" and is_number(v)
                notes = ["convert explicitly: `int(...)` truncates toward zero"] if truncate else []
                self._report(
                    item, Finding("L401", f"`{fdef.name.id}` is {_a(name)}, got {_show(v)}", anchor, notes=notes)
                )
                return MISSING
            return float(v) if name == "float" else v
        return v

    # ----- scenarios
    def scenarios(self, presets: list[Item], config_names: list[str]) -> list["Scenario"]:
        """ "defaults" then one scenario per preset, in source order. A preset whose config has
        errors is reported and not checked under: what it would produce is noise.
        `config_names` are the analysed file's names for the configs it sees; a scenario's
        `configs` are keyed by them."""

        base = {}
        for n in config_names:
            config = self.config_item(n)
            value = self.defaults(config) if config is not None else None
            if value is not None:
                base[n] = value
        out = [Scenario("defaults", dict(base), None)]
        for p in presets:
            before = len(self.findings.get(p, []))
            value = self.preset(p)
            if value is None or len(self.findings.get(p, [])) > before:
                continue
            configs = dict(base)  # a copy (C speed): the defaults were evaluated once, not once per preset
            configs[p.ast.value.type_name.id] = value
            out.append(Scenario(p.name, configs, p, (p.ast.value.type_name.id,)))
        return out


@dataclass
class Scenario:
    name: str
    configs: dict[str, ConfigValue]  # by the analysed file's name of each config
    preset: Item | None
    # the names in `configs` whose values are not the first scenario's (which has every other name, the same
    # values), in `configs`' order: a preset's config; None where not known (`values_by_type` then walks every value)
    changed: tuple[str, ...] | None = None


def values_by_type(scenarios: list[Scenario], lookup) -> dict[Item, list[tuple[Any, list[str], set[str]]]]:
    """Per config (item), the distinct values (None for `none`) occurring in any scenario, each
    with the scenario names it occurs in and the names of those whose own configs reach it: the first
    scenario's (every config at its defaults), and a preset's whose value holds it. A preset scenario holds every
    other config at its defaults too, so a value it holds only that way is not the preset's: a module taking
    `VisionConfig` checked under `VisionConfig`'s defaults is not what a preset of a config nesting another
    `VisionConfig` gives it. `lookup(name, site)` finds the config a field's type names (imports.Globals).

    Every scenario holds every config, at its defaults but the one its preset sets (`Scenario.changed`): the
    first scenario's values are walked once, each other scenario's preset value once, and a value of the first
    scenario is recorded against every scenario but those whose preset replaced all that reach it (a 5 MB file of
    570 configs and 2,280 presets: each value's reach was walked once but visited per scenario, 1.3 million
    visits, ~1.5 s before the checks could start)."""
    found: dict[Item, dict[Any, tuple[Any, list[str], set[str]]]] = {}
    reaches: dict[int, tuple[ConfigValue, list[tuple[Item, Any, Any]]]] = {}
    own: dict[tuple[Item, Any], set[str]] = {}  # (config, key) -> the scenarios whose own configs reach it

    def reach(cv: ConfigValue) -> list[tuple[Item, Any, Any]]:
        """(config, key, value) for `cv` and each config value its fields hold, in visiting order."""
        known = reaches.get(id(cv))
        if known is not None:
            return known[1]
        out = [(cv.item, cv.key(), cv)]
        for name, v in cv.values.items():
            fdef = cv.field_def(name)
            if fdef is None or not isinstance(fdef.type, A.NamedType) or fdef.type.name.id in SCALAR_TYPES:
                continue
            if isinstance(v, ConfigValue):
                out.extend(reach(v))
            elif v is None:
                config = lookup(fdef.type.name.id, cv.item)
                if config is not None and config.kind == "config":
                    out.append((config, None, None))
        reaches[id(cv)] = (cv, out)  # the value is kept so that its id is not reused while remembered
        return out

    def visit(s: Scenario, values) -> set[tuple[Item, Any]]:
        """Record scenario `s` against every value `values` reach; the (config, key) of each."""
        seen = set()
        for cv in values:
            for config, key, v in reach(cv):
                slot = found.setdefault(config, {})
                entry = slot.get(key)
                if entry is None:
                    entry = slot[key] = (v, [], set())
                if s.name not in entry[2]:
                    entry[2].add(s.name)
                    entry[1].append(s.name)
                seen.add((config, key))
        return seen

    def result() -> dict[Item, list[tuple[Any, list[str], set[str]]]]:
        return {t: [(v, names, own.get((t, k), set())) for k, (v, names, _) in vs.items()] for t, vs in found.items()}

    if not scenarios:
        return {}
    first = scenarios[0]
    base = first.configs
    if any(s.changed is None for s in scenarios[1:]):
        for n, s in enumerate(scenarios):
            configs = list(s.configs.items())
            reached = visit(s, [cv for _, cv in configs])
            if n:  # a preset's own configs: those whose values are not the first scenario's
                reached = {(c, key) for name, cv in configs if base.get(name) is not cv for c, key, _ in reach(cv)}
            for slot in reached:
                own.setdefault(slot, set()).add(s.name)
        return result()
    reached_by: dict[tuple[Item, Any], set[str]] = {}  # a first-scenario value -> the names whose values reach it
    for name, cv in base.items():
        for config, key, _ in reach(cv):
            reached_by.setdefault((config, key), set()).add(name)
    for slot in visit(first, base.values()):
        own.setdefault(slot, set()).add(first.name)
    absent: dict[tuple[Item, Any], set[int]] = {}  # a first-scenario value -> the scenarios without it
    for n, s in enumerate(scenarios[1:], 1):
        changed = set(s.changed)
        present = visit(s, [s.configs[name] for name in s.changed if name in s.configs])
        for slot in present:
            own.setdefault(slot, set()).add(s.name)
        for name in changed:
            if name not in base:
                continue
            for config, key, _ in reach(base[name]):
                if (config, key) not in present and reached_by[(config, key)] <= changed:
                    absent.setdefault((config, key), set()).add(n)
    for (config, key), gone in absent.items():
        entry = found[config][key]
        names = [s.name for n, s in enumerate(scenarios) if n not in gone]
        entry[1][:] = list(dict.fromkeys(names))
    for config, key in reached_by.keys() - absent.keys():
        found[config][key][1][:] = list(dict.fromkeys(s.name for s in scenarios))
    return result()


class _ConstEval:
    """Evaluates constant expressions of config defaults and presets to Python values."""

    def __init__(self, evaluator: ConfigEvaluator, item: Item, get, fdef, preset_owner, origins: dict):
        self.ev = evaluator
        self.item = item
        self.get = get
        self.fdef = fdef
        self.preset_owner = preset_owner
        self.origins = origins

    def fail(self, code: str, message: str, node, **kw):
        self.ev._report(self.item, Finding(code, message, LocalAnchor(self.item, node.span), **kw))
        return MISSING

    def eval(self, e):
        if isinstance(e, A.IntLit):
            return e.value
        if isinstance(e, A.FloatLit):
            return e.value
        if isinstance(e, A.StrLit):
            return e.value
        if isinstance(e, A.BoolLit):
            return e.value
        if isinstance(e, A.NoneLit):
            return None
        if isinstance(e, A.Neg):
            v = self.eval(e.operand)
            return (
                MISSING
                if v is MISSING
                else (
                    -v
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                    else self.fail("L401", "`-` needs a number", e)
                )
            )
        if isinstance(e, A.Not):
            v = self.eval(e.operand)
            return MISSING if v is MISSING else not v
        if isinstance(e, A.Name):
            if self.item.kind != "config":
                return self.fail("L101", f"unknown name `{e.id}`: preset values are constants", e)
            fields = self._fields()
            if e.id not in fields:
                hint = closest(e.id, sorted(fields))
                return self.fail(
                    "L101",
                    f"unknown name `{e.id}`" + (f"; did you mean `{hint}`?" if hint else ""),
                    e,
                    fixes=_rename_fix(self.item, e.span, hint),
                )
            return self.get(e.id)
        if isinstance(e, A.BinOp):
            return self.binop(e)
        if isinstance(e, A.Compare):
            return self.compare(e)
        if isinstance(e, A.ListLit):
            items = [self.eval(i) for i in e.items]
            return MISSING if any(i is MISSING for i in items) else items
        if isinstance(e, A.Index):
            return self.index(e)
        if isinstance(e, A.Call) and isinstance(e.func, A.Name) and e.func.id in CONVERSIONS:
            return self.convert(e)
        return self.fail(
            "L111", "config values are constants: literals, other fields, lists, arithmetic, `int` and `len`", e
        )

    def index(self, e: A.Index):
        """`factors[i]`: an element of a list, by a constant int (negative counts from the end)."""
        base = self.eval(e.value)
        if len(e.items) != 1 or isinstance(e.items[0], (A.Slice, A.EllipsisLit)):
            return self.fail("L107", "a list is indexed by one int", e)
        i = self.eval(e.items[0])
        if base is MISSING or i is MISSING:
            return MISSING
        if not isinstance(base, list):
            return self.fail("L107", f"only lists can be indexed here, got {_show(base)}", e.value)
        if not isinstance(i, int) or isinstance(i, bool):
            return self.fail("L107", f"a list index is an int, got {_show(i)}", e.items[0])
        if not -len(base) <= i < len(base):
            return self.fail("L212", f"index {i} is out of range for a list of {len(base)}", e.items[0])
        return base[i]

    def convert(self, e: A.Call):
        """`int(x)` (truncation toward zero, as Python's) and `len(list)`: `conversions.py`."""
        name = e.func.id
        if len(e.args) != 1 or e.args[0].name is not None:
            return self.fail("L106", f"`{name}` takes one argument", e)
        v = self.eval(e.args[0].value)
        if v is MISSING:
            return MISSING
        try:
            return CONVERSIONS[name](v)
        except ScalarError as err:
            return self.fail("L107", err.message, e.args[0].value)

    def _fields(self):
        if self.item.kind != "config":
            return set()
        return {f.name.id for f in self.item.ast.fields if isinstance(f, A.ConfigField)}

    def compare(self, e: A.Compare):
        a, b = self.eval(e.left), self.eval(e.right)
        if a is MISSING or b is MISSING:
            return MISSING
        if e.op in ("==", "!="):
            if (
                is_number(a) != is_number(b)
                or (isinstance(a, bool) != isinstance(b, bool))
                or (isinstance(a, str) != isinstance(b, str) and a is not None and b is not None)
            ):
                return self.fail("L401", f"`{e.op}` compares {_show(a)} with {_show(b)}: never equal", e)
            if not is_number(a):
                return (a == b) == (e.op == "==")
        elif not (is_number(a) and is_number(b)):
            return self.fail("L401", f"`{e.op}` compares numbers, got {_show(a)} and {_show(b)}", e)
        return compare(e.op, a, b)

    def binop(self, e: A.BinOp):
        """Arithmetic with the one scalar semantics (`types/scalars.py`), so a field's value
        is what the same expression gives in a function body."""
        a, b = self.eval(e.left), self.eval(e.right)
        if a is MISSING or b is MISSING:
            return MISSING
        if e.op in ("and", "or"):
            return (a and b) if e.op == "and" else (a or b)
        if e.op == "@":
            return self.fail("L111", "`@` is not allowed in a config value", e)
        if not (is_number(a) and is_number(b)):
            return self.fail("L401", f"`{e.op}` needs numbers, got {_show(a)} and {_show(b)}", e)
        try:
            return arithmetic(e.op, a, b)
        except ScalarError as err:
            if err.kind == "inexact":
                return self._not_divisible(e, a, b)
            if err.kind == "zero":
                return self.fail("L404", err.message, e)
            return self.fail("L408", err.message, e)

    def _not_divisible(self, e: A.BinOp, a: int, b: int):
        left = _text(e.left, a)
        right = _text(e.right, b)
        if self.preset_owner is not None:
            # A preset's values break a derived field: report it on the preset.
            owner = self.preset_owner
            labels = []
            for side, value in ((e.right, b), (e.left, a)):
                if isinstance(side, A.Name) and side.id in self.origins:
                    labels.append(Label(self.origins[side.id], f"`{side.id}` = {value}"))
            self.ev._report(
                owner,
                Finding(
                    "L404",
                    f"{left} is not divisible by {right}, as `{self.fdef.name.id}` requires",
                    LocalAnchor(owner, owner.name_span),
                    labels=labels + [Label(LocalAnchor(self.item, e.span), f"`{self.fdef.name.id}` is derived here")],
                ),
            )
            return MISSING
        return self.fail("L404", f"{left} is not divisible by {right}", e)


def _text(e, value) -> str:
    """How a division's operand is named in a message: `hidden_size` (576), or just 7."""
    if isinstance(e, A.Name):
        return f"`{e.id}` ({value})"
    return str(value)


def _show(v) -> str:
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, str):
        return f'"{v}"'
    if v is None:
        return "`none`"
    if isinstance(v, float):
        return f"the float {v!r}"
    if isinstance(v, int):
        return f"the int {v}"
    if isinstance(v, list):
        return f"a list of {len(v)}"
    return "a record"


def _a(kind: str) -> str:
    return {"int": "an int", "float": "a float", "bool": "a bool", "str": "a str"}.get(kind, kind)


def _type_text(t: A.Type) -> str:
    if isinstance(t, A.NamedType):
        return f"`{t.name.id}{'?' if t.optional else ''}`"
    return "value"


def _rename_fix(item: Item, span: A.Span, hint: str | None):
    from .diagnostics import Fix

    if not hint:
        return []
    return [Fix(f"replace with `{hint}`", [(LocalAnchor(item, span), hint)])]
