"""The `slice` op's shape rule and how its bounds are read: Python's slices, counted from the end where a bound is
negative and clamped to the dim (numpy, torch, JAX and ONNX clamp them), with sizes that may be symbolic
(docs/language.md, "Slices clamp"). The lowering emits the bounds as the checker reads them
(`resolved_slice_bound`), so that what runs is what the checker says for every size."""

from __future__ import annotations

from ..types.core import Shape
from ..types.dims import Atom, Dim, format_dim, minimum, negative, nonnegative, shown_value
from .registry import OpError, dim_index


def _symbolic_bound(bound: Dim, size: Dim, which: str, written: str, why: str = "") -> Dim:
    """A slice bound (the slice's `which`, "start" or "stop") over a dim, as Python's slices read it, where the bound
    or the size is symbolic: one a known number below the size's negative (`-S`, `1 - S`) counts from the end
    (`x[:, -S:]` is all of `S`, not `2 * S`), and one a known number from the end beyond either end (`-S - 1`,
    `S + 1`) is out of range (L212, quoting the slice as `written`, `why` after the message). One negative for
    every size (`-A`: a dim variable is at least 1) counts from the end too, `S - min(A, S)` (`_from_the_end`). One
    whose sign the checker cannot tell (`N - K`, negative where N is less than K) is L212: Python would count it
    from the end where it is negative, and from the start elsewhere, which no one type says; unless the sign is
    left to values the check does not know (`_left_to_values`). Others are taken as written."""
    if bound.as_int() is not None:
        return bound
    from_end = (size + bound).as_int()
    past = (bound - size).as_int()
    if (from_end is not None and from_end < 0) or (past is not None and past > 0):
        raise OpError("L212", f"slice {written} is out of range for a dim of size {format_dim(size)}{why}")
    bound = _from_the_start(bound, size)
    if bound.as_int() is not None or (size - bound).as_int() is not None or nonnegative(bound):
        return bound
    counted = _from_the_end(bound, size)
    if counted is not None:
        return counted
    if _left_to_values(bound):
        return bound
    raise OpError("L212", may_be_negative(bound, which, written, why), notes=[_sign_note(bound)])


def _from_the_end(bound: Dim, size: Dim) -> Dim | None:
    """A symbolic bound negative for every size (`-A`, `-A - 1`: a dim variable is at least 1) as Python's slices
    count it, from the end and clamped at the start: `size - min(-bound, size)` (`x[:, -A:]` of [B, S] is
    [B, min(A, S)], `x[:, :-A]` is [B, S - min(A, S)]); None for any other bound."""
    if bound.as_int() is not None or not negative(bound):
        return None
    return size - minimum(-bound, size)


def _left_to_values(bound: Dim) -> bool:
    """Whether a bound's sign is left to values its check does not know: an int parameter (`S - k` in a module
    `M(k: int)`, checked once for every `k`) or a config field without a value. Each instance's check (the model's
    check follows its calls into them: semantics/instances.py) and lowering know them, and read the bound again:
    `S - 5`, clamped, or L212 where its sign is still not known."""
    return any(a.kind == "const" for a in bound.val.atoms())


def may_be_negative(bound: Dim, which: str, written: str, why: str = "") -> str:
    """The message of a slice bound (the slice's `which`, "start" or "stop") whose sign the checker cannot tell:
    `slice :N - K has a stop that may be negative: it is negative where N is less than K, and Python would count it
    from the end`."""
    ahead, behind = _signed_parts(bound)
    n = ahead.as_int()
    if any(a.kind != "var" for a in ahead.atoms() | behind.atoms()):  # `(N - K) // 2`: its canonical form is no help
        where = ""
    elif n is not None:
        where = f": it is negative where {_quoted(behind)} is more than {n}"
    else:
        where = f": it is negative where {_quoted(ahead)} is less than {_quoted(behind)}"
    return f"slice {written} has a {which} that may be negative{why}{where}, and Python would count it from the end"


def _signed_parts(bound: Dim) -> tuple[Dim, Dim]:
    """A bound as it is shown, `ahead - behind`: its terms of positive coefficients, and the others negated
    (`N` and `K` of `N - K`)."""
    shown = shown_value(bound)
    ahead = Dim({m: c for m, c in shown.terms if c > 0})
    return ahead, ahead - shown


def _quoted(d: Dim) -> str:
    """A dim in a sentence: as it prints where it is one term (`N`, `2 * K`), in backquotes where it is a sum."""
    text = format_dim(d)
    return text if len(d.terms) <= 1 else f"`{text}`"


