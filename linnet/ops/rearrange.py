"""einops-style `rearrange` patterns, checked statically.

`rearrange(x, "b s (h d) -> b h s d", h=9)` splits the last dim of `x` into `h` and `d`
(`d` inferred by exact division) and reorders. Errors carry `inner` offsets into the
pattern so the checker can point inside the string literal.
Semantics follow einops (`einops/einops.py`, `rearrange`): every axis on one side appears
on the other, `1` is a unit axis, `...` a run of dims, parentheses group axes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..types.core import Shape, format_shape
from ..types.dims import Dim, format_dim, format_division, product, shown_value
from .registry import OpError, exact

_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_]\w*)|(?P<one>1)|(?P<ell>\.\.\.)|(?P<open>\()|(?P<close>\))|(?P<bad>\S))")


@dataclass(slots=True)
class Axis:
    name: str | None  # None for the unit axis `1`
    start: int
    end: int


@dataclass(slots=True)
class Group:
    """One dim of one side: a single axis, or a parenthesised group of axes."""

    axes: list[Axis]
    start: int
    end: int
    parenthesised: bool = False


@dataclass(slots=True)
class Pattern:
    lhs: list[Group | str]  # "..." stands for the ellipsis
    rhs: list[Group | str]
    lhs_span: tuple[int, int]
    rhs_span: tuple[int, int]


@lru_cache(maxsize=1024)
def parse_pattern(pattern: str) -> Pattern:
    """Parse `"lhs -> rhs"`; raises OpError(L207) with `inner` set. Memoized (a pattern is parsed once, not at
    every check of its call under every config): the Pattern returned is shared, read only."""
    arrow = pattern.find("->")
    if arrow == -1 or pattern.find("->", arrow + 1) != -1:
        raise OpError("L207", "a rearrange pattern has one `->`", "pattern", inner=(0, len(pattern)))
    lhs = _parse_side(pattern, 0, arrow)
    rhs = _parse_side(pattern, arrow + 2, len(pattern))
    return Pattern(lhs, rhs, (0, arrow), (arrow + 2, len(pattern)))


def _parse_side(text: str, start: int, end: int) -> list[Group | str]:
    out: list[Group | str] = []
    group: Group | None = None
    pos = start
    seen_ellipsis = False
    while pos < end:
        m = _TOKEN.match(text, pos, end)
        if m is None:  # only whitespace left
            break
        pos = m.end()
        tok_start = m.start(m.lastgroup)
        if m.group("name") or m.group("one"):
            axis = Axis(m.group("name"), tok_start, m.end())
            if group is not None:
                group.axes.append(axis)
            else:
                out.append(Group([axis], tok_start, m.end()))
        elif m.group("ell"):
            if group is not None:
                raise OpError("L207", "`...` cannot stand inside a group", "pattern", inner=(tok_start, m.end()))
            if seen_ellipsis:
                raise OpError("L207", "`...` appears twice on one side", "pattern", inner=(tok_start, m.end()))
            seen_ellipsis = True
            out.append("...")
        elif m.group("open"):
            if group is not None:
                raise OpError("L207", "groups cannot nest", "pattern", inner=(tok_start, m.end()))
            group = Group([], tok_start, m.end(), parenthesised=True)
        elif m.group("close"):
            if group is None:
                raise OpError("L207", "unmatched `)`", "pattern", inner=(tok_start, m.end()))
            group.end = m.end()
            out.append(group)
            group = None
        else:
            raise OpError("L207", f"unexpected `{m.group('bad')}` in pattern", "pattern", inner=(tok_start, m.end()))
    if group is not None:
        raise OpError("L207", "unclosed `(`", "pattern", inner=(group.start, group.start + 1))
    return out


def _names(side: list[Group | str]) -> list[Axis]:
    return [a for g in side if isinstance(g, Group) for a in g.axes if a.name is not None]


def rearrange_shape(x: Shape, pattern_text: str, sizes: dict[str, Dim | None]) -> Shape:
    """The output shape of `rearrange(x, pattern_text, **sizes)`."""
    pat = parse_pattern(pattern_text)
    left, right = _names(pat.lhs), _names(pat.rhs)
    for side in (left, right):
        seen: dict[str, Axis] = {}
        for a in side:
            if a.name in seen:
                raise OpError("L207", f"axis `{a.name}` appears twice on one side", "pattern", inner=(a.start, a.end))
            seen[a.name] = a
    left_names = {a.name for a in left}
    right_names = {a.name for a in right}
    for a in right:
        if a.name not in left_names:
            raise OpError(
                "L207",
                f"axis `{a.name}` is on the right of the pattern but not on the left",
                "pattern",
                inner=(a.start, a.end),
            )
    for a in left:
        if a.name not in right_names:
            raise OpError(
                "L207",
                f"axis `{a.name}` is dropped: rearrange keeps every axis (use a reduction)",
                "pattern",
                inner=(a.start, a.end),
            )
    for name in sizes:
        if name not in left_names:
            raise OpError("L207", f"size given for `{name}`, which the pattern doesn't use", name)
    if ("..." in pat.lhs) != ("..." in pat.rhs):
        raise OpError("L207", "`...` must appear on both sides or neither", "pattern", inner=pat.lhs_span)

    # Match the left side against the input's dims.
    pre = pat.lhs[: pat.lhs.index("...")] if "..." in pat.lhs else pat.lhs
    post = pat.lhs[pat.lhs.index("...") + 1 :] if "..." in pat.lhs else []
    dims = x.dims
    if x.prefix is not None:
        if "..." not in pat.lhs or pre:
            raise OpError(
                "L208",
                f"the pattern names leading dims of {format_shape(x)}, whose `...` has unknown rank",
                "pattern",
                inner=pat.lhs_span,
            )
        if len(post) > len(dims):
            raise OpError(
                "L208",
                f"the pattern has {len(post)} dims after `...`, {format_shape(x)} has {len(dims)}",
                "pattern",
                inner=pat.lhs_span,
            )
        ell_dims = dims[: len(dims) - len(post)]
        matched = list(zip(post, dims[len(dims) - len(post) :]))
    elif "..." in pat.lhs:
        if len(pre) + len(post) > len(dims):
            raise OpError(
                "L208",
                f"the pattern has {len(pre) + len(post)} dims besides `...`, {format_shape(x)} has {len(dims)}",
                "pattern",
                inner=pat.lhs_span,
            )
        ell_dims = dims[len(pre) : len(dims) - len(post)]
        matched = list(zip(pre, dims[: len(pre)])) + list(zip(post, dims[len(dims) - len(post) :]))
    else:
        if len(pat.lhs) != len(dims):
            raise OpError(
                "L208",
                f"the pattern's left side has {len(pat.lhs)} dims, {format_shape(x)} has {len(dims)}",
                "pattern",
                inner=pat.lhs_span,
            )
        ell_dims = ()
        matched = list(zip(pat.lhs, dims))

    known: dict[str, Dim | None] = dict(sizes)
    for name, size in sizes.items():
        n = size.as_int() if size is not None else None
        if n is not None and n <= 0:  # a size not known yet (`heads`, an int parameter) is no error
            shown = format_dim(size) if format_dim(size) == str(n) else f"{format_dim(size)} = {n}"
            raise OpError("L213", f"axis `{name}` has size {shown}: sizes are positive", name)
    for group, dim in matched:
        unknown = [a for a in group.axes if a.name is not None and a.name not in known]
        if len(unknown) > 1:
            names = " and ".join(f"`{a.name}`" for a in unknown)
            raise OpError(
                "L207",
                f"cannot infer both {names} in this group: give one size as a keyword",
                "pattern",
                inner=(group.start, group.end),
            )
        given = product(Dim.of(1) if a.name is None else known[a.name] for a in group.axes if a not in unknown)
        if dim is None or given is None:
            if unknown:
                known[unknown[0].name] = None
            continue
        text = _group_text(pattern_text, group)
        if unknown:
            what = f"{text} = {format_dim(shown_value(dim))} with {_given_text(group, unknown, known)}"
            try:
                known[unknown[0].name] = exact(dim, given, what, "pattern")
            except OpError as err:
                raise OpError(
                    "L205",
                    f"{what}: {format_dim(shown_value(dim))} is not divisible by {format_dim(shown_value(given))}",
                    "pattern",
                    inner=(group.start, group.end),
                ) from err
        elif not given.same(dim):
            raise OpError(
                "L205",
                f"{text} is {format_dim(shown_value(given))} but the input dim is {format_dim(shown_value(dim))}",
                "pattern",
                inner=(group.start, group.end),
            )

    out: list[Dim | None] = []
    prefix = None
    for g in pat.rhs:
        if g == "...":
            out.extend(ell_dims)
            prefix = x.prefix
        else:
            out.append(product(Dim.of(1) if a.name is None else known[a.name] for a in g.axes))
    return Shape(tuple(out), prefix)


def _group_text(pattern: str, group: Group) -> str:
    return " ".join(pattern[group.start : group.end].split())


def _given_text(group: Group, unknown: list[Axis], known: dict) -> str:
    parts = [
        f"{a.name} = {format_dim(shown_value(known[a.name]))}"
        for a in group.axes
        if a.name is not None and a not in unknown and known.get(a.name) is not None
    ]
    return ", ".join(parts) if parts else "no sizes given"


def rearrange_plan(dims: list[Dim], pattern: str, sizes: dict[str, Dim]) -> tuple[list[Dim], list[int], list[Dim]]:
    """How `rearrange` runs: reshape `x` (dims `dims`) into one dim per axis (`expanded`),
    permute them (`perm`), reshape into the right side's groups (`out`). Dims may be
    symbolic; an axis inferred from a group is found by exact division."""
    from ..types.dims import DivisionError, divide

    pat = parse_pattern(pattern)
    pre = pat.lhs[: pat.lhs.index("...")] if "..." in pat.lhs else pat.lhs
    post = pat.lhs[pat.lhs.index("...") + 1 :] if "..." in pat.lhs else []
    n_ell = len(dims) - len(pre) - len(post)
    shape_by_axis: dict[str, Dim] = dict(sizes)
    axes_order: list[str] = []
    expanded: list[Dim] = []
    pos = 0
    for g in pat.lhs:
        if g == "...":
            for i in range(n_ell):
                shape_by_axis[f"...{i}"] = dims[pos]
                axes_order.append(f"...{i}")
                expanded.append(dims[pos])
                pos += 1
            continue
        dim = dims[pos]
        pos += 1
        known = Dim.of(1)
        unknown = None
        for a in g.axes:
            if a.name is None:
                continue
            if a.name in shape_by_axis:
                known = known * shape_by_axis[a.name]
            else:
                unknown = a.name
        if unknown is not None:
            q = divide(dim, known)
            if isinstance(q, DivisionError):
                raise OpError("L206", f"rearrange: {format_division(dim, known)} is not exact", "pattern")
            shape_by_axis[unknown] = q
        for a in g.axes:
            if a.name is not None:
                axes_order.append(a.name)
                expanded.append(shape_by_axis[a.name])
    rhs_order: list[str] = []
    out: list[Dim] = []
    for g in pat.rhs:
        if g == "...":
            rhs_order += [f"...{i}" for i in range(n_ell)]
            out += [shape_by_axis[f"...{i}"] for i in range(n_ell)]
        else:
            rhs_order += [a.name for a in g.axes if a.name is not None]
            out.append(product(shape_by_axis[a.name] for a in g.axes if a.name is not None))
    return expanded, [axes_order.index(n) for n in rhs_order], out


def rearrange_reference(x, pattern: str, **sizes):
    """numpy reference: reshape into axes, transpose, reshape into the right side's groups."""
    import numpy as np

    x = np.asarray(x)
    expanded, perm, out = rearrange_plan(
        [Dim.of(d) for d in x.shape], pattern, {k: Dim.of(int(v)) for k, v in sizes.items()}
    )
    y = x.reshape([d.as_int() for d in expanded]).transpose(perm)
    return y.reshape([d.as_int() for d in out])