def _sign_note(bound: Dim) -> str:
    """How a function says that a bound is at least 0: a parameter type whose dim has what the bound takes away
    (`x: [B, K + E]` where `N - K` is written: the bound is then `E`), or concrete values."""
    ahead, behind = _signed_parts(bound)
    one = _one_atom(ahead)
    if one is not None and one.kind == "var":  # one dim variable, `N`
        taken = format_dim(behind)
        return (
            f"consider declaring {format_dim(ahead)} as `{taken} + E` where a parameter's type names it (`x: [B, "
            f"{taken} + E]`: {format_dim(ahead - behind)} is then E), or concrete values: a dim variable alone may "
            "be any size (an entry's dims are whole names, L110)"
        )
    return (
        "consider parameter types whose dims make the bound at least 0 (`x: [B, K + E]` has at least K rows), or "
        "concrete values: a dim variable alone may be any size"
    )


def _slice_text(start: Dim | None, stop: Dim | None) -> str:
    """A slice as written, `-5:`, `:7`, `1:-2` (a start of 0 and a stop of the whole dim left out, as they are)."""
    a = "" if start is None or start.as_int() == 0 else format_dim(start)
    return f"{a}:{format_dim(stop) if stop is not None else ''}"


def _why(*parts: str) -> str:
    """The explanation after a slice's message: its non-empty `parts`, in parentheses; "" when there is none."""
    given = [p for p in parts if p]
    return f" ({'; '.join(given)})" if given else ""


def resolved_slice_bound(bound, size):
    """A slice bound as the checker reads it (`_symbolic_bound`): one a known number below a symbolic size's negative
    (`-S`, `1 - S` of a dim of size `S`) is that number from the start (0, 1); one a known number `k` below a size
    that holds a dim variable (`S - 4`) is `S - min(k, S)`; one negative for every size (`-A`) is `S - min(A, S)`;
    any other as written. The lowering emits this, not the bound as written: a backend that compares `1 - S` with
    0 cannot (jax.export's symbolic dims: InconclusiveDimensionOperation), and one that can would read `1 - S` as 0
    where `S` is 1, not as the checker's 1; and `S - 4` where `S` is 3 is -1, which Python's slices count from the
    end (2 rows, not the checker's 0)."""
    bound = _from_the_start(bound, size)
    if not isinstance(bound, Dim) or not isinstance(size, Dim) or bound.as_int() is not None:
        return bound
    back = (size - bound).as_int()
    if back is not None and back > 1 and _holds_dim_variable(size):
        return size - minimum(Dim.of(back), size)
    counted = _from_the_end(bound, size)
    return counted if counted is not None else bound


def _holds_dim_variable(size: Dim) -> bool:
    """Whether a dim's size holds a dim variable (`S`), which slices clamp to; one of int parameters only (a
    module's `channels`) is left to each instance's values."""
    return any(a.kind == "var" for a in size.val.atoms())


def _from_the_start(bound, size):
    """A bound a known number below a symbolic size's negative (`1 - S`) as that number (1), else as it is."""
    if not isinstance(bound, Dim) or not isinstance(size, Dim) or bound.as_int() is not None:
        return bound
    from_end = (size + bound).as_int()
    return Dim.of(from_end) if from_end is not None and from_end >= 0 else bound


def _clamped(start: Dim, stop: Dim, size: Dim) -> tuple[Dim, Dim]:
    """A slice's bounds over a dim whose size (`S`) or a bound (`K`) holds a dim variable, clamped to the dim as
    numpy, torch, JAX and ONNX clamp them: a bound it may exceed is `min(bound, S)` (`x[:, :4]` is `[B, min(4, S)]`:
    4 rows only where `S` has them; `x[:, 4:]` starts at `min(4, S)`), and one counted a known number `k` from the
    end is `S - min(k, S)` (`x[:, -4:]` is `[B, min(4, S)]`, `x[:, :-4]` is `[B, S - min(4, S)]`). A bound within
    the dim for every size stays as it is (`:S - 1`, `:R` of `2 * R`, `1:`, `:1`: a dim variable is at least 1, as
    `x[:, 0]` assumes). Over a size of int parameters only (a module's `channels`, symbolic in its generic check),
    each instance's values decide (L212 where a bound is past the end), so the bounds stay as written."""
    return _clamped_bound(start, size), _clamped_bound(stop, size)


def _clamped_bound(bound: Dim, size: Dim) -> Dim:
    """One bound of `_clamped`."""
    back, n = (size - bound).as_int(), bound.as_int()
    if back is not None:
        return size - _within(back, size)
    return bound if n is not None and n <= 1 else minimum(bound, size)


def _within(n: int, size: Dim) -> Dim:
    """`min(n, size)` for a known `n`, with 0 and 1 taken as within every dim: a dim has at least one element, as
    `x[:, 0]` assumes (also one of floor quotients, `(H // 8) * (W // 8)` patches, which may be 0 for all the
    algebra knows)."""
    return Dim.of(n) if n <= 1 else minimum(Dim.of(n), size)


def _slice_length(start: Dim, stop: Dim, size: Dim) -> Dim:
    """The length of `start:stop` where the dim's size or a bound holds a dim variable (`:4` of `S`, `:K` of 4), as
    numpy's slices count it, the bounds clamped to the dim (`_clamped`) and 0 where `stop` comes first. A start `a`
    from the front and a stop `b` from the end (known numbers: `4:`, `:-4`, `2:-2`, `1:`; or `b` symbolic, `:-K`
    read as `S - min(K, S)`) take `S - min(a + b, S)` (`S - min(4, S)`, which is `S - 4` only where `S` has 4 rows;
    `E` for `x[:, 4:]` of `[B, 4 + E]`; `S - min(K + 1, S)` for `1:-K`); other bounds `stop - min(start, stop)` of
    the clamped ones, `stop - start` where `start` is provably the smaller (`min(6, S) - min(2, S)` for `2:6`). A
    bound whose sign is left to values the check does not know (`:S - k` of a module's `k`: `_left_to_values`) is
    taken as written; each instance's check reads it again with its values."""
    a, b = start.as_int(), _back(stop, size)
    if a is not None and b is not None and a >= 0:
        n = b.as_int()
        return size - (_within(a + n, size) if n is not None else minimum(Dim.of(a) + b, size))
    signed = all(x.as_int() is not None or (size - x).as_int() is not None or nonnegative(x) for x in (start, stop))
    start, stop = _clamped(start, stop, size)
    return stop - minimum(start, stop) if signed else stop - start


def _back(stop: Dim, size: Dim) -> Dim | None:
    """How far from the end a stop is: a known number of 0 or more (`size - 4`: 4), or the `K` of a stop counted
    from the end by a symbolic one (`size - min(K, size)`, `_from_the_end`); None for any other stop."""
    back = size - stop
    n = back.as_int()
    if n is not None:
        return back if n >= 0 else None
    one = _one_atom(back)
    return one.args[0] if one is not None and one.kind == "min" and one.args[1].same(size) else None


def _one_atom(d: Dim) -> Atom | None:
    """The atom `d` is, where it is one atom alone (`N`, `min(K, S)`; not `2 * N`, `N * K` or `N + 1`), else None."""
    terms = d.terms
    if len(terms) != 1:
        return None
    ((mono, coeff),) = terms
    return mono[0][0] if coeff == 1 and len(mono) == 1 and mono[0][1] == 1 else None


def slice_shape(a):
    """The shape of `slice` (`x[..., start:stop]` of one dim): known bounds checked against a known size (L212),
    symbolic ones (or a symbolic size) read as `_symbolic_bound` and `_slice_length` read them."""
    x: Shape = a["x"].shape
    d = dim_index(x, a["dim"])
    dims = list(x.dims)
    size = dims[d]
    start, stop = a["start"], a["stop"]
    # What the messages quote: the slice's text where the checker gives it (`:k`), else its bounds' values; the
    # values of bounds written as names or expressions (`k = 2`, given with the text) and the bounds counted from
    # the end only explain it.
    written = a.get("written") or _slice_text(start, stop)
    shown = a.get("written_values") or ""
    if stop is None:
        stop = size
    if start is None or stop is None:
        dims[d] = None
    else:
        s_int, e_int, n_int = start.as_int(), stop.as_int(), size.as_int() if size is not None else None
        if n_int is not None:
            if s_int is not None and s_int < 0:
                start = Dim.of(n_int + s_int)
                s_int = n_int + s_int
            if e_int is not None and e_int < 0:
                stop = Dim.of(n_int + e_int)
                e_int = n_int + e_int
            from_end = start is not a["start"] or (a["stop"] is not None and stop is not a["stop"])
            why = _why(shown, f"from the end: {format_dim(start)}:{format_dim(stop)}" if from_end else "")
            if (s_int is not None and not 0 <= s_int <= n_int) or (e_int is not None and not 0 <= e_int <= n_int):
                raise OpError("L212", f"slice {written} is out of range for a dim of size {n_int}{why}")
            if s_int is not None and e_int is not None and e_int < s_int:
                raise OpError("L212", f"slice {written} has negative length{why}")
        elif (s_int is not None and s_int < 0) or (e_int is not None and e_int < 0):
            if size is None:
                dims[d] = None
                return Shape(tuple(dims), x.prefix)
            start = size + start if s_int is not None and s_int < 0 else start
            stop = size + stop if e_int is not None and e_int < 0 else stop
        why = _why(shown)
        length = stop - start
        li = length.as_int()
        if li is not None and li < 0:
            raise OpError("L212", f"slice {written} has negative length{why}")
        if size is not None and (n_int is None or s_int is None or e_int is None):
            start = _symbolic_bound(start, size, "start", written, why)
            stop = _symbolic_bound(stop, size, "stop", written, why)
            if any(_holds_dim_variable(b) for b in (size, start, stop)):
                length = _slice_length(start, stop, size)
            else:  # int parameters only: each instance's values decide (`_clamped`)
                length = stop - start
        dims[d] = length
    return Shape(tuple(dims), x.prefix)
